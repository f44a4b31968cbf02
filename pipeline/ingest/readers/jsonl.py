"""JSONL, line by line; a large uncompressed file is read in byte ranges, one task each."""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pipeline.core.jsonsafe import JsonTooDeep, loads_bounded
from pipeline.ingest.config import IngestConfig
from pipeline.ingest.readers.records import file_failure, quarantined, tabular_row
from pipeline.ingest.sources import open_source


@dataclass(frozen=True)
class ByteRange:
    """A piece of an uncompressed JSONL file read by a task of its own: the records (lines) that start in
    [start, end), the first of them being record number ``first`` of the file (counted in the checksum pass)."""

    start: int
    end: int
    first: int


def _jsonl_lines(
    stream, limit: int, position: int = 0, end: int | None = None
) -> Iterator[tuple[int, bytes, int, bool]]:
    """(offset, line, bytes, oversized) for each non-blank line that starts before ``end``, the stream
    being at ``position``: a line over ``limit`` bytes is skipped in pieces, never held whole (its first
    piece is returned). The one definition of a JSONL record, shared by the reader and by the checksum
    pass that numbers a split file's pieces."""
    while (end is None or position < end) and (line := stream.readline(limit + 1)):
        offset, nbytes = position, len(line)
        if nbytes > limit and not line.endswith(b"\n"):
            while (rest := stream.readline(limit + 1)) and not rest.endswith(b"\n"):
                nbytes += len(rest)
            nbytes += len(rest)
            position += nbytes
            yield offset, line, nbytes, True
            continue
        position += nbytes
        if line.strip():  # blank lines are not records
            yield offset, line, nbytes, False


def _seek_to_line(stream, start: int, limit: int) -> None:
    """Put ``stream`` at the first line that starts at or after ``start`` (the one before is the previous
    piece's)."""
    if start == 0:
        stream.seek(0)
        return
    stream.seek(start - 1)
    if stream.read(1) != b"\n":
        while (piece := stream.readline(limit + 1)) and not piece.endswith(b"\n"):
            pass


def read_jsonl(
    source: str, fmt: str, size: int, config: IngestConfig, part: ByteRange | None = None
) -> Iterator[dict[str, Any]]:
    """A JSONL file (gzipped or not), or the ``part`` of an uncompressed one; records numbered in the file."""
    limit = config.max_record_bytes
    with open_source(source) as raw:
        stream = gzip.GzipFile(fileobj=raw) if source.lower().endswith(".gz") else raw
        number = -1 if part is None else part.first - 1
        try:
            lines = _jsonl_lines(stream, limit)
            if part is not None:
                _seek_to_line(stream, part.start, limit)
                lines = _jsonl_lines(stream, limit, stream.tell(), part.end)
            for _, line, nbytes, oversized in lines:
                number += 1
                if oversized:
                    yield quarantined(source, number, fmt, f"too_large: {nbytes} bytes > {limit}", nbytes)
                else:
                    yield _jsonl_row(line, source, number, fmt, config)
        except Exception as exc:
            yield quarantined(source, number + 1, fmt, file_failure(exc))


def splittable(source: str, fmt: str, size: int, config: IngestConfig) -> bool:
    """Uncompressed JSONL over ``ingest.split_bytes`` is read in pieces; gzip streams cannot be entered
    in the middle, and a WARC record's end is only found by reading it."""
    return fmt == "jsonl" and not source.lower().endswith(".gz") and 0 < config.split_bytes < size


def byte_ranges(size: int, config: IngestConfig, records_before: list[int]) -> list[ByteRange]:
    """The pieces of a splittable file; ``records_before[k]``: records starting before piece k + 1."""
    step = config.split_bytes
    starts = list(range(0, size, step))
    firsts = [0, *records_before]
    return [
        ByteRange(start, min(start + step, size), first) for start, first in zip(starts, firsts, strict=True)
    ]


class HashingStream:
    """A binary stream that feeds every byte read into a sha256, so one pass checksums and counts."""

    def __init__(self, stream) -> None:
        self.stream, self.digest, self.size = stream, hashlib.sha256(), 0

    def readline(self, *args) -> bytes:
        data = self.stream.readline(*args)
        self.digest.update(data)
        self.size += len(data)
        return data

    def read(self, *args) -> bytes:
        data = self.stream.read(*args)
        self.digest.update(data)
        self.size += len(data)
        return data


def count_records_before(stream: HashingStream, size: int, config: IngestConfig) -> list[int]:
    """For each piece boundary of a splittable file, how many records start before it."""
    boundaries = list(range(config.split_bytes, size, config.split_bytes))
    counts: list[int] = []
    records = 0
    for offset, *_ in _jsonl_lines(stream, config.max_record_bytes):
        while len(counts) < len(boundaries) and boundaries[len(counts)] <= offset:
            counts.append(records)
        records += 1
    return counts + [records] * (len(boundaries) - len(counts))


def _jsonl_row(line: bytes, source: str, number: int, fmt: str, config: IngestConfig) -> dict[str, Any]:
    try:
        decoded = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return quarantined(source, number, fmt, f"invalid_utf8: byte {exc.start}", len(line))
    try:
        fields = loads_bounded(decoded, config.max_json_depth)
    except JsonTooDeep:
        reason = f"too_deep: JSON nested more than {config.max_json_depth} levels"
        return quarantined(source, number, fmt, reason, len(line))
    except (ValueError, RecursionError) as exc:
        return quarantined(source, number, fmt, f"invalid_json: {str(exc)[:200]}", len(line))
    if not isinstance(fields, dict):
        return quarantined(source, number, fmt, f"not_an_object: {type(fields).__name__}", len(line))
    try:
        return tabular_row(source, number, fmt, fields, len(line), config)
    except Exception as exc:
        return quarantined(source, number, fmt, f"ingest_error:{type(exc).__name__}", len(line))
