"""The train_classifier stage: a quality classifier from reference text (or labelled scores), with held-out
figures, written as one model file that the classify stage (or anyone) loads by path or by name.

Steps:

1. ``examples``  positives (reference text: JSONL, Parquet, .txt files or a stage's output) against negatives
                 (typically a sample of a corpus snapshot), or ``labelled`` documents whose score at or above
                 ``positive_min_score`` makes them positive (FineWeb-Edu style); read in Spark, each class
                 sampled down by a seeded hash (``max_examples_per_class``, balanced), a seeded share held out;
                 an unusable line is skipped and counted by reason, a source with none usable or with more
                 than ``max_unusable_share`` unusable, fewer than
                 ``min_examples_per_class`` or ``min_heldout_per_class`` is an error before any training;
2. ``train``     fasttext: fastText supervised on ``__label__hq`` (positive) / ``__label__cc`` lines, DCLM's
                 label space and preprocessing (``pipeline.classify.preprocess``), lines in a seeded order;
                 embedding: the sentence embeddings the quality stage uses (embedded in the Spark workers),
                 then scikit-learn's logistic regression;
3. ``evaluate``  held-out precision and recall at 0.5, ROC AUC, a calibration table and plot.

Output ``train_classifier/<name>/``: ``model.bin`` (fastText) or ``model.json`` (embedding), ``metrics.json``,
``plots/``; the manifest records the model's SHA-256, its preprocessing and label, and the figures (which
MLflow gets as metrics, with the model file and plots as artifacts).
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.classify.config import ClassifierTrainingConfig
from pipeline.classify.metrics import binary_metrics, plot_calibration, plot_score_histogram
from pipeline.classify.models import EMBEDDING_FILE, FASTTEXT_FILE, EmbeddingClassifier, fasttext_scores
from pipeline.classify.preprocess import preprocessor
from pipeline.config import PipelineConfig
from pipeline.core.config import ConfigError
from pipeline.core.manifest import Manifest, sha256_file
from pipeline.core.spark import map_in_arrow, spark_schema, spark_session
from pipeline.core.storage import DatasetRef, StageFailure, StageOutput
from pipeline.documents.config import TextSource
from pipeline.documents.sources import (
    first_unusable_line,
    local_file,
    read_text_source,
    source_files,
    stage_documents,
    usable,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
STAGE = "train_classifier"
POSITIVE_LABEL = "__label__hq"  # DCLM's label space: hq against cc
NEGATIVE_LABEL = "__label__cc"
HELDOUT_BUCKETS = 10_000


def _union(frames: list[DataFrame]) -> DataFrame:
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result


def _summary(skipped: Counter[str]) -> str:
    return (
        f"{skipped.total()} unusable ("
        + ", ".join(f"{n} {reason}" for reason, n in skipped.most_common())
        + ")"
    )


def _tally(judged: DataFrame, source: TextSource) -> dict[str, dict[str, Any]]:
    """Per file (a stage's output counts as one): the documents kept and those skipped, by reason."""
    files: dict[str, dict[str, Any]] = {}
    for row in judged.groupBy("file", "reason").count().collect():
        name = local_file(row["file"]) if source.path is not None else source.describe()
        tally = files.setdefault(name, {"kept": 0, "skipped": {}})
        if row["reason"] is None:
            tally["kept"] += row["count"]
        else:
            tally["skipped"][row["reason"]] = tally["skipped"].get(row["reason"], 0) + row["count"]
    return dict(sorted(files.items()))


def _totals(tallies: Iterable[dict[str, Any]]) -> tuple[int, Counter[str]]:
    """The documents kept, and those skipped by reason, of ``_tally``'s files."""
    kept, skipped = 0, Counter[str]()
    for tally in tallies:
        kept += tally["kept"]
        skipped.update(tally["skipped"])
    return kept, skipped


def _first_unusable(source: TextSource, files: dict[str, dict[str, Any]], score: bool) -> str:
    """Where the first unusable document is: ``file:line: reason`` in a JSONL file, else the file and a reason."""
    file, tally = next((file, tally) for file, tally in files.items() if tally["skipped"])
    jsonl = source.path is not None and (
        source.format == "jsonl" or (source.format == "auto" and source_files(source.path)[0] == "jsonl")
    )
    found = (
        first_unusable_line(file, source.text_field, source.score_field if score else None) if jsonl else None
    )
    return f"{file}:{found[0]}: {found[1]}" if found else f"{file}: {min(tally['skipped'])}"


def read_examples(
    spark: SparkSession, training: ClassifierTrainingConfig, config: PipelineConfig
) -> tuple[DataFrame, dict[str, dict[str, Any]]]:
    """(text, label) rows before sampling: label 1 for positives (or scores at or above the bar), else 0;
    and per source and file, the documents kept and those skipped by reason. An unusable line (row, .txt
    file) is skipped and counted; a source with no usable one, or with more than ``max_unusable_share`` of
    them unusable, is an error naming it, its first bad line and why."""
    from pyspark.sql import functions as F

    roles = (
        [("labelled", training.labelled)]
        if training.labelled
        else [("positives", training.positives), ("negatives", training.negatives)]
    )
    frames: list[DataFrame] = []
    report: dict[str, dict[str, Any]] = {}
    for role, sources in roles:
        score = role == "labelled"
        for index, source in enumerate(sources):
            key = f"classifier_training.{role}[{index}]"
            judged = read_text_source(spark, source, config, score=score)
            files = report[key] = _tally(judged, source)
            kept, skipped = _totals(files.values())
            if not kept:
                why = (
                    f"{_summary(skipped)}; the first: {_first_unusable(source, files, score)}"
                    if skipped
                    else "it holds none"
                )
                raise StageFailure(f"{key} ({source.describe()}): no usable document: {why}")
            share = skipped.total() / (kept + skipped.total())
            if share > training.max_unusable_share:
                raise StageFailure(
                    f"{key} ({source.describe()}): {_summary(skipped)} of {kept + skipped.total()}, "
                    f"{share:.0%}, more than classifier_training.max_unusable_share "
                    f"({training.max_unusable_share:.0%}); the first: {_first_unusable(source, files, score)}"
                )
            if skipped:
                log.warning(
                    "%s (%s): %s skipped, %d kept; the first: %s",
                    key,
                    source.describe(),
                    _summary(skipped),
                    kept,
                    _first_unusable(source, files, score),
                )
            rows = usable(judged, source, config)
            label = (
                (F.col("score") >= training.positive_min_score).cast("int")
                if score
                else F.lit(1 if role == "positives" else 0)
            )
            frames.append(rows.select("text", label.alias("label")))
    return _union(frames), report


def sample_examples(
    examples: DataFrame, training: ClassifierTrainingConfig, seed: int
) -> tuple[DataFrame, dict[str, Any]]:
    """Each class down to its quota by a seeded hash of the text (the same rows on every run), a seeded
    ``heldout`` flag, and a seeded ``order``; also the counts before and after."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    # A text given under both labels is ambiguous: it goes, counted.
    labels_per_text = examples.groupBy("text").agg(
        F.countDistinct("label").alias("labels"), F.min("label").alias("label")
    )
    available = {
        int(row["label"]): int(row["count"])
        for row in labels_per_text.where(F.col("labels") == 1).groupBy("label").count().collect()
    }
    conflicting = labels_per_text.where(F.col("labels") > 1).count()
    if set(available) != {0, 1}:
        raise StageFailure(
            f"classifier_training: the examples hold only label(s) {sorted(available)} ({available}); both positives and "
            "negatives are needed (check the sources, or positive_min_score for labelled examples)"
        )
    for label, name in ((1, "positive"), (0, "negative")):
        if available[label] < training.min_examples_per_class:
            raise StageFailure(
                f"classifier_training: {available[label]} usable {name} examples (distinct texts), fewer than "
                f"classifier_training.min_examples_per_class ({training.min_examples_per_class}); give more, or lower it"
            )
    quota = min(
        training.max_examples_per_class,
        *(available.values() if training.balance else [training.max_examples_per_class]),
    )
    rank = Window.partitionBy("label").orderBy(F.xxhash64(F.lit(seed), "text"), "text")
    chosen = (
        labels_per_text.where(F.col("labels") == 1)
        .select("text", "label")
        .withColumn("rank", F.row_number().over(rank))
        .where(F.col("rank") <= quota)
        .withColumn(
            "heldout",
            F.pmod(F.xxhash64(F.lit(seed + 1), "text"), F.lit(HELDOUT_BUCKETS))
            < int(training.heldout_fraction * HELDOUT_BUCKETS),
        )
        .withColumn("order", F.xxhash64(F.lit(seed + 2), "text"))
        .drop("rank")
        .cache()
    )
    counts = {
        (int(row["label"]), bool(row["heldout"])): int(row["count"])
        for row in chosen.groupBy("label", "heldout").count().collect()
    }
    for label, name in ((1, "positive"), (0, "negative")):
        heldout = counts.get((label, True), 0)
        if heldout < training.min_heldout_per_class:
            chosen.unpersist()
            raise StageFailure(
                f"classifier_training: {heldout} held-out {name} examples, fewer than classifier_training.min_heldout_per_class "
                f"({training.min_heldout_per_class}) for figures that mean something; raise "
                f"classifier_training.heldout_fraction ({training.heldout_fraction}) or give more examples"
            )
    return chosen, {
        "available": {"positive": available.get(1, 0), "negative": available.get(0, 0)},
        "conflicting_texts": int(conflicting),
        "per_class": quota,
        "train": {"positive": counts.get((1, False), 0), "negative": counts.get((0, False), 0)},
        "heldout": {"positive": counts.get((1, True), 0), "negative": counts.get((0, True), 0)},
    }


def train_fasttext(
    chosen: DataFrame, training: ClassifierTrainingConfig, folder: Path, work: Path
) -> tuple[Path, np.ndarray, np.ndarray, dict]:
    """Write the training lines in seeded order, train, and score the held-out texts; (model, labels, scores)."""
    import fasttext

    prepare = preprocessor(training.preprocess)
    train_file = work / "train.txt"
    heldout_texts: list[str] = []
    heldout_labels: list[int] = []
    empty = 0
    with open(train_file, "w", encoding="utf-8") as handle:
        for row in chosen.orderBy("order", "text").toLocalIterator():
            if row["heldout"]:
                heldout_texts.append(row["text"])
                heldout_labels.append(int(row["label"]))
                continue
            line = prepare(row["text"])
            if not line:
                empty += 1
                continue
            handle.write(f"{POSITIVE_LABEL if row['label'] else NEGATIVE_LABEL} {line}\n")
    params = training.fasttext
    try:
        model = fasttext.train_supervised(
            input=str(train_file),
            dim=params.dim,
            epoch=params.epoch,
            lr=params.lr,
            wordNgrams=params.word_ngrams,
            minCount=params.min_count,
            bucket=params.bucket,
            loss=params.loss,
            thread=params.threads,
            verbose=0,
        )
    except RuntimeError as exc:
        raise StageFailure(
            f"fastText training failed ({exc}); a lower classifier_training.fasttext.lr may help"
        ) from None
    path = folder / FASTTEXT_FILE
    model.save_model(str(path))
    scores = np.array(
        fasttext_scores(model, heldout_texts, POSITIVE_LABEL, training.preprocess), dtype=np.float64
    )
    return (
        path,
        np.array(heldout_labels, dtype=np.int64),
        scores,
        {"empty_after_preprocessing": empty, "labels": list(model.labels)},
    )


def train_embedding(
    chosen: DataFrame, training: ClassifierTrainingConfig, folder: Path, seed: int
) -> tuple[Path, np.ndarray, np.ndarray, dict]:
    """Embed the examples in the Spark workers, fit logistic regression on the train split; (model, labels, scores)."""
    import functools

    from pyspark.sql import functions as F
    from sklearn.linear_model import LogisticRegression

    from pipeline.embeddings import embed_batches, embedded_schema

    encoder = training.embedding.encoder
    keep = ("text", "label", "heldout")
    rows = map_in_arrow(
        chosen.select(
            "text",
            F.col("label").cast("string").alias("label"),
            F.col("heldout").cast("string").alias("heldout"),
        ),
        functools.partial(embed_batches, config=encoder, keep=keep),
        spark_schema(embedded_schema(keep)),
    ).collect()
    rows.sort(key=lambda row: row["text"])  # a fixed order whatever the partitions
    vectors = np.array([row["embedding"] for row in rows], dtype=np.float32)
    labels = np.array([int(row["label"]) for row in rows], dtype=np.int64)
    heldout = np.array([row["heldout"] == "true" for row in rows])
    regression = LogisticRegression(
        C=training.embedding.c, max_iter=training.embedding.max_iter, random_state=seed
    )
    regression.fit(vectors[~heldout], labels[~heldout])
    model = EmbeddingClassifier(
        encoder.model_dump(), regression.coef_[0].astype(np.float64), float(regression.intercept_[0])
    )
    path = folder / EMBEDDING_FILE
    path.write_text(
        model.to_json(positive_min_score=training.positive_min_score if training.labelled else None)
    )
    scores = model.probabilities(vectors[heldout])
    return path, labels[heldout], scores, {"embedding_dim": int(vectors.shape[1]) if len(vectors) else 0}


def source_refs(training: ClassifierTrainingConfig, config: PipelineConfig) -> list[DatasetRef]:
    """The stage outputs among the sources: the manifest lists them as inputs (lineage)."""
    sources: list[TextSource] = [*training.positives, *training.negatives, *training.labelled]
    return [stage_documents(config, source) for source in sources if source.stage is not None]


def run(config: PipelineConfig, inputs: list[DatasetRef], output: DatasetRef) -> Manifest:
    training = config.classifier_training
    try:
        training.require_examples()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    sources = [*inputs, *source_refs(training, config)]
    with StageOutput(output, config, sources) as out:
        spark = spark_session(config, f"train-classifier-{output.corpus}-{output.snapshot}")
        examples, read_report = read_examples(spark, training, config)
        chosen, counts = sample_examples(examples, training, config.project.seed)
        # Totals go in the counters (MLflow metrics); per source and file, in extra (paths make no metric names).
        kept, skipped = _totals(tally for files in read_report.values() for tally in files.values())
        counts["read"] = {"kept": kept, "skipped": dict(sorted(skipped.items()))}
        try:
            log.info(
                "train_classifier: %s examples per class (%s), held out %s",
                counts["per_class"],
                counts["train"],
                counts["heldout"],
            )
            if training.kind == "fasttext":
                with tempfile.TemporaryDirectory(prefix="classifier-") as work:
                    path, labels, scores, details = train_fasttext(chosen, training, out.path, Path(work))
            else:
                path, labels, scores, details = train_embedding(
                    chosen, training, out.path, config.project.seed
                )
        finally:
            chosen.unpersist()
        figures = binary_metrics(labels, scores, bins=training.calibration_bins)
        plots = out.path / "plots"
        plots.mkdir()
        plot_calibration(figures, plots / "calibration.png")
        plot_score_histogram(labels, scores, plots / "heldout_scores.png")
        (out.path / "metrics.json").write_text(json.dumps(figures, indent=2) + "\n")
        model = {
            "kind": training.kind,
            "file": path.name,
            "sha256": sha256_file(path),
            "preprocess": training.preprocess if training.kind == "fasttext" else None,
            "label": POSITIVE_LABEL if training.kind == "fasttext" else None,
            "examples": counts,
            "parameters": (
                training.fasttext if training.kind == "fasttext" else training.embedding
            ).model_dump(mode="json"),
            **details,
        }
        log.info(
            "train_classifier: held-out ROC AUC %s, precision %s, recall %s; %s sha256 %s",
            figures["roc_auc"],
            figures["precision"],
            figures["recall"],
            path.name,
            model["sha256"][:16],
        )
        scalar = {
            key: value
            for key, value in figures.items()
            if isinstance(value, int | float) and value is not None
        }
        return out.commit(
            rows={"examples": sum(counts["train"].values()) + sum(counts["heldout"].values())},
            counters={"examples": counts},
            extra={"model": model, "metrics": scalar, "sources": read_report},
        )
