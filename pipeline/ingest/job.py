"""The ingest stage as a Spark job: source files in, the clean stage's input contract out.

1. list the sources in the driver (metadata only) and checksum each file (in the driver when they are
   small, else in a Spark task per file);
2. read each file (each row group of a Parquet file, each piece of a large uncompressed JSONL file) in a
   Spark task of its own (``readers.ingest_batches``):
   one row per record, a document or a quarantined record with its reason;
3. write ``documents/`` (clean's EXTRACTED_SCHEMA plus where each record came from, its size and metadata)
   and ``excluded/``, and a manifest naming every source file with its size and sha256.

Run again with no ``ingest.sources``, a snapshot re-reads exactly the files its manifest names (a backfill
with today's code and config); a file whose bytes changed since fails the run, naming it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pyarrow as pa

from pipeline.config import PipelineConfig
from pipeline.core.manifest import Manifest
from pipeline.core.spark import map_in_arrow, spark_schema, spark_session
from pipeline.core.storage import DatasetRef, StageFailure, StageOutput
from pipeline.documents.split import write_split
from pipeline.ingest.readers import (
    CHECKSUM_SCHEMA,
    INGESTED_SCHEMA,
    SKIPPED,
    byte_ranges,
    checksum_batches,
    ingest_batches,
)
from pipeline.ingest.sources import RefusedLink, SourceFile, list_sources, open_source

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
STAGE = "ingest"


def stored_sources(output: DatasetRef) -> list[dict]:
    """The source files (path, format, bytes, sha256) a published ingest of this snapshot read."""
    if not output.is_complete():
        raise StageFailure(
            f"ingest {output.snapshot}: no ingest.sources given (--source) and no stored ingest of this "
            f"snapshot at {output.path} whose files could be re-read"
        )
    return list(output.manifest().extra.get("sources", []))


def _parts(entry: SourceFile, records_before: list[int] | None, settings) -> list[tuple]:
    """(row group, start, end, first) of each task reading this file: each row group of a Parquet file
    (its footer, read here, is small); each piece of a splittable JSONL file (``records_before``, counted in
    the checksum pass, numbers its records); else one task for the file (gzip streams cannot be split),
    also for a footer that cannot be read."""
    if entry.format == "jsonl" and records_before is not None:
        return [(None, r.start, r.end, r.first) for r in byte_ranges(entry.bytes, settings, records_before)]
    if entry.format != "parquet":
        return [(None, None, None, None)]
    import pyarrow.parquet as pq

    try:
        with open_source(entry.path) as handle:
            groups = pq.ParquetFile(handle).metadata.num_row_groups
    except Exception:  # the task quarantines the file, with the reason
        return [(None, None, None, None)]
    return [(group, None, None, None) for group in range(groups)] or [(None, None, None, None)]


def _listing(spark: SparkSession, files: list[SourceFile], parts: dict[str, list[tuple]] | None = None):
    """One partition per file (or Parquet row group, or JSONL piece), so they are read in parallel."""
    columns = "path string, format string, bytes long, part int, start long, end long, first long"
    rows = [
        (entry.path, entry.format, entry.bytes, *part)
        for entry in files
        for part in (parts or {}).get(entry.path, [(None, None, None, None)])
    ]
    # One row per partition: a round-robin repartition of one local list spreads them one each.
    return spark.createDataFrame(rows, columns).repartition(max(1, len(rows)))


def checksums(spark: SparkSession, files: list[SourceFile], settings) -> dict[str, dict]:
    """path -> bytes, sha256 and (a splittable JSONL file) records before each piece, of every listed file.

    Like Spark's own partition discovery, a small listing is handled in the driver, a large one in a
    Spark job with one task per file.
    """
    if sum(entry.bytes for entry in files) <= settings.driver_checksum_bytes:
        listing = pa.RecordBatch.from_pylist(
            [{"path": entry.path, "format": entry.format, "bytes": entry.bytes} for entry in files],
            schema=pa.schema([("path", pa.string()), ("format", pa.string()), ("bytes", pa.int64())]),
        )
        found = [row for batch in checksum_batches(iter([listing]), settings) for row in batch.to_pylist()]
    else:
        found = map_in_arrow(
            _listing(spark, files),
            lambda batches: checksum_batches(batches, settings),
            spark_schema(CHECKSUM_SCHEMA),
        ).collect()
    return {
        row["path"]: {"bytes": row["bytes"], "sha256": row["sha256"], "records_before": row["records_before"]}
        for row in found
    }


def ingest_counters(rows: DataFrame) -> dict:
    """Per format: records, documents, quarantined by reason, skipped non-document records by kind."""
    from pyspark.sql import functions as F

    reason = F.regexp_extract(F.coalesce("drop_reason", F.lit("")), r"^[a-z0-9_]+(:[a-z]+\.[a-z]+)?", 0)
    grouped = rows.groupBy("format", reason.alias("reason")).agg(F.count(F.lit(1)).alias("n")).collect()
    counters: dict = {"records": 0, "documents": 0, "excluded": 0, "excluded_by_reason": {}, "skipped": {}}
    by_format: dict[str, dict] = {}
    for row in grouped:
        fmt, code, count = row["format"], row["reason"], int(row["n"])
        part = by_format.setdefault(fmt, {"records": 0, "documents": 0, "excluded": {}, "skipped": 0})
        if code.startswith(SKIPPED):
            counters["skipped"][code.split(":", 1)[1]] = count
            part["skipped"] += count
            continue
        counters["records"] += count
        part["records"] += count
        if not code:
            counters["documents"] += count
            part["documents"] += count
        else:
            counters["excluded"] += count
            counters["excluded_by_reason"][code] = counters["excluded_by_reason"].get(code, 0) + count
            part["excluded"][code] = count
    counters["excluded_by_reason"] = dict(sorted(counters["excluded_by_reason"].items()))
    counters["skipped"] = dict(sorted(counters["skipped"].items()))
    counters["by_format"] = {
        fmt: {**part, "excluded": dict(sorted(part["excluded"].items()))}
        for fmt, part in sorted(by_format.items())
    }
    return counters


def run(config: PipelineConfig, inputs: list[DatasetRef], output: DatasetRef) -> Manifest:
    settings = config.ingest
    previous = None if settings.sources else stored_sources(output)
    refused: list[RefusedLink] = []
    if previous is not None:
        files = [SourceFile(entry["path"], entry["format"], entry["bytes"]) for entry in previous]
    else:
        files = list_sources(settings.sources, settings.format, settings.follow_symlinks, refused)
    with StageOutput(output, config, inputs) as out:
        spark = spark_session(config, f"ingest-{output.corpus}-{output.snapshot}")
        from pyspark.sql import functions as F

        sums = checksums(spark, files, settings)
        for entry in previous or []:
            now = sums.get(entry["path"], {})
            if now.get("sha256") != entry["sha256"]:
                raise StageFailure(
                    f"ingest {output.snapshot}: source file {entry['path']} changed or is gone since this "
                    f"snapshot was ingested (sha256 {entry['sha256']} then, {now.get('sha256')} now); "
                    "ingest it under a new snapshot"
                )
        parts = {
            entry.path: _parts(entry, sums.get(entry.path, {}).get("records_before"), settings)
            for entry in files
        }
        sources = [
            {
                "path": entry.path,
                "format": entry.format,
                "bytes": sums.get(entry.path, {}).get("bytes"),
                "sha256": sums.get(entry.path, {}).get("sha256"),
                "tasks": len(parts[entry.path]),  # row groups or JSONL pieces read in parallel
            }
            for entry in files
        ]
        unreadable = [entry["path"] for entry in sources if entry["sha256"] is None]
        rows = map_in_arrow(
            _listing(spark, files, parts),
            lambda batches: ingest_batches(batches, settings),
            spark_schema(INGESTED_SCHEMA),
        )
        rows = rows.cache()
        try:
            # Counted first, so an empty output (often excluded/) is written without a Spark job.
            counters = ingest_counters(rows)
            reasons = F.col("drop_reason")
            # The same URL or text in two files gives two rows with one id: their place in the file decides.
            order = ("source_file", "source_record")
            # A skipped record is counted, not kept nor quarantined; a quarantined one without an id is
            # named by its place.
            placed_id = F.coalesce("id", F.concat_ws("#", "source_file", "source_record")).alias("id")
            write_split(
                rows.where(reasons.isNull() | ~reasons.startswith(SKIPPED)),
                out.path,
                config.spark.output_files,
                document_columns=rows.columns,
                excluded_columns=[placed_id if name == "id" else name for name in rows.columns],
                kept_rows=counters["documents"],
                excluded_rows=counters["excluded"],
                tiebreak=order,
            )
        finally:
            rows.unpersist()
        counters["source_files"] = len(sources)
        counters["unreadable_files"] = unreadable
        # Files reached through links leading outside their source folder, not read (ingest.follow_symlinks).
        counters["refused_symlinks"] = len(refused)
        log.info(
            "ingest: %d documents of %d records from %d files; quarantined %s",
            counters["documents"],
            counters["records"],
            len(sources),
            counters["excluded_by_reason"] or "none",
        )
        return out.commit(
            rows={"documents": counters["documents"], "excluded": counters["excluded"]},
            counters=counters,
            extra={
                "sources": sources,
                "replayed": previous is not None,
                "refused_symlinks": [{"link": r.link, "target": r.target} for r in refused],
            },
        )
