"""Incremental (cross-snapshot) dedup: drop a document that duplicates one an earlier snapshot of the corpus
already has, from keys each snapshot stores, without hashing the earlier snapshots again.

**Keys.** Every dedup output holds ``keys/``: the snapshot, id, exact key and LSH band keys of each document
the snapshot keeps *on its own* (after its URL, exact, near and semantic steps, before this cross-snapshot
one). They depend only on that snapshot's input and the dedup settings, never on which other snapshots were
deduplicated first, so the result of a run does not depend on the order runs happen in. ``extra.keys`` in the
manifest records the hashing settings (seed, n-gram sizes, bands x rows); keys made with other settings are
not comparable and are computed again.

**History.** ``dedup.against`` selects earlier snapshots (``pipeline.core.snapshots``: ``all``, ``last:N``,
``FROM..TO``, names, a glob) among those of the corpus with a dedup output or a dedup input, and only those
that sort **before** the snapshot being deduplicated: a backfill of an old snapshot compares with older ones
only. What that leaves out is said, never silent (``history_gaps``): later snapshots deduplicated without this
one (what the two share is kept in both until they are re-run), and earlier ones ``against`` selects whose
output is incomplete. A history snapshot's keys are read from its dedup output; one whose dedup output is missing (or was made
with other hashing settings) has its keys computed from its input in this run (counted in
``history.computed``: the same keys its own run would store).

**Matching** (among this snapshot's own survivors):

* exact: a document whose exact key an earlier snapshot holds;
* near: LSH band collisions with the history, each linked to the earliest document of its bucket, (snapshot,
  id) order, then (``dedup.verify``) the exact Jaccard of the two texts, which reads the earlier document's
  text from that snapshot's dedup output (its input, for computed keys).

A matched document is dropped with reason ``duplicate_of_earlier_snapshot``; its ``earlier_snapshot`` and
``earlier_id`` are those of the earliest match (by snapshot name, then id).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pipeline.core.manifest import DamagedInputError
from pipeline.core.snapshots import SnapshotSelection, base_snapshot, complete_snapshots, snapshot_folders
from pipeline.core.spark import aggregate, map_in_arrow, spark_schema
from pipeline.core.storage import STAGING_PREFIX, DatasetRef, MissingInputError, local_path
from pipeline.dedup.config import DedupConfig
from pipeline.dedup.minhash import MinHasher

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
EARLIER_DUPLICATE = "duplicate_of_earlier_snapshot"
KEYS = "keys"  # the folder of a dedup output that holds its keys
EARLIER = "earlier_duplicates"  # the folder listing this run's cross-snapshot matches
KEYS_FORMAT = 1
KEYS_SCHEMA = pa.schema(
    [
        ("snapshot", pa.string()),
        ("id", pa.string()),
        ("exact_key", pa.binary()),
        ("band_keys", pa.list_(pa.int64())),
    ]
)
MATCHES_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("earlier_snapshot", pa.string()),
        ("earlier_id", pa.string()),
        ("match", pa.string()),  # "exact" or "near"
        ("similarity", pa.float64()),
    ]
)
PAIR_SEPARATOR = "/"  # "<snapshot>/<id>": snapshot names hold no "/"
BROADCAST_ROWS = 4_000_000  # this snapshot's keys (x bands) up to this many rows are sent to every task


def keys_settings(hasher: MinHasher, dedup: DedupConfig) -> dict[str, Any]:
    """What keys depend on besides the text: keys made with other settings cannot be compared."""
    return {
        "format": KEYS_FORMAT,
        "seed": hasher.seed,
        "ngram_size": hasher.ngram_size,
        "cjk_ngram_size": hasher.cjk_ngram_size,
        "bands": hasher.bands,
        "rows": hasher.rows,
        "band_keys": dedup.near,
    }


def snapshot_keys(features: DataFrame, decisions: DataFrame, snapshot: str) -> DataFrame:
    """KEYS_SCHEMA rows for the documents a snapshot keeps on its own (``decisions``' drop_reason null)."""
    from pyspark.sql import functions as F

    kept = decisions.where(F.col("drop_reason").isNull()).select("id")
    return features.join(kept, "id", "left_semi").select(
        F.lit(snapshot).alias("snapshot"), "id", "exact_key", "band_keys"
    )


def _earlier(snapshot: str, names: Iterable[str]) -> list[str]:
    """The names that sort before ``snapshot``, in name order. An ablation variant (``<snapshot>.ab-<id>``)
    is placed where the snapshot it derives from is, so neither its own source nor a sibling variant counts
    as earlier."""
    base = base_snapshot(snapshot)
    return sorted(name for name in set(names) if base_snapshot(name) < base)


def _complete(root: str, corpus: str, input_stage: str, stage: str) -> set[str]:
    """The snapshots a history can hold: those with a complete dedup output or dedup input."""
    return {*complete_snapshots(root, corpus, stage), *complete_snapshots(root, corpus, input_stage)}


def selected_history(
    root: str, corpus: str, snapshot: str, against: str | list[str], input_stage: str, stage: str
) -> list[str]:
    """The earlier snapshots ``against`` names: among those with a complete dedup output or input, the ones
    that sort before ``snapshot`` (``_earlier``); a variant of an earlier snapshot counts only when
    ``against`` names it."""
    available = _complete(root, corpus, input_stage, stage)
    return SnapshotSelection.parse(against).select(_earlier(snapshot, available))


@dataclass(frozen=True)
class HistoryGaps:
    """What a run's history leaves out that a user should act on (manifest ``extra.history``)."""

    rerun_later: list[str]  # later dedup outputs made without this snapshot: re-run them after this one
    incomplete_earlier: list[str]  # earlier snapshots ``against`` selects with no complete output: left out
    # earlier names ``against`` lists by hand with no output at all: left out
    missing_named: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, list[str]]:
        return {
            "rerun_later": self.rerun_later,
            "incomplete_earlier": self.incomplete_earlier,
            "missing_named": self.missing_named,
        }


def _snapshots_present(root: str, corpus: str, stage: str) -> set[str]:
    """Snapshots of ``stage`` with a folder, complete or not, or a run writing one (its staging folder)."""
    folder = local_path(root) / corpus / stage
    staging = (
        {entry.name[len(STAGING_PREFIX) :].partition("@")[0] for entry in folder.glob(f"{STAGING_PREFIX}*")}
        if folder.is_dir()
        else set()
    )
    return {*snapshot_folders(root, corpus, stage), *staging}


def history_gaps(
    root: str, corpus: str, snapshot: str, against: str | list[str], input_stage: str, stage: str
) -> HistoryGaps:
    """The later snapshots to re-run and the earlier ones left out, each logged as a warning.

    A later snapshot is one whose dedup output is complete, that sorts after ``snapshot`` (a variant of
    ``snapshot``'s own source does not), whose history ``against`` would give ``snapshot`` once this run is
    complete, and whose manifest's ``counters.history.snapshots`` does not hold it: it was deduplicated
    before ``snapshot`` had an input (or with ``against`` off), so the documents the two share survive in
    both. Which snapshots this run compares with does not change (a snapshot dedups against earlier ones)."""
    selection = SnapshotSelection.parse(against)
    available = _complete(root, corpus, input_stage, stage)
    present = _snapshots_present(root, corpus, stage) | _snapshots_present(root, corpus, input_stage)
    incomplete = [name for name in selection.select(_earlier(snapshot, present)) if name not in available]
    for name in incomplete:
        log.warning(
            "dedup.against: %s/%s has no complete %s or %s output (a run still writing it, or one that "
            "failed): it is left out of %s's history, so the documents the two share stay in %s; re-run dedup "
            "for %s once %s is complete",
            corpus,
            name,
            input_stage,
            stage,
            snapshot,
            snapshot,
            snapshot,
            name,
        )
    # A name given by hand with no folder in either stage is most likely misspelt or of another corpus.
    missing = _earlier(snapshot, selection.missing(sorted(present)))
    if missing:
        log.warning(
            "dedup.against names %s, which %s/%s has no %s or %s output of at all (misspelt, or of another "
            "corpus?): left out of %s's history",
            missing,
            root,
            corpus,
            input_stage,
            stage,
            snapshot,
        )
    after = available | {snapshot}
    rerun = []
    for name in complete_snapshots(root, corpus, stage):
        if base_snapshot(name) <= base_snapshot(snapshot):
            continue
        if snapshot not in selection.select(_earlier(name, after)):
            continue  # ``against`` would not give it this snapshot either (last:N, a range, names)
        try:
            history = DatasetRef(root, corpus, stage, name).manifest().counters.get("history") or {}
        except (DamagedInputError, MissingInputError):
            history = {}  # unreadable: re-running it is the fix either way
        if snapshot not in history.get("snapshots", []):
            rerun.append(name)
    if rerun:
        log.warning(
            "dedup.against: %s/%s is deduplicated after the later snapshot(s) %s, which compared without it: "
            "the documents they share with %s stay in both. Re-run dedup for %s, in name order, after this "
            "run (docs/dedup.md, Backfill order)",
            corpus,
            snapshot,
            rerun,
            snapshot,
            rerun,
        )
    return HistoryGaps(rerun, incomplete, missing)


@dataclass
class History:
    keys: DataFrame | None  # KEYS_SCHEMA rows of every history snapshot
    texts: DataFrame | None  # (snapshot, id, text) where the history's documents are
    snapshots: list[str]
    stored: list[str] = field(default_factory=list)  # keys read from their dedup output
    computed: list[str] = field(default_factory=list)  # keys computed from their input in this run
    to_release: list[DataFrame] = field(default_factory=list)  # persisted: unpersist when done


def _stored_keys_usable(ref: DatasetRef, settings: dict[str, Any]) -> bool:
    if not ref.is_complete():
        return False
    stored = ref.manifest().extra.get("keys")
    if stored is None or not (ref.path / KEYS).is_dir():
        return False
    same = {key: value for key, value in stored.items() if key in settings} == settings
    if not same:
        log.warning(
            "dedup %s/%s stored its keys with other hashing settings (%s, now %s): computing them again",
            ref.corpus,
            ref.snapshot,
            {key: stored.get(key) for key in settings},
            settings,
        )
    return same


def load_history(
    spark: SparkSession,
    output: DatasetRef,
    input_stage: str,
    against: str | list[str],
    settings: dict[str, Any],
    compute_keys: Callable[[DataFrame, str], DataFrame],
) -> History:
    """The keys and texts of the earlier snapshots ``against`` selects: read where stored, else computed from
    the snapshot's input by ``compute_keys(documents, snapshot)``."""
    from pyspark.sql import functions as F

    names = selected_history(output.root, output.corpus, output.snapshot, against, input_stage, output.stage)
    history = History(None, None, names)
    keys, texts = [], []
    stored_keys, stored_texts = [], []
    for name in names:
        stored = DatasetRef(output.root, output.corpus, output.stage, name)
        if _stored_keys_usable(stored, settings):
            history.stored.append(name)
            stored_keys.append(str(stored.path / KEYS))
            # A snapshot's own survivors are its kept documents plus those it dropped as earlier duplicates.
            stored_texts += [str(stored.path / "documents"), str(stored.path / "excluded")]
            continue
        source = DatasetRef(output.root, output.corpus, input_stage, name)
        log.warning(
            "dedup.against: %s has no usable stored keys; computing them from %s (deduplicate earlier "
            "snapshots first to avoid this)",
            name,
            source.what,
        )
        documents = spark.read.parquet(str(source.path / "documents"))
        computed = compute_keys(documents, name)
        history.computed.append(name)
        history.to_release.append(computed)
        keys.append(computed)
        texts.append(documents.select(F.lit(name).alias("snapshot"), "id", "text"))
    if stored_keys:
        # One scan over every stored snapshot (the keys name their snapshot), not one per snapshot.
        keys.append(spark.read.parquet(*stored_keys).select(*KEYS_SCHEMA.names))
        # documents/ and excluded/ differ in columns; id and text are in both, and the snapshot is in the path.
        snapshot = F.regexp_extract(
            F.col("_metadata.file_path"), r"/([^/]+)/(?:documents|excluded)/[^/]*$", 1
        )
        texts.append(spark.read.parquet(*stored_texts).select(snapshot.alias("snapshot"), "id", "text"))
    if keys:
        history.keys = reduce(lambda a, b: a.unionByName(b), keys)
        history.texts = reduce(lambda a, b: a.unionByName(b), texts).where(F.col("text").isNotNull())
    return history


def _similarities(
    pairs: DataFrame, texts: DataFrame, history_texts: DataFrame, hasher: MinHasher, small: Callable
) -> DataFrame:
    """(id, earlier_snapshot, earlier_id, similarity): the exact Jaccard of each candidate pair's texts."""
    from pyspark.sql import functions as F

    from pipeline.dedup.job import SIMILARITY_SCHEMA, similarity_batches

    earlier = F.concat_ws(PAIR_SEPARATOR, "earlier_snapshot", "earlier_id")
    wanted = pairs.select(
        F.col("earlier_snapshot").alias("snapshot"), F.col("earlier_id").alias("id")
    ).distinct()
    history_texts = history_texts.join(small(wanted), ["snapshot", "id"], "left_semi")
    with_texts = (
        pairs.join(texts.select(F.col("id"), F.col("text").alias("src_text")), "id")
        .join(
            history_texts.select(
                F.col("snapshot").alias("earlier_snapshot"),
                F.col("id").alias("earlier_id"),
                F.col("text").alias("dst_text"),
            ),
            ["earlier_snapshot", "earlier_id"],
        )
        .select(F.col("id").alias("src"), earlier.alias("dst"), "src_text", "dst_text")
    )
    scored = map_in_arrow(
        with_texts, lambda batches: similarity_batches(batches, hasher), spark_schema(SIMILARITY_SCHEMA)
    )
    split = F.split("dst", PAIR_SEPARATOR, 2)
    return scored.select(
        F.col("src").alias("id"),
        split.getItem(0).alias("earlier_snapshot"),
        split.getItem(1).alias("earlier_id"),
        "similarity",
    )


def earlier_duplicates(
    own: DataFrame, texts: DataFrame, history: History, hasher: MinHasher, dedup: DedupConfig
) -> tuple[DataFrame, dict[str, int]]:
    """MATCHES_SCHEMA rows, one per document of ``own`` (this snapshot's keys) that duplicates an earlier
    snapshot's, with the earliest match; and counts of the work done."""
    from pyspark.sql import functions as F

    empty = own.sparkSession.createDataFrame([], spark_schema(MATCHES_SCHEMA))
    counters = {"exact_matches": 0, "near_candidate_pairs": 0, "near_matches": 0}
    if history.keys is None:
        return empty, counters

    def first_match(pairs: DataFrame, kind: str) -> DataFrame:
        """Per document, its earliest match (snapshot name, then id) and that pair's similarity."""
        similarity = F.col("similarity").cast("double").alias("similarity")
        earliest = F.min(F.struct("earlier_snapshot", "earlier_id", similarity))
        return (
            pairs.groupBy("id")
            .agg(earliest.alias("m"))
            .select(
                "id",
                F.col("m.earlier_snapshot").alias("earlier_snapshot"),
                F.col("m.earlier_id").alias("earlier_id"),
                F.lit(kind).alias("match"),
                F.col("m.similarity").alias("similarity"),
            )
        )

    past = history.keys.select(
        F.col("snapshot").alias("earlier_snapshot"), F.col("id").alias("earlier_id"), "exact_key", "band_keys"
    )
    own_rows = own.count()
    # The history is scanned once and filtered by what this snapshot holds (broadcast when it is small
    # enough), so only colliding keys are shuffled, however long the history.
    rows = own_rows * (hasher.bands if dedup.near else 1)
    small = F.broadcast if rows <= BROADCAST_ROWS else (lambda frame: frame)
    matches = empty
    if dedup.exact:
        wanted = small(own.select("exact_key").distinct())
        exact_pairs = own.select("id", "exact_key").join(
            past.select("earlier_snapshot", "earlier_id", "exact_key").join(wanted, "exact_key", "left_semi"),
            "exact_key",
        )
        matches = first_match(exact_pairs.withColumn("similarity", F.lit(1.0)), "exact").persist()
    candidates = None
    if dedup.near:
        remaining = own.join(matches.select("id"), "id", "left_anti").where(F.col("band_keys").isNotNull())
        own_buckets = remaining.select("id", F.posexplode("band_keys").alias("band", "bucket"))
        heads = (
            past.where(F.col("band_keys").isNotNull())
            .select("earlier_snapshot", "earlier_id", F.posexplode("band_keys").alias("band", "bucket"))
            .join(small(own_buckets.select("band", "bucket").distinct()), ["band", "bucket"], "left_semi")
            .groupBy("band", "bucket")
            .agg(F.min(F.struct("earlier_snapshot", "earlier_id")).alias("head"))
        )
        candidates = (
            own_buckets.join(heads, ["band", "bucket"])
            .select(
                "id",
                F.col("head.earlier_snapshot").alias("earlier_snapshot"),
                F.col("head.earlier_id").alias("earlier_id"),
            )
            .distinct()
            .persist()
        )
        if dedup.verify:
            assert history.texts is not None  # set with the keys
            scored = _similarities(candidates, texts, history.texts, hasher, small)
            verified = scored.where(F.col("similarity") >= dedup.threshold)
        else:
            verified = candidates.withColumn("similarity", F.lit(None).cast("double"))
        matches = matches.unionByName(first_match(verified, "near"))
    matches = matches.persist()
    stats = aggregate(
        matches,
        F.count(F.when(F.col("match") == "exact", 1)).alias("exact"),
        F.count(F.when(F.col("match") == "near", 1)).alias("near"),
    )
    counters["exact_matches"], counters["near_matches"] = int(stats["exact"]), int(stats["near"])
    if candidates is not None:
        counters["near_candidate_pairs"] = candidates.count()  # cached by the job above
        candidates.unpersist()
    return matches, counters
