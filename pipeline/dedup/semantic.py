"""Semantic dedup (SemDeDup, Abbas et al. 2023): documents that say the same thing in other words.

Runs on the documents URL, exact and near dedup kept, all in Spark:

1. ``embed``    every document's sentence embedding in the workers (``mapInArrow`` over
                ``pipeline.embeddings.embed_batches``), unit length, persisted: the costly step;
2. ``kmeans``   Spark MLlib k-means on the embeddings (cosine distance, seeded from ``project.seed``),
                k = ``clusters`` or ceil(sqrt(documents));
3. ``removal``  per cluster (``groupBy(cluster).applyInArrow``) the pairwise cosines and the rule below.

The rule (``semantic_removals``): within a cluster, documents are taken in id order; a document is removed
when its cosine with an already kept document of the cluster is above the threshold, and its representative
is the kept document it is most similar to (ties: the smaller id). Every removed document therefore points at
a kept one with cosine > threshold, and the result depends only on the ids and the cluster assignment.
(The paper keeps the document farthest from its centroid instead; by id matches the rest of this stage.)

Memory: a cluster of m documents is compared in blocks of ``BLOCK_ROWS`` rows, so no m x m matrix exists;
the worker holds the cluster's m embeddings and a ``BLOCK_ROWS`` x m block. Clusters above
``max_cluster_size`` stop the stage before the pairwise pass, naming the size, instead of running a worker
out of memory.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from pipeline.core.spark import aggregate, map_in_arrow, spark_schema
from pipeline.dedup.config import SemanticConfig
from pipeline.embeddings import embed_batches, embedded_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipeline.core.progress import StepClock

log = logging.getLogger(__name__)
SEMANTIC_DUPLICATE = "semantic_duplicate"
BLOCK_ROWS = 1024
CLUSTER_SCHEMA = pa.schema([("id", pa.string()), ("cluster", pa.int32())])
REMOVAL_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("representative_id", pa.string()),
        ("cosine", pa.float64()),
        ("cluster", pa.int32()),
    ]
)


class SemanticClusterTooLarge(RuntimeError):
    """A k-means cluster is larger than dedup.semantic.max_cluster_size."""


def semantic_removals(
    ids: Sequence[str], vectors: np.ndarray, threshold: float, block_rows: int = BLOCK_ROWS
) -> tuple[list[int], list[int], list[float]]:
    """(removed, representative, cosine): positions into ``ids`` of the removed documents, of the kept
    document each one stays for, and their cosine. ``vectors`` are unit-length rows."""
    order = sorted(range(len(ids)), key=ids.__getitem__)
    unit = np.asarray(vectors, dtype=np.float64)[order]
    dim = unit.shape[1] if unit.ndim == 2 else 0
    kept = np.empty((0, dim))  # kept vectors so far, in id order
    kept_at: list[int] = []  # their positions in ``order``
    removed, representatives, cosines = [], [], []
    for start in range(0, len(order), block_rows):
        block = unit[start : start + block_rows]
        if kept_at:
            earlier = block @ kept.T
            earlier_best = earlier.argmax(axis=1)  # first maximum: the smaller id on ties
            earlier_cos = earlier[np.arange(len(block)), earlier_best]
        else:
            earlier_best = np.zeros(len(block), dtype=np.int64)
            earlier_cos = np.full(len(block), -np.inf)
        within = block @ block.T
        block_kept: list[int] = []
        for row in range(len(block)):
            best_cos, best = earlier_cos[row], (kept_at[earlier_best[row]] if kept_at else -1)
            if block_kept:
                candidates = within[row, block_kept]
                top = int(candidates.argmax())
                # Strictly greater: on a tie the earlier block's document, which has the smaller id, wins.
                if candidates[top] > best_cos:
                    best_cos, best = candidates[top], start + block_kept[top]
            if best_cos > threshold:
                removed.append(order[start + row])
                representatives.append(order[best])
                cosines.append(float(best_cos))
            else:
                block_kept.append(row)
        kept = np.vstack([kept, block[block_kept]])
        kept_at.extend(start + row for row in block_kept)
    return removed, representatives, cosines


def cluster_removals(table: pa.Table, threshold: float) -> pa.Table:
    """For ``applyInArrow``: one cluster's (id, cluster, embedding) rows in, its removed documents out."""
    if table.num_rows < 2:
        return REMOVAL_SCHEMA.empty_table()
    ids = table.column("id").to_pylist()
    embeddings = table.column("embedding").combine_chunks()
    vectors = embeddings.flatten().to_numpy(zero_copy_only=False).reshape(table.num_rows, -1)
    removed, representatives, cosines = semantic_removals(ids, vectors, threshold)
    cluster = table.column("cluster")[0].as_py()
    return pa.table(
        {
            "id": pa.array([ids[i] for i in removed], pa.string()),
            "representative_id": pa.array([ids[i] for i in representatives], pa.string()),
            "cosine": pa.array(cosines, pa.float64()),
            "cluster": pa.array([cluster] * len(removed), pa.int32()),
        },
        schema=REMOVAL_SCHEMA,
    )


def semantic_duplicates(
    texts: DataFrame, semantic: SemanticConfig, seed: int, layout_files: int, clock: StepClock
) -> tuple[DataFrame | None, DataFrame | None, dict, dict]:
    """(id, representative_id, cosine, cluster) of every document ``texts`` (id, text) loses to semantic
    dedup and (id, cluster) of every document embedded, both cached (None when fewer than two documents),
    plus manifest counters and ``extra.semantic``.

    ``layout_files`` fixes the partitioning k-means sees (by a hash of id, sorted by id), so its seeded
    sampling does not depend on how the input happened to be split.
    """
    from pyspark import StorageLevel
    from pyspark.ml.clustering import KMeans
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    embedded = map_in_arrow(
        texts.repartition(layout_files, "id").sortWithinPartitions("id"),
        functools.partial(embed_batches, config=semantic.encoder, keep=("id",)),
        spark_schema(embedded_schema(("id",))),
    ).persist(StorageLevel.MEMORY_AND_DISK)
    documents = embedded.count()
    clock.done("semantic.embed", "%d documents embedded with %s", documents, semantic.encoder.model)
    embed_seconds = clock.seconds["semantic.embed"]
    docs_per_second = round(documents / embed_seconds, 2) if embed_seconds else None
    k = min(semantic.clusters or math.ceil(math.sqrt(documents)), documents)
    counters = {
        "semantic_documents": documents,
        "semantic_k": k,
        "semantic_largest_cluster": 0,
        "semantic_pairs": 0,
        "semantic_kmeans_iterations": 0,
    }
    extra = {
        "model": semantic.encoder.model,
        "threshold": semantic.threshold,
        "clusters": k,
        "embed_docs_per_second": docs_per_second,
    }
    if documents < 2:
        embedded.unpersist()
        return None, None, counters, extra

    if k > 1:
        vectors = embedded.withColumn("features", array_to_vector(F.col("embedding")))
        kmeans = KMeans(
            k=k,
            seed=seed,
            maxIter=semantic.max_iterations,
            distanceMeasure="cosine",
            featuresCol="features",
            predictionCol="cluster",
        )
        model = kmeans.fit(vectors)
        counters["semantic_kmeans_iterations"] = int(model.summary.numIter)
        assigned = model.transform(vectors).select("id", F.col("cluster").cast("int"), "embedding")
    else:
        assigned = embedded.select("id", F.lit(0).alias("cluster"), "embedding")
    assigned = assigned.persist(StorageLevel.MEMORY_AND_DISK)
    clusters = assigned.select("id", "cluster").persist(StorageLevel.MEMORY_AND_DISK)
    sizes = aggregate(
        clusters.groupBy("cluster").count(),
        F.max("count").alias("largest"),
        F.sum(F.col("count") * (F.col("count") - 1) / 2).alias("pairs"),
    )
    embedded.unpersist()
    counters["semantic_largest_cluster"] = int(sizes["largest"])
    counters["semantic_pairs"] = int(sizes["pairs"])
    clock.done(
        "semantic.kmeans",
        "k=%d in %d iteration(s), largest cluster %d, %d pairs to compare",
        k,
        counters["semantic_kmeans_iterations"],
        counters["semantic_largest_cluster"],
        counters["semantic_pairs"],
    )
    if counters["semantic_largest_cluster"] > semantic.max_cluster_size:
        assigned.unpersist()
        clusters.unpersist()
        raise SemanticClusterTooLarge(
            f"a k-means cluster has {counters['semantic_largest_cluster']} documents, more than "
            f"dedup.semantic.max_cluster_size={semantic.max_cluster_size}; raise dedup.semantic.clusters "
            f"(now {k}) or max_cluster_size (the worker holds the cluster's embeddings)"
        )

    threshold = semantic.threshold

    # A function, not a functools.partial: pyspark 4.2's applyInArrow reads the argument spec of what it is
    # given and fails on a partial (UnboundLocalError in GroupedData.applyInArrow).
    def removals_of(cluster: pa.Table) -> pa.Table:
        return cluster_removals(cluster, threshold)

    removals = (
        assigned.groupBy("cluster")
        .applyInArrow(removals_of, spark_schema(REMOVAL_SCHEMA))
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    removed = removals.count()
    assigned.unpersist()
    clock.done(
        "semantic.removal", "%d documents above cosine %.3f with a kept one", removed, semantic.threshold
    )
    return removals, clusters, counters, extra
