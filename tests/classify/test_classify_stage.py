"""Classifier training and the classify stage in Spark, end to end on Wikipedia leads against generated junk.

One module run: train a fastText classifier (positives: a JSONL of reference text; negatives: a stage
output of junk), then classify a mixed snapshot with it by name, with a copy of its .bin loaded by path only
(as a user loads a downloaded model) and with an embedding classifier trained on labelled scores.
"""

from __future__ import annotations

import json
import random
import shutil

import fasttext
import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.classify import job as classify_job
from pipeline.classify.preprocess import dclm
from pipeline.classify.training import job as training_job
from pipeline.core.config import ConfigError
from pipeline.core.storage import DatasetRef
from pipeline.entrypoint import stage_main
from tests.classify.corpus import document, publish_documents
from tests.classify.texts import junk_documents, wikipedia_extracts
from tests.conftest import make_config

pytestmark = pytest.mark.slow
SNAPSHOT = "s1"
FILES = 6  # more scoring tasks than Python workers, so reuse of a loaded model shows


def read(ref: DatasetRef, name: str) -> list[dict]:
    return pq.read_table(ref.path / name).to_pylist()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("classify")
    wiki = list(wikipedia_extracts())
    rng = random.Random(7)
    rng.shuffle(wiki)
    reference = root / "reference.jsonl"
    reference.write_text("".join(json.dumps({"text": text}) + "\n" for text in wiki[:700]))
    base = make_config(root / "data")
    publish_documents(
        base,
        "junk",
        "pool",
        [document(text, key=f"junk{i}") for i, text in enumerate(junk_documents(700, seed=3))],
    )

    overrides = [
        f"classifier_training.positives=[{{path: {reference}}}]",
        "classifier_training.negatives=[{stage: junk, snapshot: pool}]",
        "classifier_training.max_examples_per_class=600",
        "classifier_training.fasttext.bucket=50000",  # a 20 MB model instead of DCLM's 800 MB of bigram buckets
    ]
    config = make_config(root / "data", *overrides)
    # Through the stage's entrypoint, as `pretrain train_classifier` runs it: MLflow records the run.
    store = f"sqlite:///{root / 'mlflow.db'}"
    settings = [
        f"project.data_root={root / 'data'}",
        "spark.master=local[2]",
        "spark.shuffle_partitions=4",
        "logging.console=false",
        f"tracking.mlflow_tracking_uri={store}",
        "tracking.experiment=classifiers",
        *overrides,
    ]
    argv = ["--snapshot", "wiki", *[arg for item in settings for arg in ("--set", item)]]
    assert stage_main(argv, stage="train_classifier", description="", run=training_job.run) == 0
    trained = DatasetRef.of(config, "train_classifier", "wiki").manifest()

    # Labelled scores for the embedding kind: Wikipedia leads score 4, junk scores 1.
    labelled = root / "labelled.parquet"
    rows = [{"body": t, "edu": 4.0} for t in wiki[700:800]] + [
        {"body": t, "edu": 1.0} for t in junk_documents(100, seed=5)
    ]
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(rows), labelled)
    embedding_config = make_config(
        root / "data",
        f"classifier_training.labelled=[{{path: {labelled}, text_field: body, score_field: edu}}]",
        "classifier_training.kind=embedding",
    )
    embedded = training_job.run(
        embedding_config, [], DatasetRef.of(embedding_config, "train_classifier", "edu")
    )

    # The snapshot to classify: unseen leads, junk, and a few Chinese documents no model covers.
    documents = [document(t) for t in wiki[800:1000]]
    documents += [document(t, key=f"new-junk{i}") for i, t in enumerate(junk_documents(150, seed=11))]
    documents += [
        document(f"这是第{i}个中文文档，用来检查没有训练过的语言会被直接放行。", lang="zh", key=f"zh{i}")
        for i in range(12)
    ]
    publish_documents(base, "dedup", SNAPSHOT, documents, files=FILES)
    downloaded = root / "downloads" / "quality.bin"
    downloaded.parent.mkdir()
    shutil.copy(DatasetRef.of(config, "train_classifier", "wiki").path / "model.bin", downloaded)
    models = (
        "classify.models=["
        "{name: wiki, trained: wiki, top_fraction: 0.5, languages: [en]},"
        f"{{name: published, path: {downloaded}, label: __label__hq, threshold: 0.3, languages: [en]}},"
        "{name: edu, trained: edu, languages: [en]}"
        "]"
    )
    classify_config = make_config(root / "data", models)
    inputs = [DatasetRef.of(classify_config, "dedup", SNAPSHOT)]
    output = DatasetRef.of(classify_config, "classify", SNAPSHOT)
    manifest = classify_job.run(classify_config, inputs, output)
    return {
        "mlflow": store,
        "config": classify_config,
        "trained": trained,
        "embedded": embedded,
        "manifest": manifest,
        "output": output,
        "downloaded": downloaded,
        "documents": documents,
    }


def test_fasttext_classifier_separates_reference_text_from_junk(world):
    trained = world["trained"]
    metrics = trained.extra["metrics"]
    assert metrics["roc_auc"] >= 0.95
    assert metrics["precision"] > 0.9 and metrics["recall"] > 0.9
    model = trained.extra["model"]
    assert model["sha256"] == trained.files["model.bin"].sha256
    assert model["preprocess"] == "dclm" and model["label"] == "__label__hq"
    examples = model["examples"]
    assert examples["per_class"] == 600
    held = examples["heldout"]["positive"] + examples["heldout"]["negative"]
    assert 0.05 * 1200 < held < 0.15 * 1200  # classifier_training.heldout_fraction 0.1, by a seeded hash
    folder = DatasetRef.of(world["config"], "train_classifier", "wiki").path
    assert (folder / "plots" / "calibration.png").is_file()
    calibration = json.loads((folder / "metrics.json").read_text())["calibration"]
    assert sum(row["documents"] for row in calibration) == held
    assert [i["stage"] for i in trained.inputs] == ["junk"]  # the negatives' stage output, for lineage


def test_the_model_file_and_its_figures_are_logged_to_mlflow(world):
    from mlflow import MlflowClient

    client = MlflowClient(world["mlflow"])
    experiment = client.get_experiment_by_name("classifiers")
    (run,) = [
        r
        for r in client.search_runs([experiment.experiment_id])
        if r.data.tags.get("pretrain.stage") == "train_classifier"
    ]
    assert run.data.metrics["metrics.roc_auc"] == world["trained"].extra["metrics"]["roc_auc"]
    assert {"metrics.precision", "metrics.recall"} <= set(run.data.metrics)
    logged = {a.path for a in client.list_artifacts(run.info.run_id, "train_classifier")}
    assert {"train_classifier/model.bin", "train_classifier/metrics.json", "train_classifier/plots"} <= logged
    assert run.data.tags["pretrain.output_digest"] == world["trained"].digest


def test_embedding_classifier_on_labelled_scores(world):
    embedded = world["embedded"]
    assert embedded.extra["metrics"]["roc_auc"] >= 0.95
    assert embedded.extra["model"]["kind"] == "embedding" and "model.json" in embedded.files


def test_spark_scores_equal_fasttexts_own_predict_document_by_document(world):
    output = world["output"]
    rows = read(output, "documents") + read(output, "excluded")
    model = fasttext.load_model(str(world["downloaded"]))
    checked = 0
    for row in rows:
        if row["lang"] != "en":
            continue
        labels, probabilities = model.predict(dclm(row["text"]), k=-1)
        expected = float(probabilities[list(labels).index("__label__hq")])
        assert row["score_published"] == expected, row["id"]
        assert row["score_wiki"] == expected  # the same model file, by name and by path
        checked += 1
    assert checked == 350


def test_top_fraction_keeps_the_requested_share_and_threshold_keeps_exactly_those_at_or_above(world):
    rows = read(world["output"], "documents") + read(world["output"], "excluded")
    english = [row for row in rows if row["lang"] == "en"]
    cut = world["manifest"].extra["classify"]["models"]["wiki"]["cut"]
    kept_by_wiki = [row for row in english if row.get("drop_reason") != "classifier:wiki"]
    assert abs(len(kept_by_wiki) - 0.5 * len(english)) <= 1
    assert len(kept_by_wiki) == cut["target"] == round(0.5 * 350)
    best_first = sorted(english, key=lambda row: (-row["score_wiki"], row["id"]))
    assert {row["id"] for row in kept_by_wiki} == {row["id"] for row in best_first[: cut["target"]]}
    # Threshold mode, on what the first model kept: exactly the documents at or above 0.3.
    for row in kept_by_wiki:
        dropped = row.get("drop_reason") == "classifier:published"
        assert dropped == (row["score_published"] < 0.3), row


def test_drops_are_counted_with_their_reason_and_scores(world):
    manifest = world["manifest"]
    excluded = read(world["output"], "excluded")
    counted = manifest.counters["dropped"]
    assert sum(counted.values()) == len(excluded) == manifest.rows["excluded"]
    for reason, count in counted.items():
        assert count == sum(row["drop_reason"] == reason for row in excluded)
    assert all(
        row["drop_reason"].startswith("classifier:") and row["score_wiki"] is not None for row in excluded
    )
    assert manifest.counters["input_documents"] == len(world["documents"])
    junk_kept = [
        row
        for row in read(world["output"], "documents")
        if row["id"] in {d["id"] for d in world["documents"][200:350]}
    ]
    assert len(junk_kept) <= 3  # the classifier is good: junk leaves


def test_languages_a_model_was_not_trained_on_pass_through_and_are_counted(world):
    manifest = world["manifest"]
    kept = read(world["output"], "documents")
    chinese = [row for row in kept if row["lang"] == "zh"]
    assert len(chinese) == 12 and all(
        row["score_wiki"] is None and row["score_edu"] is None for row in chinese
    )
    assert manifest.counters["passed_through"] == {
        "wiki": {"zh": 12},
        "published": {"zh": 12},
        "edu": {"zh": 12},
    }
    view = manifest.extra["classify"]["models"]["wiki"]
    assert sum(view["histogram"]["en"]) == 350 and "zh" not in view["histogram"]
    assert (world["output"].path / "plots" / "scores_wiki.png").is_file()


def test_each_model_is_loaded_once_per_python_worker_not_per_task(world):
    loads = world["manifest"].counters["model_loads"]
    workers = 2  # local[2]
    for name in ("wiki", "published", "edu"):
        assert 1 <= loads[name] <= workers < FILES, loads


def test_models_are_recorded_by_digest(world):
    models = world["manifest"].extra["classify"]["models"]
    assert (
        models["wiki"]["sha256"] == models["published"]["sha256"] == world["trained"].extra["model"]["sha256"]
    )
    assert models["wiki"]["source"] == "trained:wiki" and models["published"]["source"] == str(
        world["downloaded"]
    )
    assert models["edu"]["kind"] == "embedding"


def test_embedding_scores_match_the_classifier_applied_in_the_driver(world):
    from pipeline.classify.models import EmbeddingClassifier

    rows = [
        row
        for row in read(world["output"], "documents") + read(world["output"], "excluded")
        if row["lang"] == "en"
    ]
    rows = sorted(rows, key=lambda row: row["id"])[:40]
    model = EmbeddingClassifier.load(
        DatasetRef.of(world["config"], "train_classifier", "edu").path / "model.json"
    )
    expected = model.scores([row["text"] for row in rows])
    np.testing.assert_allclose([row["score_edu"] for row in rows], expected, atol=1e-5)


def test_a_wrong_label_fails_before_spark_naming_the_model(world, tmp_path):
    config = make_config(
        world["config"].project.data_root,
        f"classify.models=[{{name: bad, path: {world['downloaded']}, label: __label__good}}]",
    )
    with pytest.raises(ConfigError, match=r"classify.models\[bad\].label: '__label__good' is not a label"):
        classify_job.run(
            config, [DatasetRef.of(config, "dedup", SNAPSHOT)], DatasetRef.of(config, "classify", "bad")
        )


def test_no_model_passes_the_documents_through_unchanged(world):
    config = make_config(world["config"].project.data_root)
    source = DatasetRef.of(config, "dedup", SNAPSHOT)
    manifest = classify_job.run(config, [source], DatasetRef.of(config, "classify", "plain"))
    assert manifest.rows == {"documents": len(world["documents"]), "excluded": 0}
    upstream = source.manifest()
    assert {k: v.sha256 for k, v in manifest.files.items() if k.startswith("documents/")} == {
        k: v.sha256 for k, v in upstream.files.items() if k.startswith("documents/")
    }
    assert pq.read_table(DatasetRef.of(config, "classify", "plain").path / "excluded").num_rows == 0


@pytest.mark.parametrize(("keep", "tie_ids_collected"), [("high", None), ("low", None), ("high", 3)])
def test_the_top_fraction_cut_is_exact_with_ties_and_any_fraction(
    world, keep, tie_ids_collected, monkeypatch
):
    """Scores from a few values (many ties): the cut keeps round(fraction * n), best first, ties by id. The
    driver receives one row per distinct score, and a tie block's ids only up to MAX_TIE_IDS_COLLECTED (set
    to 3: the rest is ranked in Spark): a block of identical texts never comes to the driver whole."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    from pipeline.classify import selection
    from pipeline.classify.selection import keep_condition, top_fraction_cut
    from pipeline.core.spark import spark_session

    if tie_ids_collected is not None:
        monkeypatch.setattr(selection, "MAX_TIE_IDS_COLLECTED", tie_ids_collected)
    collected: list[int] = []
    collect = DataFrame.collect

    def counting_collect(self):
        rows = collect(self)
        collected.append(len(rows))
        return rows

    spark = spark_session(world["config"], "test-classify")
    rng = random.Random(17)
    for _ in range(4):
        n = rng.randint(50, 400)
        rows = [
            (f"{i:05d}", rng.choice([0.1, 0.25, 0.5, 0.5, 0.75, 0.9]) if rng.random() > 0.1 else None)
            for i in range(n)
        ]
        frame = spark.createDataFrame(rows, "id string, score_m double")
        fraction = rng.choice([0.01, 0.1, 0.333, 0.5, 0.9, 0.999])
        collected.clear()
        with monkeypatch.context() as patch:
            patch.setattr(DataFrame, "collect", counting_collect)
            cut = top_fraction_cut(frame, "score_m", fraction, keep, error=0.01)
        assert max(collected, default=0) <= max(6, selection.MAX_TIE_IDS_COLLECTED + 1)
        kept = {
            r["id"]
            for r in frame.where(F.expr(keep_condition("score_m", cut)))
            .where("score_m IS NOT NULL")
            .collect()
        }
        scored = [(s, i) for i, s in rows if s is not None]
        order = sorted(scored, key=lambda pair: ((-pair[0] if keep == "high" else pair[0]), pair[1]))
        k = int(fraction * len(scored) + 0.5)
        assert kept == {i for _, i in order[:k]}, (n, fraction, cut)
        assert abs(len(kept) - fraction * len(scored)) <= 1
