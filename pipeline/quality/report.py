"""The quality stage: a data-quality report on a snapshot's documents.

Three views, each computed where it scales:

* coverage: documents, characters and languages per domain, over every document (Spark aggregations);
* lexical diversity: distinct word n-gram ratios over a deterministic sample (Spark, Arrow batches);
* semantic diversity: sentence embeddings (``pipeline.embeddings``; by default all-MiniLM-L6-v2, offline)
  of the same sample, computed in Spark workers, then pairwise cosine statistics and a k-means
  cluster-size entropy on the driver (the sample is small by construction).

Writes ``report.html`` (plots inline), ``metrics.json``, ``plots/*.png``, ``domains.parquet`` and
``embeddings.parquet`` (the sample's vectors, for anyone who wants to dig further).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import json
import logging
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import PipelineConfig
from pipeline.core.manifest import Manifest
from pipeline.core.spark import spark_schema, spark_session
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.embeddings import EncoderConfig, embed_batches, embedded_schema
from pipeline.quality import gate
from pipeline.quality.funnel import as_rows, funnel, plot_waterfall

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)
STAGE = "quality"
_WORD = re.compile(r"\w+", re.UNICODE)

EMBEDDED_SCHEMA = embedded_schema(("id", "domain"))
NGRAM_SCHEMA = pa.schema([("n", pa.int32()), ("total", pa.int64()), ("hashes", pa.list_(pa.int64()))])


def stable_hash64(text: str) -> int:
    """Python's hash() is salted per process, so Spark workers would disagree; blake2b is not."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def ngram_batches(batches: Iterator[pa.RecordBatch], max_n: int) -> Iterator[pa.RecordBatch]:
    """Per batch and n: how many word n-grams, and the set of their 64-bit hashes (for distinct counts)."""
    for batch in batches:
        words = [_WORD.findall(text.lower()) for text in batch.column("text").to_pylist()]
        for n in range(1, max_n + 1):
            seen: set[int] = set()
            total = 0
            for tokens in words:
                grams = [stable_hash64(" ".join(tokens[i : i + n])) for i in range(len(tokens) - n + 1)]
                total += len(grams)
                seen.update(grams)
            yield pa.RecordBatch.from_pydict(
                {"n": [n], "total": [total], "hashes": [sorted(seen)]}, schema=NGRAM_SCHEMA
            )


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
    from sklearn.cluster import KMeans

    labels = KMeans(n_clusters=k, n_init=4, random_state=seed).fit_predict(embeddings)
    shares = np.bincount(labels, minlength=k) / count
    entropy = -sum(p * math.log(p) for p in shares if p > 0) / math.log(k)
    return {"clusters": k, "cluster_entropy": float(entropy)}


def domain_concentration(doc_counts: list[int]) -> dict[str, float | int]:
    total = sum(doc_counts)
    shares = sorted((c / total for c in doc_counts), reverse=True) if total else []
    entropy = -sum(p * math.log(p) for p in shares if p > 0)
    return {
        "domains": len(doc_counts),
        "top10_domain_share": float(sum(shares[:10])),
        "domain_entropy_normalised": float(entropy / math.log(len(shares))) if len(shares) > 1 else 0.0,
        "herfindahl_index": float(sum(p * p for p in shares)),
    }


def _plot_report(
    plots: Path, domains: list[dict], lengths: np.ndarray, embeddings: np.ndarray, emb_domains: list[str]
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots.mkdir()
    written = []

    top = domains[:20]
    figure, axis = plt.subplots(figsize=(8, max(2.5, 0.3 * len(top) + 1)))
    axis.barh(
        [row["domain"] for row in reversed(top)],
        [row["documents"] for row in reversed(top)],
        color="tab:blue",
    )
    axis.set(title="documents per domain (top 20)", xlabel="documents")
    figure.tight_layout()
    written.append(plots / "domains.png")
    figure.savefig(written[-1], dpi=90)
    plt.close(figure)

    figure, axis = plt.subplots(figsize=(7, 3.5))
    if len(lengths):
        bins = np.logspace(math.log10(max(1, lengths.min())), math.log10(max(2, lengths.max())), 40)
        axis.hist(lengths, bins=bins, color="tab:green")
        axis.set_xscale("log")
    axis.set(title="document length", xlabel="characters (log scale)", ylabel="documents")
    figure.tight_layout()
    written.append(plots / "lengths.png")
    figure.savefig(written[-1], dpi=90)
    plt.close(figure)

    figure, axis = plt.subplots(figsize=(6, 5))
    if len(embeddings) >= 3:
        centred = embeddings - embeddings.mean(axis=0)
        _, _, components = np.linalg.svd(centred, full_matrices=False)
        projected = centred @ components[:2].T
        top_names = [row["domain"] for row in domains[:8]]
        for name in [*top_names, None]:
            mask = np.array([(d if d in top_names else None) == name for d in emb_domains])
            if mask.any():
                axis.scatter(projected[mask, 0], projected[mask, 1], s=8, label=name or "other domains")
        axis.legend(fontsize=7, loc="best")
    axis.set(title="sample embeddings (PCA)", xlabel="PC1", ylabel="PC2")
    figure.tight_layout()
    written.append(plots / "embeddings_pca.png")
    figure.savefig(written[-1], dpi=90)
    plt.close(figure)
    return written


def _gate_html(verdict: dict | None) -> str:
    if not verdict or verdict["mode"] == "ignore":
        return ""
    if verdict["passed"]:
        return "<p><b>Quality gate: passed.</b></p>"
    items = "".join(f"<li>{html.escape(failure)}</li>" for failure in verdict["failures"])
    effect = "not announced for training" if verdict["mode"] == "fail" else "announced anyway (mode warn)"
    return f"<h2>Quality gate: failed, {effect}</h2><ul>{items}</ul>"


def _write_html(path: Path, snapshot: str, metrics: dict, domains: list[dict], images: list[Path]) -> None:
    rows = "".join(
        f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(json.dumps(v))}</td></tr>"
        for k, v in metrics.items()
        if k not in ("funnel", "gate")
    )
    domain_rows = "".join(
        f"<tr><td>{html.escape(row['domain'] or '')}</td><td>{row['documents']}</td><td>{row['characters']}</td></tr>"
        for row in domains[:50]
    )
    funnel_rows = "".join(
        f"<tr><td>{html.escape(step['stage'])}</td><td>{html.escape(step['reason'])}</td><td>{step['documents']}</td></tr>"
        for step in metrics.get("funnel", [])
    )
    figures = "".join(
        f'<img alt="{image.stem}" src="data:image/png;base64,{base64.b64encode(image.read_bytes()).decode()}">'
        for image in images
    )
    path.write_text(
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Data quality: {html.escape(snapshot)}</title>"
        "<style>body{font-family:sans-serif;margin:2em}td{padding:2px 12px}img{max-width:48%;margin:4px}</style>"
        f"</head><body><h1>Data quality report: {html.escape(snapshot)}</h1>"
        f"{_gate_html(metrics.get('gate'))}<h2>Drop funnel</h2><table><tr><th>stage</th><th>step</th><th>documents</th></tr>{funnel_rows}</table>"
        f"<h2>Metrics</h2><table>{rows}</table><h2>Plots</h2>{figures}"
        f"<h2>Top domains</h2><table><tr><th>domain</th><th>documents</th><th>characters</th></tr>{domain_rows}</table>"
        "</body></html>\n"
    )


@dataclass(frozen=True)
class Coverage:
    """Counts over every document."""

    documents: int
    characters: int
    domains: list[dict]  # domain, documents, characters; most documents first
    languages: dict[str, int]  # empty when the input has no ``lang`` column
    length_quantiles: list[float]  # characters at p10, p50, p90, p99


def coverage(docs: DataFrame) -> Coverage:
    from pyspark.sql import functions as F

    totals = docs.agg(F.count("*").alias("documents"), F.sum("n_chars").alias("characters")).first()
    per_domain = (
        docs.groupBy("domain")
        .agg(F.count("*").alias("documents"), F.sum("n_chars").alias("characters"))
        .orderBy(F.desc("documents"), "domain")
    )
    domains = [row.asDict() for row in per_domain.collect()]
    languages = (
        {str(r["lang"]): int(r["count"]) for r in docs.groupBy("lang").count().collect()}
        if "lang" in docs.columns
        else {}
    )
    length_quantiles = docs.agg(
        F.percentile("n_chars", F.array(*[F.lit(q) for q in (0.1, 0.5, 0.9, 0.99)])).alias("q")
    ).first()["q"]
    return Coverage(
        documents=int(totals["documents"]),
        characters=int(totals["characters"] or 0),
        domains=domains,
        languages=languages,
        length_quantiles=[float(q) for q in length_quantiles] if length_quantiles else [],
    )


def sample_documents(docs: DataFrame, config: PipelineConfig) -> DataFrame:
    """``quality.sample_docs`` documents by a seeded hash of the id (the same ones on every run), cached:
    the lexical and semantic views both read it."""
    from pyspark.sql import functions as F

    return (
        docs.withColumn("order", F.xxhash64(F.lit(config.project.seed), "id"))
        .orderBy("order", "id")
        .limit(config.quality.sample_docs)
        .select("id", "domain", "text")
        .repartition(config.spark.shuffle_partitions, "id")
        .cache()
    )


def lexical_diversity(sample: DataFrame, max_n: int = 2) -> dict[str, float | None]:
    """Distinct word n-grams over all n-grams of the sample, for n = 1..max_n."""
    from pyspark.sql import functions as F

    ngram_rows = sample.select("text").mapInArrow(
        functools.partial(ngram_batches, max_n=max_n), spark_schema(NGRAM_SCHEMA)
    )
    distinct = (
        ngram_rows.select("n", "total", F.explode("hashes").alias("h"))
        .groupBy("n")
        .agg(F.countDistinct("h").alias("distinct"))
        .join(ngram_rows.groupBy("n").agg(F.sum("total").alias("total")), "n")
        .collect()
    )
    return {
        f"distinct_{row.n}gram_ratio": row.distinct / row.total if row.total else None for row in distinct
    }


def embed_sample(sample: DataFrame, encoder: EncoderConfig) -> tuple[list[str], list[str], np.ndarray]:
    """(ids, domains, embeddings) of the sample, sorted by id; embedded in the Spark workers."""
    embedded = sample.mapInArrow(
        functools.partial(embed_batches, config=encoder, keep=("id", "domain")),
        spark_schema(EMBEDDED_SCHEMA),
    )
    rows = sorted(embedded.collect(), key=lambda row: row.id)
    embeddings = np.array([row.embedding for row in rows], dtype=np.float32).reshape(len(rows), -1)
    return [row.id for row in rows], [row.domain for row in rows], embeddings


def write_tables(
    folder: Path, domains: list[dict], ids: list[str], emb_domains: list[str], embeddings: np.ndarray
) -> None:
    pq.write_table(pa.Table.from_pylist(domains), folder / "domains.parquet")
    pq.write_table(
        pa.table(
            {
                "id": ids,
                "domain": emb_domains,
                "embedding": pa.FixedSizeListArray.from_arrays(
                    pa.array(embeddings.ravel()), embeddings.shape[1]
                ),
            }
        ),
        folder / "embeddings.parquet",
    )


def run(config: PipelineConfig, inputs: list[DatasetRef], output: DatasetRef) -> Manifest:
    (documents_ref,) = inputs
    quality = config.quality
    with StageOutput(output, config, inputs) as out:
        spark = spark_session(config, f"quality-{output.corpus}-{output.snapshot}")
        from pyspark.sql import functions as F

        docs = spark.read.parquet(str(documents_ref.path / "documents")).withColumn(
            "n_chars", F.length("text")
        )
        covered = coverage(docs)

        sample = sample_documents(docs, config)
        lengths = np.array(
            [row.n for row in sample.select(F.length("text").alias("n")).collect()], dtype=np.int64
        )
        lexical = lexical_diversity(sample)
        ids, emb_domains, embeddings = embed_sample(sample, quality.encoder)
        sample.unpersist()

        metrics = {
            "documents": covered.documents,
            "characters": covered.characters,
            "sampled_documents": len(ids),
            "length_p10_p50_p90_p99": covered.length_quantiles,
            "languages": covered.languages,
            **domain_concentration([row["documents"] for row in covered.domains]),
            **lexical,
            **cosine_statistics(embeddings),
            **cluster_entropy(embeddings, quality.clusters, config.project.seed),
        }
        steps = funnel(documents_ref.manifest())
        metrics["funnel"] = as_rows(steps)
        verdict = gate.evaluate(quality.gate, metrics, steps)
        metrics["gate"] = verdict
        if not verdict["passed"]:
            log.warning(
                "quality gate (%s): %s%s",
                verdict["mode"],
                "; ".join(verdict["failures"]),
                ": this snapshot's token shards will not be announced" if verdict["mode"] == "fail" else "",
            )
        (out.path / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
        write_tables(out.path, covered.domains, ids, emb_domains, embeddings)
        images = _plot_report(out.path / "plots", covered.domains, lengths, embeddings, emb_domains)
        images.append(plot_waterfall(steps, out.path / "plots" / "funnel.png"))
        _write_html(out.path / "report.html", output.snapshot, metrics, covered.domains, images)
        log.info(
            "quality: %d documents, %d domains, mean pairwise cosine %s",
            metrics["documents"],
            metrics["domains"],
            metrics["mean_pairwise_cosine"],
        )
        return out.commit(
            rows={"documents": metrics["documents"], "sampled": len(ids)},
            extra={"metrics": metrics, "gate": verdict},
        )
