"""One source file in, one row per record out: a document, a quarantined record with its reason, or a
skipped non-document record (WARC requests, metadata, warcinfo), counted but never written.

One module per format (``warc`` for WARC and WET, ``jsonl``, ``parquet``, ``arrow``); ``records`` holds the
row every reader makes, ``columnar`` what Parquet and Arrow share. Each reader streams its file (warcio record
by record, JSONL line by line, Parquet and Arrow batch by batch), so no record is held longer than it takes to
turn it into a row. A failing record never fails the file and a failing file never fails the task: both become
quarantined rows (``ingest_batches``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from pipeline.ingest.config import IngestConfig
from pipeline.ingest.readers.arrow import read_arrow
from pipeline.ingest.readers.jsonl import (
    ByteRange,
    HashingStream,
    byte_ranges,
    count_records_before,
    read_jsonl,
    splittable,
)
from pipeline.ingest.readers.parquet import read_parquet
from pipeline.ingest.readers.records import (
    BATCH_ROWS,
    DOCUMENT_COLUMNS,
    INGESTED_SCHEMA,
    SKIPPED,
    file_failure,
    host,
    quarantined,
    text_id,
    url_id,
)
from pipeline.ingest.readers.warc import HTML_TYPES, WARC_TYPES, decoded_payload, read_warc
from pipeline.ingest.sources import open_source

__all__ = [
    "BATCH_ROWS",
    "CHECKSUM_SCHEMA",
    "DOCUMENT_COLUMNS",
    "HTML_TYPES",
    "INGESTED_SCHEMA",
    "READERS",
    "SKIPPED",
    "WARC_TYPES",
    "ByteRange",
    "byte_ranges",
    "checksum_batches",
    "decoded_payload",
    "host",
    "ingest_batches",
    "read_arrow",
    "read_jsonl",
    "read_parquet",
    "read_warc",
    "splittable",
    "text_id",
    "url_id",
]

# Each reader takes (source, format, size, config, part); a part's type is the reader's own.
READERS: dict[str, Callable[..., Iterator[dict[str, Any]]]] = {
    "warc": read_warc,
    "wet": read_warc,
    "jsonl": read_jsonl,
    "parquet": read_parquet,
    "arrow": read_arrow,
}


def ingest_batches(batches: Iterator[pa.RecordBatch], config: IngestConfig) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: (path, format, bytes, part, start, end, first) rows in, the records of each file
    (or of its row group ``part``, or of its byte range ``start``-``end``) out, BATCH_ROWS at a time."""
    for batch in batches:
        for listed in batch.to_pylist():
            rows: list[dict[str, Any]] = []
            source, fmt = listed["path"], listed["format"]
            part = listed["part"]
            if listed["start"] is not None:
                part = ByteRange(listed["start"], listed["end"], listed["first"])
            emitted = 0 if listed["first"] is None else listed["first"]
            try:
                for row in READERS[fmt](source, fmt, listed["bytes"], config, part):
                    rows.append(row)
                    emitted += 1
                    if len(rows) >= BATCH_ROWS:
                        yield pa.RecordBatch.from_pylist(rows, schema=INGESTED_SCHEMA)
                        rows = []
            except Exception as exc:  # the file could not even be opened
                rows.append(quarantined(source, emitted, fmt, file_failure(exc)))
            if rows:
                yield pa.RecordBatch.from_pylist(rows, schema=INGESTED_SCHEMA)


def checksum_batches(batches: Iterator[pa.RecordBatch], config: IngestConfig) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: each listed file's size and sha256, read in chunks (an unreadable file: nulls);
    for a splittable JSONL file, read line by line, also how many records start before each piece."""
    for batch in batches:
        out: dict[str, list] = {"path": [], "bytes": [], "sha256": [], "records_before": []}
        for listed in batch.to_pylist():
            path = listed["path"]
            try:
                with open_source(path) as handle:
                    stream = HashingStream(handle)
                    counts = None
                    if splittable(path, listed["format"], listed["bytes"], config):
                        counts = count_records_before(stream, listed["bytes"], config)
                    while stream.read(1 << 20):
                        pass
                out["bytes"].append(stream.size)
                out["sha256"].append(stream.digest.hexdigest())
                out["records_before"].append(counts)
            except OSError:
                out["bytes"].append(None)
                out["sha256"].append(None)
                out["records_before"].append(None)
            out["path"].append(path)
        yield pa.RecordBatch.from_pydict(out, schema=CHECKSUM_SCHEMA)


CHECKSUM_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("bytes", pa.int64()),
        ("sha256", pa.string()),
        ("records_before", pa.list_(pa.int64())),
    ]
)
