"""The quality stage: a data-quality report on a snapshot's documents.

Each view is computed where it scales:

* coverage: documents, characters and languages per web host, over every document (Spark aggregations);
* the sample: ``quality.sample_docs`` documents by a seeded hash of their ids, embedded in the Spark
  workers (``pipeline.embeddings``), then brought to the driver, so the costly metrics below cost the same
  whatever the corpus size:
  * subjects: each sampled document's nearest subject by its prototypes (``subjects``);
  * diversity: distinct n-grams (Spark), cosine statistics, k-means cluster entropy, Vendi score,
    compression ratios, and on ``quality.pairwise_docs`` of them self-BLEU and a BERTScore-style F1
    (``diversity``);
* the drop funnel, from the manifests along the documents' lineage (``funnel``);
* the change since the previous snapshot's report (``trends``), and the gate (``gate``).

Writes ``report.html`` (``page``: plots inline), ``metrics.json``, ``plots/*.png``, ``hosts.parquet`` and
``embeddings.parquet`` (the sample's vectors and subjects, for anyone who wants to dig further).
"""

from __future__ import annotations

import json
import logging
import math
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import PipelineConfig
from pipeline.core.manifest import Manifest
from pipeline.core.spark import aggregate, spark_session
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.documents.plots import plot_scores
from pipeline.embeddings import Encoder, EncoderConfig, encode, load_encoder
from pipeline.quality import diversity, gate, page, subjects, trends
from pipeline.quality.card import card_link
from pipeline.quality.funnel import as_rows, clean_details, filtering_details, funnel, plot_waterfall, shares

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)
STAGE = "quality"


def cosine_statistics(embeddings: np.ndarray) -> dict[str, float | None]:
    """Mean pairwise cosine similarity (lower is more diverse) and nearest-neighbour similarity."""
    count = len(embeddings)
    if count < 2:
        return {
            "mean_pairwise_cosine": None,
            "mean_nearest_neighbour_cosine": None,
            "near_duplicate_share": None,
        }
    similarity = embeddings.astype(np.float64) @ embeddings.astype(np.float64).T
    off_diagonal = similarity[~np.eye(count, dtype=bool)]
    np.fill_diagonal(similarity, -np.inf)
    nearest = similarity.max(axis=1)
    return {
        "mean_pairwise_cosine": float(off_diagonal.mean()),
        "mean_nearest_neighbour_cosine": float(nearest.mean()),
        "near_duplicate_share": float((nearest > 0.95).mean()),
    }


def cluster_entropy(embeddings: np.ndarray, clusters: int, seed: int) -> dict[str, float | int | None]:
    """k-means on the sample; the normalised entropy of cluster sizes is 1 when topics are evenly spread."""
    count = len(embeddings)
    k = min(clusters, count)
    if k < 2:
        return {"clusters": k, "cluster_entropy": None}
    # Two runs' vectors can differ in the 8th decimal (the encoder in another worker process), and k-means on
    # a small sample turns that into other clusters: round it away first.
    labels = kmeans_labels(np.round(embeddings, 5).astype(np.float64), k, seed)
    shares = np.bincount(labels, minlength=k) / count
    entropy = -sum(p * math.log(p) for p in shares if p > 0) / math.log(k)
    return {"clusters": k, "cluster_entropy": float(entropy)}


def kmeans_labels(points: np.ndarray, k: int, seed: int, starts: int = 4, iterations: int = 30) -> np.ndarray:
    """Lloyd's k-means (scipy's ``kmeans2``) from ``starts`` seeded k-means++ starts; the labels of the one with
    the least inertia. scipy, not scikit-learn: importing sklearn.cluster cost a report about a second."""
    import warnings

    from scipy.cluster.vq import kmeans2

    rng = np.random.default_rng(seed)
    best: tuple[float, np.ndarray] | None = None
    for _ in range(starts):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a cluster left empty keeps its centre, and its share is 0
            centres, labels = kmeans2(points, k, iter=iterations, minit="++", rng=rng)
        inertia = float(((points - centres[labels]) ** 2).sum())
        if best is None or inertia < best[0]:
            best = (inertia, labels)
    assert best is not None
    return best[1]


def host_concentration(doc_counts: list[int]) -> dict[str, float | int]:
    """How concentrated the documents are on few web hosts (the host view; subjects are another view)."""
    total = sum(doc_counts)
    shares = sorted((c / total for c in doc_counts), reverse=True) if total else []
    entropy = -sum(p * math.log(p) for p in shares if p > 0)
    return {
        "hosts": len(doc_counts),
        "top10_host_share": float(sum(shares[:10])),
        "host_entropy_normalised": float(entropy / math.log(len(shares))) if len(shares) > 1 else 0.0,
        "host_herfindahl_index": float(sum(p * p for p in shares)),
    }


@dataclass(frozen=True)
class Coverage:
    """Counts over every document."""

    documents: int
    characters: int
    hosts: list[dict]  # domain (the web host), documents, characters; most documents first
    languages: dict[str, int]  # empty when the input has no ``lang`` column
    length_quantiles: list[float]  # characters at p10, p50, p90, p99


def coverage(docs: DataFrame) -> Coverage:
    from pyspark.sql import functions as F

    # One pass for the totals and the length quantiles: on a small corpus each Spark job is most of the cost.
    totals = aggregate(
        docs,
        F.count("*").alias("documents"),
        F.sum("n_chars").alias("characters"),
        F.percentile("n_chars", F.array(*[F.lit(q) for q in (0.1, 0.5, 0.9, 0.99)])).alias("q"),
    )
    # Hosts and languages from one grouping: (domain, language) pairs are few next to the documents.
    has_lang = "lang" in docs.columns  # asked once: through Spark Connect each look is a round trip
    lang = F.col("lang") if has_lang else F.lit(None).cast("string")
    pairs = (
        docs.groupBy("domain", lang.alias("lang"))
        .agg(F.count("*").alias("documents"), F.sum("n_chars").alias("characters"))
        .collect()
    )
    per_domain: dict[str | None, dict] = {}
    languages: dict[str, int] = {}
    for row in pairs:
        host = per_domain.setdefault(
            row["domain"], {"domain": row["domain"], "documents": 0, "characters": None}
        )
        host["documents"] += row["documents"]
        if row["characters"] is not None:  # Spark's sum: null only when every length is null
            host["characters"] = (host["characters"] or 0) + row["characters"]
        if has_lang:
            languages[str(row["lang"])] = languages.get(str(row["lang"]), 0) + int(row["documents"])
    # Most documents first, then by domain with a null domain first, as Spark orders them.
    hosts = sorted(
        per_domain.values(),
        key=lambda host: (-host["documents"], host["domain"] is not None, host["domain"] or ""),
    )
    length_quantiles = totals["q"]
    return Coverage(
        documents=int(totals["documents"]),
        characters=int(totals["characters"] or 0),
        hosts=hosts,
        languages=languages,
        length_quantiles=[float(q) for q in length_quantiles] if length_quantiles else [],
    )


def sample_documents(docs: DataFrame, config: PipelineConfig) -> DataFrame:
    """``quality.sample_docs`` documents by a seeded hash of the id (the same ones on every run), for
    ``collect_sample``."""
    from pyspark.sql import functions as F

    lang = F.col("lang") if "lang" in docs.columns else F.lit(None).cast("string")
    return (
        docs.withColumn("order", F.xxhash64(F.lit(config.project.seed), "id"))
        .orderBy("order", "id")
        .limit(config.quality.sample_docs)
        .select("id", "domain", lang.alias("lang"), "text")
    )


@dataclass(frozen=True)
class Sample:
    """The sample on the driver, sorted by id: bounded by ``quality.sample_docs`` whatever the corpus size."""

    ids: list[str]
    hosts: list[str]
    languages: list[str | None]
    texts: list[str]
    embeddings: np.ndarray  # unit rows, embedded on the driver


def collect_sample(
    sample: DataFrame, encoder: EncoderConfig, loading: Future[Encoder] | None = None
) -> Sample:
    """The sample on the driver, embedded there: the sample is bounded, the driver loads the encoder anyway
    (prototypes, BERTScore), and each Spark worker that embedded a share would import torch and load the
    model again (seconds each, most of the stage on a small snapshot).

    ``loading``: the encoder's load started beside the Spark jobs (``load_encoder``), waited for once the rows
    are here (its cache is not a lock: a second load would start otherwise)."""
    rows = sorted(sample.select("id", "domain", "lang", "text").collect(), key=lambda row: row.id)
    if loading is not None:
        loading.result()
    texts = [row.text for row in rows]
    return Sample(
        ids=[row.id for row in rows],
        hosts=[row.domain for row in rows],
        languages=[row.lang for row in rows],
        texts=texts,
        embeddings=encode(texts, encoder).reshape(len(rows), -1),
    )


@dataclass(frozen=True)
class Topics:
    """The subject view of the sample."""

    assigned: list[str]  # each sampled document's subject (or "unassigned")
    coverage: dict  # subjects.subject_coverage
    metrics: dict
    warnings: list[str]


def subject_view(sample: Sample, quality) -> Topics:
    config = quality.subjects
    prototypes = subjects.load_prototypes(config.prototypes)
    found = subjects.assign_documents(
        sample.texts, sample.languages, config, quality.encoder, embeddings=sample.embeddings
    )
    coverage = subjects.subject_coverage(found, list(prototypes), config.min_share, config.min_margin)
    table = coverage["subjects"]
    shares = [row["share"] for row in table.values() if row["share"] > 0]
    entropy = -sum(p * math.log(p) for p in shares)
    metrics = {
        "subjects": table,
        "unassigned_documents": coverage[subjects.UNASSIGNED]["documents"],
        "unassigned_share": coverage[subjects.UNASSIGNED]["share"],
        "subjects_under_min_share": coverage["under_min_share"],
        "subject_methods": coverage["methods"],
        "subject_entropy_normalised": entropy / math.log(len(table)) if len(table) > 1 else None,
    }
    warnings = subjects.language_warnings(
        sample.languages,
        quality.encoder.languages,
        subjects.fallback_languages(config, prototypes),
        quality.encoder.model,
    )
    if coverage["under_min_share"]:
        warnings.append(
            f"subjects under quality.subjects.min_share {config.min_share}: {', '.join(coverage['under_min_share'])}"
        )
    return Topics([a.subject for a in found], coverage, metrics, warnings)


def _classifier_view(record: dict) -> dict:
    """What the report keeps of a classify record: not the model's path, the rest as the stage recorded it."""
    keep = (
        "kind",
        "source",
        "sha256",
        "label",
        "preprocess",
        "languages",
        "cut",
        "dropped",
        "bins",
        "histogram",
        "passed_through",
    )
    return {key: record.get(key) for key in keep}


def write_tables(folder: Path, hosts: list[dict], sample: Sample, assigned: list[str]) -> None:
    pq.write_table(pa.Table.from_pylist(hosts), folder / "hosts.parquet")
    pq.write_table(
        pa.table(
            {
                "id": sample.ids,
                "host": sample.hosts,
                "lang": sample.languages,
                "subject": assigned,
                "embedding": pa.FixedSizeListArray.from_arrays(
                    pa.array(sample.embeddings.ravel()), sample.embeddings.shape[1]
                ),
            }
        ),
        folder / "embeddings.parquet",
    )


def run(config: PipelineConfig, inputs: list[DatasetRef], output: DatasetRef) -> Manifest:
    (documents_ref,) = inputs
    quality = config.quality
    with StageOutput(output, config, inputs) as out, ThreadPoolExecutor(1, "quality-load") as loading:
        # torch and the weights take seconds to load, and the Spark jobs before the encoder's use mostly wait.
        encoder = loading.submit(load_encoder, quality.encoder.model, quality.encoder.max_seq_length)
        spark = spark_session(config, f"quality-{output.corpus}-{output.snapshot}")
        from pyspark.sql import functions as F

        docs = spark.read.parquet(str(documents_ref.path / "documents")).withColumn(
            "n_chars", F.length("text")
        )
        covered = coverage(docs)
        sampled = sample_documents(docs, config)
        sample = collect_sample(sampled, quality.encoder, encoder)
        log.info("quality: %d documents, sample of %d embedded", covered.documents, len(sample.ids))

        topics = subject_view(sample, quality)
        ratios = [diversity.compression_ratio(text) for text in sample.texts if text]
        steps = funnel(documents_ref.manifest())
        cleaned = clean_details(documents_ref.manifest())
        filtering = filtering_details(documents_ref.manifest())
        metrics = {
            "documents": covered.documents,
            "characters": covered.characters,
            "sampled_documents": len(sample.ids),
            "seed": config.project.seed,
            "length_p10_p50_p90_p99": covered.length_quantiles,
            "languages": covered.languages,
            **host_concentration([row["documents"] for row in covered.hosts]),
            **shares(steps),
            **diversity.lexical_diversity(sample.texts),
            **cosine_statistics(sample.embeddings),
            **cluster_entropy(sample.embeddings, quality.clusters, config.project.seed),
            **diversity.sample_diversity(
                sample.texts,
                sample.embeddings,
                quality.encoder,
                max_pairwise_docs=quality.pairwise_docs,
                max_pairs=quality.bertscore_pairs,
                seed=config.project.seed,
            ),
            **topics.metrics,
            "funnel": as_rows(steps),
            "funnel_languages": cleaned["languages"],
            "pii_redacted": cleaned["pii_redacted"],
            # Each classifier's score histogram per language and its cut; each evaluation set's n-grams.
            "classifiers": {
                name: _classifier_view(record) for name, record in filtering["classifiers"].items()
            },
            "decontamination": filtering["decontamination"],
        }
        warnings = topics.warnings
        metrics["warnings"] = warnings
        verdict = gate.evaluate(quality.gate, metrics)
        metrics["gate"] = verdict
        if not verdict["passed"]:
            log.warning(
                "quality gate (%s): %s%s",
                verdict["mode"],
                "; ".join(verdict["failures"]),
                ": this snapshot's token shards will not be announced" if verdict["mode"] == "fail" else "",
            )
        for warning in warnings:
            log.warning("quality: %s", warning)

        earlier = trends.earlier_reports(output, quality.trend_snapshots)
        previous_snapshot, previous = earlier[-1] if earlier else (None, None)
        changes = trends.deltas(metrics, previous)
        (out.path / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
        write_tables(out.path, covered.hosts, sample, topics.assigned)

        plots = out.path / "plots"
        plots.mkdir()
        images = {
            "subjects": subjects.plot_subjects(topics.coverage, plots / "subjects.png"),
            "compression": diversity.plot_compression(ratios, plots / "compression.png"),
            "embeddings": page.plot_embeddings(
                sample.embeddings,
                topics.assigned,
                plots / "embeddings_pca.png",
                "sample embeddings by subject",
            ),
            "funnel": plot_waterfall(steps, plots / "funnel.png"),
            "trends": trends.plot_trends([*earlier, (output.snapshot, metrics)], plots / "trends.png"),
            "hosts": page.plot_hosts(covered.hosts, plots / "hosts.png"),
            "lengths": page.plot_lengths(np.array([len(t) for t in sample.texts]), plots / "lengths.png"),
            **{
                f"scores_{name}": plot_scores(name, record, plots / f"scores_{name}.png")
                for name, record in metrics["classifiers"].items()
            },
        }
        page.write_page(
            out.path / "report.html",
            output.snapshot,
            metrics,
            covered.hosts,
            images,
            changes,
            previous_snapshot,
            warnings,
            card=card_link(documents_ref, output.path),
        )
        log.info(
            "quality: %d documents, %d hosts, self-BLEU %s, Vendi %s, unassigned %s",
            metrics["documents"],
            metrics["hosts"],
            metrics.get("self_bleu"),
            metrics.get("vendi_score"),
            metrics.get("unassigned_share"),
        )
        return out.commit(
            rows={"documents": metrics["documents"], "sampled": len(sample.ids)},
            extra={"metrics": metrics, "gate": verdict, "previous_snapshot": previous_snapshot},
        )
