"""The dedup stage as a Spark job: clean documents in, unique documents, duplicates and exclusions out.

Steps (datatrove style: each one only decides and counts, rows are split at the end):

1. ``features``    one Python pass over Arrow batches: page key of the URL, exact key (BLAKE2b-128 of the
                   normalised text), shingle counts and the LSH band keys of the MinHash signature;
2. ``url_dedup``   per page key keep the newest fetch (then the smallest id)           -> url_duplicate
3. ``exact_dedup`` per exact key keep the smallest id                                 -> exact_duplicate
4. ``near_dedup``  band collisions among exact survivors link each member to its bucket's smallest id
                   (n - 1 links per bucket, never n^2 pairs), links are verified with the true Jaccard,
                   then connected components (large-star / small-star) give each document its
                   component's smallest id                                            -> near_duplicate
   ``semantic``    only with dedup.semantic.enabled: embed the survivors, k-means, and within each cluster
                   drop documents above a cosine threshold with an earlier kept one   -> semantic_duplicate
                   (pipeline.dedup.semantic)
5. ``split``       kept rows to ``documents/``, removed rows with their reason to ``excluded/``, every
                   member of a cluster to ``duplicates/`` with its exact Jaccard to the representative.

A removed document's representative is the document that stays for it: its URL's newest fetch, that
one's exact-duplicate group minimum, that one's near-duplicate component minimum, and that one's semantic
representative, in this order.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config import PipelineConfig
from pipeline.core.manifest import Manifest
from pipeline.core.progress import StepClock
from pipeline.core.spark import (
    aggregate,
    map_in_arrow,
    spark_schema,
    spark_session,
    write_parquet,
    write_parquet_parts,
)
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.dedup.components import connected_components
from pipeline.dedup.config import DedupConfig
from pipeline.dedup.history import (
    EARLIER,
    EARLIER_DUPLICATE,
    KEYS,
    MATCHES_SCHEMA,
    earlier_duplicates,
    history_gaps,
    keys_settings,
    load_history,
    snapshot_keys,
)
from pipeline.dedup.lsh import optimal_bands_rows, plot_s_curve, s_curve_table
from pipeline.dedup.minhash import MinHasher, jaccard_pairs
from pipeline.dedup.semantic import CLUSTER_SCHEMA, REMOVAL_SCHEMA, SEMANTIC_DUPLICATE, semantic_duplicates
from pipeline.dedup.urls import page_key
from pipeline.documents.shingles import normalize_for_dedup
from pipeline.documents.split import split_parts

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

log = logging.getLogger(__name__)
STAGE = "dedup"
URL_DUPLICATE = "url_duplicate"
EXACT_DUPLICATE = "exact_duplicate"
NEAR_DUPLICATE = "near_duplicate"
NULL_TEXT = "null_text"
# Every drop_reason a decision can carry, in the order the rules apply.
DROP_REASONS = (URL_DUPLICATE, EXACT_DUPLICATE, NEAR_DUPLICATE, SEMANTIC_DUPLICATE, EARLIER_DUPLICATE)

FEATURES_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("has_text", pa.bool_()),
        ("page_key", pa.string()),
        ("exact_key", pa.binary()),
        ("n_bytes", pa.int64()),
        ("n_chars", pa.int64()),
        ("n_tokens", pa.int64()),
        ("n_shingles", pa.int64()),
        ("band_keys", pa.list_(pa.int64())),
    ]
)
SIMILARITY_SCHEMA = pa.schema([("src", pa.string()), ("dst", pa.string()), ("similarity", pa.float64())])


class DedupInputError(ValueError):
    """The input breaks the contract this stage relies on (unique non-null ids, required columns)."""


def minhasher(dedup: DedupConfig, seed: int) -> MinHasher:
    if dedup.bands is not None and dedup.rows is not None:
        bands, rows = dedup.bands, dedup.rows
    else:
        bands, rows = optimal_bands_rows(
            dedup.threshold, dedup.num_perm, dedup.false_positive_weight, dedup.false_negative_weight
        )
    return MinHasher(dedup.ngram_size, dedup.cjk_ngram_size, bands, rows, seed)


def _exact_keys(normalized: pa.Array, texts: pa.Array) -> list[bytes]:
    """BLAKE2b-128 of the normalised text; a text with no token at all is keyed by its raw bytes instead."""
    keys = []
    for norm, raw in zip(normalized.to_pylist(), texts.to_pylist(), strict=True):
        payload = b"n" + norm.encode() if norm else b"r" + (raw or "").encode()
        keys.append(hashlib.blake2b(payload, digest_size=16).digest())
    return keys


def feature_batches(
    batches: Iterator[pa.RecordBatch], hasher: MinHasher, with_urls: bool, with_bands: bool
) -> Iterator[pa.RecordBatch]:
    """FEATURES_SCHEMA for each batch of (id, text[, url, fetch_time]); fetch_time passes through."""
    for batch in batches:
        texts = batch.column("text")
        normalized = normalize_for_dedup(texts)
        shingles = hasher.shingles_of_normalized(normalized)
        counts = shingles.counts
        if with_bands:
            keys = hasher.band_keys(hasher.signatures(shingles)).view(np.int64)
            offsets = np.arange(0, keys.size + 1, keys.shape[1], dtype=np.int32)
            bands = pa.ListArray.from_arrays(offsets, pa.array(keys.ravel(), pa.int64()))
            # A document without shingles has no signature: leave it out of LSH rather than collide.
            bands = pc.if_else(pa.array(counts > 0), bands, pa.scalar(None, bands.type))
        else:
            bands = pa.nulls(len(batch), pa.list_(pa.int64()))
        urls = (
            pa.array([page_key(u) for u in batch.column("url").to_pylist()], pa.string())
            if with_urls
            else pa.nulls(len(batch), pa.string())
        )
        columns = [
            batch.column("id"),
            pc.is_valid(texts),
            urls,
            pa.array(_exact_keys(normalized, texts), pa.binary()),
            pc.fill_null(pc.binary_length(texts), 0).cast(pa.int64()),
            pc.fill_null(pc.utf8_length(texts.cast(pa.string())), 0).cast(pa.int64()),
            pa.array(shingles.tokens, pa.int64()),
            pa.array(counts, pa.int64()),
            bands,
        ]
        schema = FEATURES_SCHEMA
        if with_urls:
            columns.append(batch.column("fetch_time"))
            schema = schema.append(batch.schema.field("fetch_time"))
        yield pa.RecordBatch.from_arrays(columns, schema=schema)


def similarity_batches(batches: Iterator[pa.RecordBatch], hasher: MinHasher) -> Iterator[pa.RecordBatch]:
    """Exact Jaccard of (src text, dst text) for each row, vectorised over the batch."""
    for batch in batches:
        similarity = jaccard_pairs(
            hasher.shingles(batch.column("src_text")), hasher.shingles(batch.column("dst_text"))
        )
        yield pa.RecordBatch.from_arrays(
            [batch.column("src"), batch.column("dst"), pa.array(similarity, pa.float64())],
            schema=SIMILARITY_SCHEMA,
        )


def pair_similarity(pairs: DataFrame, texts: DataFrame, hasher: MinHasher) -> DataFrame:
    """(src, dst, similarity) for (src, dst) pairs, looking both texts up in ``texts`` (id, text)."""
    from pyspark.sql import functions as F

    # Only the texts of documents in some pair travel through the two joins; the id list is small enough
    # for Spark to broadcast, so the corpus itself is scanned but not shuffled.
    ids = (
        pairs.select(F.col("src").alias("id")).unionByName(pairs.select(F.col("dst").alias("id"))).distinct()
    )
    needed = texts.join(ids, "id", "left_semi")
    with_texts = pairs.join(
        needed.select(F.col("id").alias("src"), F.col("text").alias("src_text")), "src"
    ).join(needed.select(F.col("id").alias("dst"), F.col("text").alias("dst_text")), "dst")
    return map_in_arrow(
        with_texts.select("src", "dst", "src_text", "dst_text"),
        lambda batches: similarity_batches(batches, hasher),
        spark_schema(SIMILARITY_SCHEMA),
    )


def near_duplicates(
    candidates: DataFrame, texts: DataFrame, hasher: MinHasher, dedup: DedupConfig, clock: StepClock
) -> tuple[DataFrame | None, DataFrame | None, dict]:
    """(node, root) for every document of ``candidates`` (id, band_keys) in a verified cluster of 2+, or None
    when no two documents share a band bucket.

    Also returns the cached scored pairs the roots derive from; unpersist both once the roots are used.
    """
    from pyspark.sql import functions as F

    members = candidates.where(F.col("band_keys").isNotNull()).select(
        "id", F.posexplode("band_keys").alias("band", "bucket")
    )
    # Link each member to the smallest id of its bucket: a bucket of n documents gives n - 1 links.
    buckets = (
        members.groupBy("band", "bucket")
        .agg(F.min("id").alias("head"), F.count(F.lit(1)).alias("size"))
        .where(F.col("size") > 1)
    )
    links = (
        members.join(buckets, ["band", "bucket"])
        .where(F.col("id") != F.col("head"))
        .groupBy(F.col("id").alias("src"), F.col("head").alias("dst"))
        .agg(F.max("size").alias("bucket_size"))
        .cache()
    )
    # Counted before any text is read: with no collision at all (common on a small snapshot) there is
    # nothing to verify and no graph, so neither the Python scoring pass nor the components' jobs run.
    stats = aggregate(links, F.count(F.lit(1)).alias("pairs"), F.max("bucket_size").alias("largest_bucket"))
    candidate_pairs, largest_bucket = int(stats["pairs"]), int(stats["largest_bucket"] or 0)
    if not candidate_pairs:
        links.unpersist()
        clock.done("near_dedup.candidates", "no candidate pairs from band collisions")
        return None, None, near_counters(0, 0, 0, 0)
    if dedup.verify:
        scored = (
            pair_similarity(links.select("src", "dst"), texts, hasher).join(links, ["src", "dst"]).cache()
        )
        edges = scored.where(F.col("similarity") >= dedup.threshold)
        verified = int(aggregate(edges, F.count(F.lit(1)).alias("n"))["n"])
        links.unpersist()
    else:
        scored, edges, verified = (
            links,
            links,
            candidate_pairs,
        )  # the cached links are what the roots derive from
    clock.done(
        "near_dedup.candidates",
        "%d candidate pairs from band collisions, %d verified (Jaccard >= %.2f)",
        candidate_pairs,
        verified,
        dedup.threshold,
    )
    roots, rounds = connected_components(edges, "src", "dst", dedup.max_iterations)
    roots = roots.cache()
    clock.done("near_dedup.components", "large-star/small-star converged after %d round(s)", rounds)
    return roots, scored, near_counters(candidate_pairs, verified, largest_bucket, rounds)


def near_counters(candidate_pairs: int, verified: int, largest_bucket: int, rounds: int) -> dict:
    return {
        "candidate_pairs": candidate_pairs,
        "verified_pairs": verified,
        "rejected_by_verification": candidate_pairs - verified,
        "largest_bucket": largest_bucket,
        "components_rounds": rounds,
    }


def _check_input(docs: DataFrame, dedup: DedupConfig) -> None:
    missing = [name for name in ("id", "text") if name not in docs.columns]
    if dedup.url_dedup:
        missing += [name for name in ("url", "fetch_time") if name not in docs.columns]
    if missing:
        hint = " (or set dedup.url_dedup=false)" if {"url", "fetch_time"} & set(missing) else ""
        raise DedupInputError(f"input documents lack column(s) {missing}{hint}; found {docs.columns}")
    if "drop_reason" in docs.columns:
        raise DedupInputError("input documents already have a drop_reason column; pass kept documents only")


@dataclass
class HashedCount:
    """Documents through MinHash in one run, counted in the driver from each pass's row count."""

    value: int = 0

    def add(self, documents: int) -> None:
        self.value += documents


def document_features(
    docs: DataFrame,
    hasher: MinHasher,
    dedup: DedupConfig,
    clock: StepClock,
    hashed: HashedCount | None = None,
) -> tuple[DataFrame, int, dict]:
    """Features of every input row, persisted, and the input checks done in the same pass. Every row goes
    through MinHash once, so the pass's row count is what it adds to ``hashed``."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    projected = docs.select("id", "text", *(["url", "fetch_time"] if dedup.url_dedup else []))
    schema = spark_schema(FEATURES_SCHEMA)
    if dedup.url_dedup:
        schema = schema.add(projected.schema["fetch_time"])
    features = map_in_arrow(
        projected,
        lambda batches: feature_batches(batches, hasher, dedup.url_dedup, dedup.near),
        schema,
    ).persist(StorageLevel.MEMORY_AND_DISK)
    stats = aggregate(
        features,
        F.count(F.lit(1)).alias("rows"),
        F.count("id").alias("with_id"),
        F.countDistinct("id").alias("distinct_ids"),
        F.count(F.when(~F.col("has_text"), 1)).alias("null_text"),
        F.count(F.when(F.col("has_text") & (F.col("n_tokens") == 0), 1)).alias("no_tokens"),
        F.count(F.when(F.col("n_shingles") == 1, 1)).alias("one_shingle"),
    )
    if stats["with_id"] != stats["rows"]:
        features.unpersist()
        raise DedupInputError(
            f"{stats['rows'] - stats['with_id']} input row(s) have a null id; ids must be stable hashes"
        )
    if stats["distinct_ids"] != stats["rows"]:
        features.unpersist()
        raise DedupInputError(
            f"{stats['rows'] - stats['distinct_ids']} input row(s) repeat another row's id; "
            "ids must be unique (one row per URL, as the clean stage writes)"
        )
    if hashed is not None:
        hashed.add(int(stats["rows"]))
    counters = {
        "input_documents": int(stats["rows"]),
        "documents_without_tokens": int(stats["no_tokens"]),
        "documents_with_one_shingle": int(stats["one_shingle"]),
    }
    clock.done(
        "features",
        "%d documents (%d null text, %d without tokens, %d shorter than an n-gram)",
        stats["rows"],
        stats["null_text"],
        stats["no_tokens"],
        stats["one_shingle"],
    )
    return features, int(stats["null_text"]), counters


def decide(
    docs: DataFrame,
    features: DataFrame,
    hasher: MinHasher,
    dedup: DedupConfig,
    clock: StepClock,
    seed: int,
    layout_files: int,
    documents_with_text: int,
) -> tuple[DataFrame, dict, tuple[DataFrame | None, DataFrame | None], dict, list[DataFrame]]:
    """(id, drop_reason, representative_id, n_bytes, n_chars, same_text) for every document with text, and step
    counters; with semantic dedup on, also its (removals, cluster assignments) (pipeline.dedup.semantic) and extra.

    ``documents_with_text``: how many of ``features``' rows have text (``document_features`` counted them). The
    decisions come back persisted but not yet computed, with the cached frames they derive from: release
    those (``release``) once an action has read the decisions, not before (they would be computed again)."""
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    with_text = features.where(F.col("has_text"))
    if dedup.url_dedup:
        # Newest fetch per page key, ties to the smallest id. A document without a usable URL is a
        # group of its own (keyed by its id: page keys start with "//", so the keys cannot clash,
        # and such documents do not pile up in one window partition).
        group = F.coalesce(F.col("page_key"), F.concat(F.lit("id:"), F.col("id")))
        newest_first = Window.partitionBy(group).orderBy(F.col("fetch_time").desc_nulls_last(), "id")
        step = with_text.withColumn("url_rep", F.first("id").over(newest_first))
    else:
        step = with_text.withColumn("url_rep", F.col("id"))
    step = step.select("id", "url_rep", "exact_key", "band_keys", "n_bytes", "n_chars")
    survivors = step.where(F.col("url_rep") == F.col("id"))
    if dedup.exact:
        survivors = survivors.withColumn("exact_rep", F.min("id").over(Window.partitionBy("exact_key")))
    else:
        survivors = survivors.withColumn("exact_rep", F.col("id"))
    # Filled by the first action that reads it (near dedup's, or else the caller's first over the decisions):
    # an action of its own here would only count rows, which the summary's per-reason counts already tell.
    survivors = survivors.select("id", "exact_rep", "band_keys").persist(StorageLevel.MEMORY_AND_DISK)

    counters: dict = {}
    roots: DataFrame | None = None
    scored: DataFrame | None = None
    # Every document with text survives URL dedup or points to one that does, and every exact-duplicate
    # group keeps its smallest id: some document is left for near dedup exactly when some has text.
    if dedup.near and documents_with_text:
        texts = docs.where(F.col("text").isNotNull()).select("id", "text")
        roots, scored, counters = near_duplicates(
            survivors.where(F.col("exact_rep") == F.col("id")), texts, hasher, dedup, clock
        )
    if roots is not None:
        final = survivors.join(roots, survivors["exact_rep"] == roots["node"], "left").select(
            "id", "exact_rep", F.coalesce("root", "exact_rep").alias("near_rep")
        )
    else:
        final = survivors.select("id", "exact_rep", F.col("exact_rep").alias("near_rep"))

    semantic = assignments = None
    semantic_extra: dict = {}
    if dedup.semantic.enabled:
        unique = final.where(F.col("near_rep") == F.col("id")).select("id")
        texts = docs.where(F.col("text").isNotNull()).select("id", "text").join(unique, "id", "left_semi")
        semantic, assignments, semantic_counters, semantic_extra = semantic_duplicates(
            texts, dedup.semantic, seed, layout_files, clock
        )
        counters.update(semantic_counters)
    if semantic is not None:
        # A semantic representative is always kept, so one hop resolves every chain.
        final = final.join(
            semantic.select(F.col("id").alias("near_rep"), F.col("representative_id").alias("semantic_rep")),
            "near_rep",
            "left",
        ).select("id", "exact_rep", "near_rep", F.coalesce("semantic_rep", "near_rep").alias("final_rep"))
    else:
        final = final.withColumn("final_rep", F.col("near_rep"))

    resolved = step.select("id", "url_rep", "n_bytes", "n_chars").join(
        final.select(F.col("id").alias("url_rep"), "exact_rep", "near_rep", "final_rep"), "url_rep"
    )
    decisions = resolved.select(
        "id",
        F.when(F.col("url_rep") != F.col("id"), F.lit(URL_DUPLICATE))
        .when(F.col("exact_rep") != F.col("id"), F.lit(EXACT_DUPLICATE))
        .when(F.col("near_rep") != F.col("id"), F.lit(NEAR_DUPLICATE))
        .when(F.col("final_rep") != F.col("id"), F.lit(SEMANTIC_DUPLICATE))
        .alias("drop_reason"),
        F.col("final_rep").alias("representative_id"),
        "n_bytes",
        "n_chars",
        # An exact duplicate whose representative is its exact group's minimum has that one's normalised text
        # (the group's key is its hash), so their Jaccard is 1.0: duplicates_table need not compare them.
        (
            (F.col("url_rep") == F.col("id"))
            & (F.col("exact_rep") != F.col("id"))
            & (F.col("final_rep") == F.col("exact_rep"))
        ).alias("same_text"),
    ).persist(StorageLevel.MEMORY_AND_DISK)
    # No action to fill it here: the caller's next one reads it anyway (a count would cost its own jobs and
    # round trip), and releases what it derives from once it is filled.
    upstream = [frame for frame in (survivors, roots, scored) if frame is not None]
    clock.done("decide", "every document has its representative (planned)")
    return decisions, counters, (semantic, assignments), semantic_extra, upstream


def release(frames: list[DataFrame]) -> None:
    """Unpersist ``frames`` (the cached inputs of a persisted frame, once an action has filled it)."""
    for frame in frames:
        frame.unpersist()


def duplicates_table(decisions: DataFrame, texts: DataFrame, hasher: MinHasher, to_score: int) -> DataFrame:
    """Every member of every cluster: removed documents, and the representative each one points to.

    ``to_score``: how many removed rows are not ``same_text`` (``_summary`` counts them); with none, no text is
    read and no Python pass runs."""
    from pyspark.sql import functions as F

    removed = decisions.where(F.col("drop_reason").isNotNull())
    # Only pairs whose texts may differ are read and shingled again; an exact duplicate of its representative
    # is 1.0 (what jaccard_pairs gives two equal shingle sets, empty ones included).
    pairs = removed.select(F.col("id").alias("src"), F.col("representative_id").alias("dst"), "same_text")
    scored = pairs.where(F.col("same_text")).select("src", "dst", F.lit(1.0).alias("similarity"))
    if to_score:
        scored = pair_similarity(
            pairs.where(~F.col("same_text")).select("src", "dst"), texts, hasher
        ).unionByName(scored)
    members = removed.select("id", "representative_id", "drop_reason").join(
        scored.select(F.col("src").alias("id"), "similarity"), "id"
    )
    heads = (
        removed.select(F.col("representative_id").alias("id"))
        .distinct()
        .select(
            "id",
            F.col("id").alias("representative_id"),
            F.lit(None).cast("string").alias("drop_reason"),
            F.lit(1.0).alias("similarity"),
        )
    )
    return members.unionByName(heads).select(
        "id",
        F.col("representative_id").alias("cluster_id"),
        "representative_id",
        "similarity",
        "drop_reason",
    )


def _summary(decisions: DataFrame, null_text: int) -> tuple[dict, int]:
    """Documents and bytes per reason, and cluster counts, from the (small) decisions table in one job's pass:
    grouped by cluster (a removed document's representative; every other row in one null group), then summed.
    Also how many cluster members ``duplicates_table`` must compare by text (those not ``same_text``)."""
    from pyspark.sql import functions as F

    reason = F.col("drop_reason")
    outcomes = {
        "kept": reason.isNull(),
        **{name: reason == F.lit(name) for name in DROP_REASONS},
    }
    in_cluster = reason.isNotNull() & (reason != F.lit(EARLIER_DUPLICATE))
    measures = {"documents": F.lit(1), "bytes": F.col("n_bytes"), "chars": F.col("n_chars")}
    per_cluster = decisions.groupBy(F.when(in_cluster, F.col("representative_id")).alias("cluster")).agg(
        F.count(F.lit(1)).alias("members"),
        F.count(F.when(in_cluster & ~F.col("same_text"), 1)).alias("to_score"),
        *[
            F.sum(F.when(where, value)).alias(f"{outcome}_{measure}")
            for outcome, where in outcomes.items()
            for measure, value in measures.items()
        ],
    )
    totals = aggregate(
        per_cluster,
        F.sum("members").alias("rows"),
        F.count("cluster").alias("clusters"),
        F.max(F.when(F.col("cluster").isNotNull(), F.col("members"))).alias("largest"),
        F.sum("to_score").alias("to_score"),
        *[
            F.sum(f"{outcome}_{measure}").alias(f"{outcome}_{measure}")
            for outcome in outcomes
            for measure in measures
        ],
    )
    per_reason = {
        outcome: tuple(int(totals[f"{outcome}_{measure}"] or 0) for measure in measures)
        for outcome in outcomes
        if totals[f"{outcome}_documents"]
    }
    if sum(counts[0] for counts in per_reason.values()) != (totals["rows"] or 0):
        raise RuntimeError(f"dedup decisions carry a drop_reason outside {DROP_REASONS}")
    if null_text:
        per_reason[NULL_TEXT] = (null_text, 0, 0)
    clusters = {"clusters": totals["clusters"], "largest": totals["largest"]}
    kept_documents, kept_bytes, kept_chars = per_reason.pop("kept", (0, 0, 0))
    dropped = {reason: per_reason[reason][0] for reason in sorted(per_reason)}
    dropped_bytes = {reason: per_reason[reason][1] for reason in sorted(per_reason)}
    dropped_chars = {reason: per_reason[reason][2] for reason in sorted(per_reason)}
    n_clusters = int(clusters["clusters"] or 0)
    counters = {
        "kept": kept_documents,
        "kept_bytes": kept_bytes,
        "dropped": dropped,
        "dropped_bytes": dropped_bytes,
        "removed_documents": sum(dropped.values()),
        "removed_bytes": sum(dropped_bytes.values()),
        # Characters, as clean counts them, so the drop funnel carries them from stage to stage.
        "input_chars": kept_chars + sum(dropped_chars.values()),
        "kept_chars": kept_chars,
        "dropped_chars": dropped_chars,
        "clusters": n_clusters,
        # Removed members plus the representative.
        "largest_cluster": int(clusters["largest"]) + 1 if n_clusters else 0,
    }
    return counters, int(totals["to_score"] or 0)


def drop_earlier_duplicates(
    config: PipelineConfig,
    output: DatasetRef,
    input_stage: str,
    hasher: MinHasher,
    clock: StepClock,
    decisions: DataFrame,
    docs: DataFrame,
    folder: Path,
    hashed: HashedCount,
) -> tuple[DataFrame, int, dict, dict]:
    """(decisions with the cross-snapshot drops and their earlier_snapshot/earlier_id, matches written, counts,
    what the history leaves out): the documents this snapshot keeps on its own (``folder``/keys) against the
    earlier snapshots ``dedup.against`` names (pipeline.dedup.history); the matches go to
    ``folder``/earlier_duplicates."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    dedup, seed, files = config.dedup, config.project.seed, config.spark.output_files
    against = dedup.against
    assert against is not None, "the caller runs this only when dedup.against names earlier snapshots"
    spark = docs.sparkSession

    def compute_keys(documents: DataFrame, snapshot: str) -> DataFrame:
        """The keys ``snapshot``'s own dedup run stores: its documents through the same steps."""
        _check_input(documents, dedup)
        steps = StepClock(f"dedup history {snapshot}", log)  # its steps' times are not this snapshot's
        features, null_text, their_counters = document_features(documents, hasher, dedup, steps, hashed)
        theirs, _, (semantic, assignments), _, upstream = decide(
            documents,
            features,
            hasher,
            dedup,
            steps,
            seed,
            files,
            their_counters["input_documents"] - null_text,
        )
        computed = snapshot_keys(features, theirs, snapshot).persist(StorageLevel.MEMORY_AND_DISK)
        computed.count()
        release(upstream)
        for frame in (features, theirs, semantic, assignments):
            if frame is not None:
                frame.unpersist()
        return computed

    gaps = history_gaps(
        output.root, output.corpus, output.snapshot, against, input_stage, output.stage
    ).as_dict()
    history = load_history(spark, output, input_stage, against, keys_settings(hasher, dedup), compute_keys)
    if not history.snapshots:  # the first snapshot, or a backfill of the oldest: nothing to compare with
        log.info("dedup.against %s: no earlier snapshot of %s", dedup.against, output.corpus)
        none = F.lit(None).cast("string")
        matches = spark.createDataFrame([], spark_schema(MATCHES_SCHEMA))
        written = write_parquet(matches, folder / EARLIER, files, known_rows=0)
        summary: dict[str, object] = {"against": against, "snapshots": [], "stored": [], "computed": []}
        return decisions.withColumns({"earlier_snapshot": none, "earlier_id": none}), written, summary, gaps
    matches, counters = earlier_duplicates(
        spark.read.parquet(str(folder / KEYS)),
        docs.where(F.col("text").isNotNull()).select("id", "text"),
        history,
        hasher,
        dedup,
    )
    # Written, then read back: the decisions that follow carry a file scan, not the history's whole plan
    # (whose text alone outgrew the driver's heap when later joins repeated it).
    written = write_parquet(matches, folder / EARLIER, files)
    matches.unpersist()
    updated = (
        decisions.join(
            spark.read.parquet(str(folder / EARLIER)).select("id", "earlier_snapshot", "earlier_id"),
            "id",
            "left",
        )
        .select(
            "id",
            F.when(F.col("earlier_id").isNotNull(), F.lit(EARLIER_DUPLICATE))
            .otherwise(F.col("drop_reason"))
            .alias("drop_reason"),
            F.coalesce("earlier_id", "representative_id").alias("representative_id"),
            "n_bytes",
            "n_chars",
            "same_text",
            "earlier_snapshot",
            "earlier_id",
        )
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    updated.count()
    decisions.unpersist()
    for frame in history.to_release:
        frame.unpersist()
    summary = {
        "against": against,
        "snapshots": history.snapshots,
        "stored": history.stored,
        "computed": history.computed,
        **counters,
    }
    clock.done(
        "earlier_snapshots",
        "against %s: keys of %s read, of %s computed; %d exact and %d near duplicate(s) of earlier snapshots",
        history.snapshots or "no earlier snapshot",
        history.stored,
        history.computed,
        counters["exact_matches"],
        counters["near_matches"],
    )
    return updated, written, summary, gaps


def run(config: PipelineConfig, inputs: list[DatasetRef], output: DatasetRef) -> Manifest:
    (clean,) = inputs
    dedup = config.dedup
    hasher = minhasher(dedup, config.project.seed)
    clock = StepClock("dedup", log)
    with StageOutput(output, config, inputs) as out, ThreadPoolExecutor(1, "s-curve") as drawing:
        # Drawn beside the Spark work: matplotlib's import and the drawing take about a second.
        s_curve = drawing.submit(
            plot_s_curve, hasher.bands, hasher.rows, dedup.threshold, out.path / "lsh_s_curve.png"
        )
        spark = spark_session(config, f"dedup-{output.corpus}-{output.snapshot}")
        from pyspark.sql import functions as F

        docs = spark.read.parquet(str(clean.path / "documents"))
        _check_input(docs, dedup)
        log.info(
            "dedup: LSH %d bands x %d rows (%d permutations) for Jaccard >= %.2f; P(candidate | J) %s",
            hasher.bands,
            hasher.rows,
            hasher.num_perm,
            dedup.threshold,
            s_curve_table(hasher.bands, hasher.rows),
        )
        clock.done("start")
        hashed = HashedCount()  # documents through MinHash in this run, history included
        features, null_text, counters = document_features(docs, hasher, dedup, clock, hashed)
        files = config.spark.output_files
        decisions, near_counters, (semantic, assignments), semantic_extra, upstream = decide(
            docs,
            features,
            hasher,
            dedup,
            clock,
            config.project.seed,
            files,
            counters["input_documents"] - null_text,
        )
        # This snapshot's keys, for later snapshots to deduplicate against (pipeline.dedup.history): the rows of
        # the documents it keeps on its own. Against earlier snapshots they are needed before the split (they
        # are what the history is matched with), so they are written first, and that write is the first action
        # over the decisions (it fills their cache, and what they derive from can go); otherwise they go out in
        # the split's own job, one action fewer, and the summary is the first action over the decisions.
        settings = keys_settings(hasher, dedup)
        rows = {}
        extra: dict = {}
        earlier_columns: list[str] = []
        if dedup.against is not None:
            keys = write_parquet(snapshot_keys(features, decisions, output.snapshot), out.path / KEYS, files)
            release([*upstream, features])
            decisions, rows[EARLIER], counters["history"], extra["history"] = drop_earlier_duplicates(
                config, output, clean.stage, hasher, clock, decisions, docs, out.path, hashed
            )
            earlier_columns = ["earlier_snapshot", "earlier_id"]
        counters["hashed_documents"] = hashed.value
        # Before the writes: it tells duplicates_table whether any text must be compared at all.
        summary, to_score = _summary(decisions, null_text)
        if dedup.against is None:
            release(upstream)
        clock.done(
            "summary",
            "removed %s in %d clusters",
            summary["dropped"] or "nothing",
            summary["clusters"],
        )

        removed = decisions.where(F.col("drop_reason").isNotNull()).select(
            "id", "drop_reason", *earlier_columns
        )
        labelled = docs.join(removed, "id", "left").withColumn(
            "drop_reason", F.when(F.col("text").isNull(), F.lit(NULL_TEXT)).otherwise(F.col("drop_reason"))
        )
        parts = split_parts(
            labelled,
            out.path,
            document_columns=docs.columns,
            excluded_columns=[*docs.columns, "drop_reason", *earlier_columns],
        )
        if dedup.against is not None:
            kept, excluded = write_parquet_parts(labelled, parts, files)
        else:
            # A kept document has text and no drop reason: exactly the rows snapshot_keys selects.
            keys_columns: list[str | Column] = [
                F.lit(output.snapshot).alias("snapshot"),
                "id",
                "exact_key",
                "band_keys",
            ]
            kept, excluded, keys = write_parquet_parts(
                labelled.join(features.select("id", "exact_key", "band_keys"), "id", "left"),
                [*parts, (out.path / KEYS, F.col("drop_reason").isNull(), keys_columns, None)],
                files,
            )
            release([features])
        extra["keys"] = {**settings, "documents": keys}
        texts = docs.where(F.col("text").isNotNull()).select("id", "text")
        # Clusters inside this snapshot; a document matched in an earlier snapshot is in earlier_duplicates/.
        within = decisions.where(F.coalesce(F.col("drop_reason") != F.lit(EARLIER_DUPLICATE), F.lit(True)))
        duplicates = write_parquet(
            duplicates_table(within, texts, hasher, to_score), out.path / "duplicates", files
        )
        rows = {"documents": kept, "excluded": excluded, "duplicates": duplicates, **rows}
        if dedup.semantic.enabled:
            for name, table, schema in (
                ("semantic_duplicates", semantic, REMOVAL_SCHEMA),
                ("semantic_clusters", assignments, CLUSTER_SCHEMA),
            ):
                if table is None:  # fewer than two documents: nothing was clustered
                    table = spark.createDataFrame([], spark_schema(schema))
                rows[name] = write_parquet(table, out.path / name, files)
                table.unpersist()
            extra["semantic"] = semantic_extra
        decisions.unpersist()
        s_curve.result()
        clock.done(
            "write", "%d documents kept, %d excluded, %d rows in duplicates", kept, excluded, duplicates
        )
        return out.commit(
            rows=rows,
            counters={**counters, **summary, **near_counters},
            extra={
                **extra,
                "lsh": {
                    "bands": hasher.bands,
                    "rows": hasher.rows,
                    "permutations": hasher.num_perm,
                    "threshold": dedup.threshold,
                    "collision_probability": s_curve_table(hasher.bands, hasher.rows),
                },
                "step_seconds": clock.seconds,
            },
        )
