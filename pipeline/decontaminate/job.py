"""The decontaminate stage: documents that share a word n-gram with an evaluation set leave (or lose the span).

Steps:

1. ``items``  every configured evaluation set as item texts (``sources``): held-out documents and tasks of
              this corpus's other snapshots, lm-evaluation-harness tasks present locally, files;
2. ``index``  in Spark, each item's n-grams (``ngrams``: 13 normalised words by default) with two hashes and
              the first set (in config order) holding each; broadcast whole when small
              (``broadcast_max_ngrams``), else a Bloom filter goes to the workers and candidates are joined;
3. ``match``  one mapInArrow pass over the documents: every n-gram looked up, hits confirmed by the second
              hash; an n-gram found in more than ``max_matches`` documents is no evidence and is set aside
              (boilerplate an item happens to share); in mode ``drop`` a document with a match left goes to
              ``excluded/`` with reason ``contaminated:<set>``, the first matching n-gram and the number of
              matches; in mode ``cut`` the matched spans (and ``cut_margin_chars`` around them) are cut out
              and the pieces of at least ``min_piece_chars`` kept, unless more than ``max_pieces`` remain or
              none;
4. ``split``  documents and excluded written; counters per set, and what was read from each set.

With no n-gram in the index (no set found anything) the documents pass through unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from pipeline.config import PipelineConfig
from pipeline.core.manifest import Manifest
from pipeline.core.spark import map_in_arrow, share, spark_schema, spark_session
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.decontaminate import sources
from pipeline.decontaminate.config import DecontaminateConfig
from pipeline.decontaminate.ngrams import (
    INDEX_SCHEMA,
    BloomFilter,
    Match,
    NgramIndex,
    candidate_rows,
    cut_spans,
    item_ngram_rows,
    normalize_words,
)
from pipeline.documents.passthrough import pass_through
from pipeline.documents.split import write_split

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
STAGE = "decontaminate"
CONTAMINATION_FIELDS = [
    pa.field("contamination_set", pa.string()),
    pa.field("contamination_ngram", pa.string()),
    pa.field("contamination_matches", pa.int32()),
]
MATCHES_TYPE = pa.list_(
    pa.struct(
        [("start", pa.int32()), ("width", pa.int32()), ("set_order", pa.int32()), ("ngram", pa.string())]
    )
)


def items_frame(
    spark: SparkSession, config: PipelineConfig, snapshot: str
) -> tuple[DataFrame | None, dict[str, Any]]:
    """(set_order, text) of every item of every set, and what each set contributed."""
    from pyspark.sql import functions as F

    frames, found = [], {}
    for order, eval_set in enumerate(config.decontaminate.sets):
        texts: list[str] = []
        frame = None
        if eval_set.kind == "heldout":
            frame, texts, found[eval_set.name] = sources.heldout_items(spark, config, eval_set, snapshot)
        elif eval_set.kind == "lm_eval":
            texts, found[eval_set.name] = sources.lm_eval_items(eval_set)
        else:
            frame, found[eval_set.name] = sources.file_items(spark, eval_set), {"path": eval_set.path}
        if texts:
            extra = spark.createDataFrame([(t,) for t in texts], "text string")
            frame = extra if frame is None else frame.unionByName(extra)
        if frame is None:
            continue
        if eval_set.max_items is not None:  # a seeded sample: the same items on every run
            frame = frame.orderBy(F.xxhash64(F.lit(config.project.seed), "text"), "text").limit(
                eval_set.max_items
            )
        frames.append(frame.select(F.lit(order).cast("int").alias("set_order"), "text"))
    items = None
    for frame in frames:
        items = frame if items is None else items.unionByName(frame)
    return items, found


def anything_to_read(config: PipelineConfig, snapshot: str) -> bool:
    """False when every set is this corpus's held-out material and no other snapshot has any (a first
    snapshot, the demo): then there is nothing to index and Spark need not start."""
    for eval_set in config.decontaminate.sets:
        if eval_set.kind != "heldout":
            return True
        for stage in ("tokenize", "evaluate"):
            if sources.heldout_snapshots(config, stage, snapshot, eval_set.snapshots):
                return True
    return False


ITEM_WORDS_SCHEMA = pa.schema([("set_order", pa.int32()), ("words", pa.int32())])


def item_word_counts(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Each item's normalised word count: an item shorter than ``min_ngram_size`` gives no n-gram, and is
    counted as skipped."""
    for batch in batches:
        normalized = normalize_words(batch.column("text").to_pylist()).to_pylist()
        words = [text.count(" ") + 1 if text else 0 for text in normalized]
        yield pa.RecordBatch.from_arrays(
            [batch.column("set_order").cast(pa.int32()), pa.array(words, pa.int32())],
            schema=ITEM_WORDS_SCHEMA,
        )


def index_batches(
    batches: Iterator[pa.RecordBatch], ngram_size: int, min_ngram_size: int
) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        texts = [text or "" for text in batch.column("text").to_pylist()]
        rows, _ = item_ngram_rows(texts, batch.column("set_order").to_pylist(), ngram_size, min_ngram_size)
        yield rows


def build_index(
    items: DataFrame, settings: DecontaminateConfig
) -> tuple[DataFrame, list | None, dict[str, Any]]:
    """One row per distinct n-gram (the first set in config order claims it): (the index, its rows when it is
    small enough to broadcast, else None, and counts per set). A small index costs one job to build and
    collect; a large one stays in Spark, cached, for the join."""
    from collections import Counter

    from pyspark.sql import functions as F

    rows = map_in_arrow(
        items,
        lambda batches: index_batches(batches, settings.ngram_size, settings.min_ngram_size),
        spark_schema(INDEX_SCHEMA),
    )
    first = F.min(F.struct("set_order", "check", "width", "prefix"))
    index = (
        rows.groupBy("hash")
        .agg(first.alias("first"))
        .select("hash", "first.check", "first.set_order", "first.width", "first.prefix")
    )
    collected = index.limit(settings.broadcast_max_ngrams + 1).collect()
    broadcast: list | None = None
    if len(collected) <= settings.broadcast_max_ngrams:
        broadcast = collected
        per_set = dict(Counter(int(r["set_order"]) for r in collected))
    else:
        index = index.cache()
        per_set = {int(r["set_order"]): int(r["count"]) for r in index.groupBy("set_order").count().collect()}
    words = map_in_arrow(items, item_word_counts, spark_schema(ITEM_WORDS_SCHEMA))
    item_counts = (
        words.groupBy("set_order")
        .agg(
            F.count(F.lit(1)).alias("items"),
            F.sum((F.col("words") < settings.min_ngram_size).cast("long")).alias("short"),
        )
        .collect()
    )
    return (
        index,
        broadcast,
        {
            "ngrams": dict(per_set),
            "items": {int(r["set_order"]): int(r["items"]) for r in item_counts},
            "short": {int(r["set_order"]): int(r["short"]) for r in item_counts},
        },
    )


def decide(
    row_text: str, matches: list[Match], settings: DecontaminateConfig, set_names: list[str]
) -> tuple[str | None, str | None, str | None, int, str]:
    """(drop reason, set, first n-gram, matches, text to keep) for one document."""
    if not matches:
        return None, None, None, 0, row_text
    first = matches[0]
    reason = f"contaminated:{set_names[first.set_order]}"
    if settings.mode == "cut":
        pieces = cut_spans(row_text, matches, settings.cut_margin_chars, settings.min_piece_chars)
        if pieces and len(pieces) <= settings.max_pieces:
            return None, set_names[first.set_order], first.ngram, len(matches), "\n".join(pieces)
    return reason, set_names[first.set_order], first.ngram, len(matches), row_text


def decide_batches(
    batches: Iterator[pa.RecordBatch],
    settings: DecontaminateConfig,
    set_names: list[str],
    out_schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: each document's matches (its ``matches`` column, null for none), then the decision;
    every input column passes, text cut where it was."""
    for batch in batches:
        texts = [text or "" for text in batch.column("text").to_pylist()]
        found = [
            sorted(
                (Match(m["start"], m["width"], m["set_order"], m["ngram"]) for m in (row or [])),
                key=lambda m: (m.start, m.width),
            )
            for row in batch.column("matches").to_pylist()
        ]
        decisions = [
            decide(text, matches, settings, set_names) for text, matches in zip(texts, found, strict=True)
        ]
        columns = {name: batch.column(name) for name in out_schema.names if name in batch.schema.names}
        cut = any(d[4] is not t for d, t in zip(decisions, texts, strict=True))
        if cut:
            columns["text"] = pa.array(
                [
                    d[4] if t or d[4] else None
                    for d, t in zip(decisions, batch.column("text").to_pylist(), strict=True)
                ],
                pa.string(),
            )
            if "n_chars" in columns:
                columns["n_chars"] = pa.array(
                    [None if d[4] is None else len(d[4]) for d in decisions], columns["n_chars"].type
                )
        columns["contamination_set"] = pa.array([d[1] for d in decisions], pa.string())
        columns["contamination_ngram"] = pa.array([d[2] for d in decisions], pa.string())
        columns["contamination_matches"] = pa.array([d[3] for d in decisions], pa.int32())
        columns["drop_reason"] = pa.array([d[0] for d in decisions], pa.string())
        yield pa.RecordBatch.from_arrays([columns[name] for name in out_schema.names], schema=out_schema)


MATCH_ROWS_SCHEMA = pa.schema([("id", pa.string()), ("matches", MATCHES_TYPE)])


def broadcast_matches(docs: DataFrame, index: NgramIndex) -> DataFrame:
    """(id, matches) for documents with a confirmed match, looked up in the index broadcast whole."""
    shared = share(docs.sparkSession, index)

    def body(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            found = shared.value.matches(batch.column("text").to_pylist())
            ids = batch.column("id").to_pylist()
            hits = [row for row, matches in enumerate(found) if matches]
            matches = [[asdict(match) for match in found[row]] for row in hits]
            yield pa.RecordBatch.from_arrays(
                [pa.array([ids[row] for row in hits], pa.string()), pa.array(matches, MATCHES_TYPE)],
                schema=MATCH_ROWS_SCHEMA,
            )

    return map_in_arrow(docs.select("id", "text"), body, spark_schema(MATCH_ROWS_SCHEMA))


def evidence(matched: DataFrame, max_matches: int | None) -> tuple[DataFrame, dict[str, Any]]:
    """Each matched document's matches without the n-grams found in more than ``max_matches`` documents
    (one row per id; a document left with none is no longer matched), and what the cap set aside."""
    from pyspark.sql import functions as F

    exploded = matched.select("id", F.explode("matches").alias("match")).withColumn(
        "ngram", F.col("match.ngram")
    )
    record: dict[str, Any] = {"max_matches": max_matches}
    if max_matches is not None:
        per_ngram = (
            exploded.select("id", "ngram")
            .distinct()
            .groupBy("ngram")
            .agg(F.count(F.lit(1)).alias("documents"))
        )
        common = per_ngram.where(F.col("documents") > max_matches)
        examples = common.orderBy(F.desc("documents"), "ngram").limit(10).collect()
        record["ngrams_over_cap"] = common.count()
        record["examples"] = [{"ngram": r["ngram"], "documents": int(r["documents"])} for r in examples]
        exploded = exploded.join(F.broadcast(common.select("ngram")), "ngram", "left_anti")
    kept = exploded.groupBy("id").agg(F.collect_list("match").alias("matches"))
    return kept, record


def joined_matches(docs: DataFrame, index: DataFrame, ngrams: int, widths: list[int]) -> DataFrame:
    """(id, matches) for documents with a confirmed match, through a Bloom filter and a join (large indexes)."""
    from pyspark.sql import functions as F

    bloom = BloomFilter.sized(ngrams)
    # The hashes only (8 bytes an n-gram) come to the driver, in pieces; the filter is ~12 bits an n-gram.
    chunk: list[int] = []
    for row in index.select("hash").toLocalIterator():
        chunk.append(row["hash"])
        if len(chunk) >= 1 << 20:
            bloom.add(np.array(chunk, dtype=np.int64))
            chunk.clear()
    bloom.add(np.array(chunk, dtype=np.int64))
    shared = share(docs.sparkSession, bloom)
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("start", pa.int32()),
            ("width", pa.int32()),
            ("hash", pa.int64()),
            ("check", pa.int64()),
            ("ngram", pa.string()),
        ]
    )

    def candidates(batches):
        for batch in batches:
            rows = candidate_rows(
                batch.column("id").to_pylist(), batch.column("text").to_pylist(), shared.value, widths
            )
            yield pa.RecordBatch.from_pydict(rows, schema=schema)

    found = map_in_arrow(docs.select("id", "text"), candidates, spark_schema(schema))
    confirmed = found.join(index.select("hash", "check", "set_order"), ["hash", "check"])
    return confirmed.groupBy("id").agg(
        F.collect_list(F.struct("start", "width", "set_order", "ngram")).alias("matches")
    )


def counters_of(decided: DataFrame, cut_mode: bool) -> dict[str, Any]:
    from pyspark.sql import functions as F

    rows = (
        decided.groupBy("drop_reason", (F.col("contamination_matches") > 0).alias("matched"))
        .agg(F.count(F.lit(1)).alias("documents"), F.sum(F.length("text")).alias("chars"))
        .collect()
    )
    dropped: dict[str, int] = {}
    dropped_chars: dict[str, int] = {}
    kept = kept_chars = cut_documents = 0
    for row in rows:
        count, chars = int(row["documents"]), int(row["chars"] or 0)
        if row["drop_reason"] is None:
            kept += count
            kept_chars += chars
            cut_documents += count if row["matched"] else 0
        else:
            dropped[row["drop_reason"]] = dropped.get(row["drop_reason"], 0) + count
            dropped_chars[row["drop_reason"]] = dropped_chars.get(row["drop_reason"], 0) + chars
    counters = {
        "input_documents": kept + sum(dropped.values()),
        "kept": kept,
        "dropped": dict(sorted(dropped.items())),
        "kept_chars": kept_chars,
        "dropped_chars": dict(sorted(dropped_chars.items())),
    }
    if cut_mode:
        counters["cut_documents"] = cut_documents
    return counters


def run(config: PipelineConfig, inputs: list[DatasetRef], output: DatasetRef) -> Manifest:
    (source,) = inputs
    settings = config.decontaminate
    set_names = [s.name for s in settings.sets]
    with StageOutput(output, config, inputs) as out:
        if not anything_to_read(config, output.snapshot):
            rows, counters = pass_through(source, out.path, CONTAMINATION_FIELDS)
            log.info(
                "decontaminate: no evaluation set holds anything yet: %d documents passed through",
                rows["documents"],
            )
            sets = {s.name: {"kind": s.kind, "items": 0, "ngrams": 0} for s in settings.sets}
            return out.commit(
                rows=rows,
                counters=counters,
                extra={
                    "decontaminate": {"sets": sets, "ngram_size": settings.ngram_size, "mode": settings.mode}
                },
            )
        spark = spark_session(config, f"decontaminate-{output.corpus}-{output.snapshot}")
        from pyspark import StorageLevel
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import to_arrow_schema

        items, found = items_frame(spark, config, output.snapshot)
        index, collected, stats = (
            build_index(items, settings)
            if items is not None
            else (None, [], {"ngrams": {}, "items": {}, "short": {}})
        )
        total = sum(stats["ngrams"].values())
        sets_record = {
            name: {
                "kind": settings.sets[order].kind,
                "items": stats["items"].get(order, 0),
                "ngrams": stats["ngrams"].get(order, 0),
                "skipped_short_items": stats["short"].get(order, 0),
                **found.get(name, {}),
            }
            for order, name in enumerate(set_names)
        }
        extra = {
            "decontaminate": {"sets": sets_record, "ngram_size": settings.ngram_size, "mode": settings.mode}
        }
        log.info(
            "decontaminate: %d distinct n-grams from %s",
            total,
            {n: r["items"] for n, r in sets_record.items()},
        )
        if total == 0:
            rows, counters = pass_through(source, out.path, CONTAMINATION_FIELDS)
            if index is not None:
                index.unpersist()
            log.info("decontaminate: no evaluation n-gram: %d documents passed through", rows["documents"])
            return out.commit(rows=rows, counters=counters, extra=extra)
        assert index is not None  # n-grams came from items, so an index was built

        docs = spark.read.parquet(str(source.path / "documents"))
        missing = [name for name in ("id", "text") if name not in docs.columns]
        if missing:
            raise ValueError(f"input documents lack column(s) {missing}; found {docs.columns}")
        arrow = to_arrow_schema(docs.schema, timezone="UTC")
        out_schema = pa.schema([*arrow, *CONTAMINATION_FIELDS, pa.field("drop_reason", pa.string())])
        if collected is not None:
            widths = sorted({int(r["width"]) for r in collected})
            columns = {
                name: [r[name] for r in collected] for name in ("check", "set_order", "width", "prefix")
            }
            matched = broadcast_matches(docs, NgramIndex.from_columns(columns, settings.min_ngram_size))
            path = "broadcast"
        else:
            widths = sorted(int(r["width"]) for r in index.select("width").distinct().collect())
            matched, path = joined_matches(docs, index, total, widths), "join"
        extra["decontaminate"]["index"] = {"ngrams": total, "widths": widths, "path": path}
        matched = matched.persist(StorageLevel.MEMORY_AND_DISK_DESER)  # read by the cap and the decisions
        kept_matches, extra["decontaminate"]["frequency_cap"] = evidence(matched, settings.max_matches)
        decided = map_in_arrow(
            docs.join(F.broadcast(kept_matches), "id", "left"),
            lambda batches: decide_batches(batches, settings, set_names, out_schema),
            spark_schema(out_schema),
        ).persist(StorageLevel.MEMORY_AND_DISK_DESER)  # the serialized level ran out of heap at 1M documents
        try:
            counters = counters_of(decided, settings.mode == "cut")
            files = config.spark.output_files
            kept, excluded = write_split(
                decided,
                out.path,
                files,
                document_columns=[field.name for field in arrow],
                kept_rows=counters["kept"],
                excluded_rows=counters["input_documents"] - counters["kept"],
            )
        finally:
            decided.unpersist()
            matched.unpersist()
            index.unpersist()  # cached on the join path, which reads it until the decisions are written
        log.info(
            "decontaminate: kept %d of %d documents; dropped %s",
            kept,
            counters["input_documents"],
            counters["dropped"] or "none",
        )
        return out.commit(rows={"documents": kept, "excluded": excluded}, counters=counters, extra=extra)
