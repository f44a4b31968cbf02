"""One source file in, one row per record out: a document, a quarantined record with its reason, or a
skipped non-document record (WARC requests, metadata, warcinfo), counted but never written.

Each reader streams its file (warcio record by record, JSONL line by line, Parquet and Arrow batch by batch), so no
record is held longer than it takes to turn it into a row. A failing record never fails the file and a
failing file never fails the task: both become quarantined rows (``ingest_batches``).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from pipeline.core.jsonsafe import JsonTooDeep, loads_bounded
from pipeline.documents.extract import EXTRACTED_SCHEMA, extract_page
from pipeline.documents.normalize import normalize_text
from pipeline.ingest.config import IngestConfig
from pipeline.ingest.sources import open_source

INGESTED_SCHEMA = pa.schema(
    [
        *EXTRACTED_SCHEMA,
        ("source_file", pa.string()),
        ("source_record", pa.int64()),  # the record's number in its file, from 0
        ("format", pa.string()),
        ("record_bytes", pa.int64()),
        ("metadata", pa.string()),  # JSON object of the configured metadata columns
    ]
)
DOCUMENT_COLUMNS = INGESTED_SCHEMA.names
SKIPPED = "skipped"  # drop_reason prefix of records that are not documents (not quarantined)
HTML_TYPES = ("text/html", "application/xhtml+xml")
BATCH_ROWS = 500


def url_id(url: str) -> str:
    """The crawl path's id (clean: ``substring(sha1(url), 1, 16)``), so a page has one id whichever way it came."""
    return hashlib.sha1(url.encode("utf-8")).hexdigest()[:16]


def text_id(text: str) -> str:
    return hashlib.sha1(normalize_text(text).encode("utf-8")).hexdigest()[:16]


def host(url: str | None) -> str | None:
    if not url:
        return None
    from pipeline.documents.urls import host_of

    try:
        return host_of(url) or None
    except ValueError:
        return None


def _row(source: str, number: int, fmt: str, **values: Any) -> dict[str, Any]:
    row = dict.fromkeys(INGESTED_SCHEMA.names)
    row.update(source_file=source, source_record=number, format=fmt, **values)
    return row


def _quarantined(source: str, number: int, fmt: str, reason: str, nbytes: int | None = None, **values):
    return _row(source, number, fmt, drop_reason=reason, record_bytes=nbytes, **values)


def _document(source, number, fmt, *, url, text, doc_id, fetch_time=None, charset="utf_8", fix=None, **rest):
    if not text.strip():
        return _quarantined(source, number, fmt, "empty_text", rest.get("record_bytes"), url=url, id=doc_id)
    return _row(
        source,
        number,
        fmt,
        id=doc_id,
        url=url,
        domain=host(url),
        fetch_time=fetch_time,
        text=text,
        charset=charset,
        charset_fix=fix,
        **rest,
    )


def _warc_date(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


WARC_TYPES = {
    "warcinfo",
    "response",
    "resource",
    "request",
    "metadata",
    "revisit",
    "conversion",
    "continuation",
}


class _CountingStream:
    """A record's raw stream that counts what is read from it: fewer bytes than declared is a cut record."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.count = 0

    def read(self, *args):
        data = self.stream.read(*args)
        self.count += len(data)
        return data

    def readline(self, *args):
        data = self.stream.readline(*args)
        self.count += len(data)
        return data


def read_warc(
    source: str, fmt: str, size: int, config: IngestConfig, part: int | None = None
) -> Iterator[dict[str, Any]]:
    """WARC responses (HTML extracted exactly as the crawl's pages are) or WET conversions (already text).

    warcio stops quietly where a gzip stream is cut; a cut shows as a damaged last record, a record shorter
    than its Content-Length, or bytes left after the last record, and each is quarantined as such.
    """
    from warcio.archiveiterator import ArchiveIterator

    cut = "truncated_gzip" if source.lower().endswith(".gz") else "truncated_record"
    with open_source(source) as handle:
        records = ArchiveIterator(handle)
        number = -1
        try:
            for record in records:
                number += 1
                yield _warc_row(record, source, number, fmt, config, cut)
        except Exception as exc:  # a damaged member: what came before it stands
            yield _quarantined(source, number + 1, fmt, _file_failure(exc))
            return
        if records.offset < size:
            reason = (
                f"{cut}: {size - records.offset} bytes after offset {records.offset} hold no whole record"
            )
            yield _quarantined(source, number + 1, fmt, reason)


DECODE_PIECE = 1 << 16  # bytes decoded at a time: what a compressed payload can cost beyond the limit


class _BoundedDecoder:
    """Content-Encoding (gzip, deflate, br) decoded a piece at a time, never more than DECODE_PIECE bytes out
    of one call: warcio's own reader inflates a whole 16 kB input block at once, which a bomb turns into
    megabytes (gzip) or gigabytes (brotli) per call."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self.started = False
        if encoding == "br":
            import brotli

            self._brotli = brotli.Decompressor()
        else:
            self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)

    def pieces(self, data: bytes) -> Iterator[bytes]:
        if self.encoding == "br":
            yield self._brotli.process(data, output_buffer_limit=DECODE_PIECE)
            while not self._brotli.can_accept_more_data() and not self._brotli.is_finished():
                yield self._brotli.process(b"", output_buffer_limit=DECODE_PIECE)
            return
        if self.encoding == "deflate" and not self.started:
            try:  # zlib-wrapped as the RFC says, or raw deflate as some servers send it
                zlib.decompressobj().decompress(data[:64])
            except zlib.error:
                self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
        self.started = True
        yield self._zlib.decompress(data, DECODE_PIECE)
        while self._zlib.unconsumed_tail and not self._zlib.eof:
            yield self._zlib.decompress(self._zlib.unconsumed_tail, DECODE_PIECE)


def decoded_payload(record, limit: int) -> bytes | None:
    """The HTTP payload of a WARC record, de-chunked and decoded as its Content-Encoding says, or None as soon
    as it passes ``limit`` bytes: memory stays bounded by the setting, whatever the record decodes to.

    As warcio does, an encoding it does not know, or a payload that is not in fact encoded (the first
    piece fails to decode), is read as it is."""
    from warcio.bufferedreaders import ChunkedDataReader

    headers = record.http_headers
    encoding = (headers.get_header("Content-Encoding") or "").strip().lower() if headers else ""
    stream = record.raw_stream
    if headers and (headers.get_header("Transfer-Encoding") or "").lower() == "chunked":
        stream = ChunkedDataReader(stream)
    decoder = _BoundedDecoder(encoding) if encoding in ("gzip", "deflate", "br") else None
    out = bytearray()
    first = True
    while data := stream.read(DECODE_PIECE):
        try:
            for piece in decoder.pieces(data) if decoder is not None else (data,):
                out += piece  # one piece at a time: a bomb stops here at limit + DECODE_PIECE bytes
                if len(out) > limit:
                    return None
        except Exception:
            if not first or out:
                raise
            decoder = None  # not encoded after all: read as it is
            out += data
        first = False
    return bytes(out) if len(out) <= limit else None


def _warc_row(record, source: str, number: int, fmt: str, config: IngestConfig, cut: str) -> dict[str, Any]:
    kind = record.rec_type
    if kind not in WARC_TYPES or record.rec_headers.get_header("Content-Length") is None:
        return _quarantined(source, number, fmt, f"{cut}: damaged record header (type {kind!r})")
    wanted = "conversion" if fmt == "wet" else "response"
    if kind != wanted:
        return _row(source, number, fmt, drop_reason=f"{SKIPPED}:{fmt}.{kind}")
    headers = record.rec_headers
    url = headers.get_header("WARC-Target-URI")
    fetch_time = _warc_date(headers.get_header("WARC-Date"))
    declared = int(headers.get_header("Content-Length") or 0)
    common = {"url": url, "id": url_id(url) if url else None, "fetch_time": fetch_time}
    if declared > config.max_record_bytes:
        reason = f"too_large: {declared} bytes > {config.max_record_bytes}"
        return _quarantined(source, number, fmt, reason, declared, **common)
    try:
        if fmt == "warc":
            status = record.http_headers.get_statuscode() if record.http_headers else None
            if status != "200":
                return _quarantined(source, number, fmt, f"http_status: {status}", declared, **common)
        raw = record.raw_stream = _CountingStream(record.raw_stream)
        payload = decoded_payload(record, config.max_record_bytes)
        if payload is None:
            reason = f"too_large: decodes to more than {config.max_record_bytes} bytes"
            return _quarantined(source, number, fmt, reason, declared, **common)
        header_bytes = record.http_headers.total_len if record.http_headers else 0
        if raw.count + header_bytes < declared:
            reason = f"{cut}: {raw.count + header_bytes} of {declared} bytes"
            return _quarantined(source, number, fmt, reason, declared, **common)
        if fmt == "wet":
            try:
                text = payload.decode("utf-8")
            except UnicodeDecodeError as exc:
                return _quarantined(
                    source, number, fmt, f"invalid_utf8: byte {exc.start}", declared, **common
                )
            return _document(
                source,
                number,
                fmt,
                text=text,
                doc_id=common["id"] or text_id(text),
                url=url,
                fetch_time=fetch_time,
                record_bytes=declared,
            )
        content_type = record.http_headers.get_header("Content-Type") if record.http_headers else None
        if content_type and not content_type.lower().startswith(HTML_TYPES):
            reason = f"unsupported_content_type: {content_type[:100]}"
            return _quarantined(source, number, fmt, reason, declared, **common)
        page = extract_page(payload, content_type, url)
        if page.reason is not None or page.text is None:  # no text always comes with a reason
            return _quarantined(source, number, fmt, page.reason or "no_main_text", declared, **common)
        return _document(
            source,
            number,
            fmt,
            text=page.text,
            doc_id=common["id"] or text_id(page.text),
            url=url,
            fetch_time=fetch_time,
            charset=page.charset,
            fix=page.fix,
            record_bytes=declared,
        )
    except Exception as exc:  # one bad record must not fail the file
        return _quarantined(source, number, fmt, f"ingest_error:{type(exc).__name__}", declared, **common)


def _file_failure(exc: Exception) -> str:
    if isinstance(exc, EOFError | zlib.error | gzip.BadGzipFile):
        return f"truncated_gzip: {type(exc).__name__}: {str(exc)[:200]}"
    return f"unreadable_file: {type(exc).__name__}: {str(exc)[:200]}"


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _record(source, number, fmt, fields: dict[str, Any], nbytes: int, config: IngestConfig) -> dict[str, Any]:
    """A JSONL object or a Parquet row (column -> value) as a row: the shared rules for tabular sources."""
    if config.text_column not in fields:
        return _quarantined(source, number, fmt, f"missing_text_column: {config.text_column}", nbytes)
    text = fields[config.text_column]
    if text is None:
        return _quarantined(source, number, fmt, f"missing_text_column: {config.text_column} is null", nbytes)
    if not isinstance(text, str):
        return _quarantined(source, number, fmt, f"text_not_a_string: {type(text).__name__}", nbytes)
    if len(text.encode("utf-8", errors="surrogatepass")) > config.max_record_bytes:
        return _quarantined(
            source, number, fmt, f"too_large: text over {config.max_record_bytes} bytes", nbytes
        )
    url = _string(fields.get(config.url_column)) if config.url_column else None
    given = fields.get(config.id_column) if config.id_column else None
    metadata = {name: fields[name] for name in config.metadata_columns if name in fields}
    encoded_metadata = (
        json.dumps(metadata, sort_keys=True, ensure_ascii=False, default=str) if metadata else None
    )
    try:
        for value in (text, url, encoded_metadata, given if isinstance(given, str) else None):
            if value is not None:
                value.encode("utf-8")  # JSON's "\ud800" escapes decode to lone surrogates
    except UnicodeEncodeError as exc:
        return _quarantined(source, number, fmt, f"invalid_utf8: {exc.reason}", nbytes)
    if given is not None and not isinstance(given, bool) and str(given):
        doc_id = str(given)
    else:
        doc_id = url_id(url) if url else text_id(text)
    return _document(
        source, number, fmt, url=url, text=text, doc_id=doc_id, record_bytes=nbytes, metadata=encoded_metadata
    )


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
                    yield _quarantined(source, number, fmt, f"too_large: {nbytes} bytes > {limit}", nbytes)
                else:
                    yield _jsonl_row(line, source, number, fmt, config)
        except Exception as exc:
            yield _quarantined(source, number + 1, fmt, _file_failure(exc))


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


class _HashingStream:
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


def _records_before(stream: _HashingStream, size: int, config: IngestConfig) -> list[int]:
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
        return _quarantined(source, number, fmt, f"invalid_utf8: byte {exc.start}", len(line))
    try:
        fields = loads_bounded(decoded, config.max_json_depth)
    except JsonTooDeep:
        reason = f"too_deep: JSON nested more than {config.max_json_depth} levels"
        return _quarantined(source, number, fmt, reason, len(line))
    except (ValueError, RecursionError) as exc:
        return _quarantined(source, number, fmt, f"invalid_json: {str(exc)[:200]}", len(line))
    if not isinstance(fields, dict):
        return _quarantined(source, number, fmt, f"not_an_object: {type(fields).__name__}", len(line))
    try:
        return _record(source, number, fmt, fields, len(line), config)
    except Exception as exc:
        return _quarantined(source, number, fmt, f"ingest_error:{type(exc).__name__}", len(line))


def read_parquet(
    source: str, fmt: str, size: int, config: IngestConfig, part: int | None = None
) -> Iterator[dict[str, Any]]:
    """One row group (``part``) of a Parquet file, or all of it; records are numbered across the file."""
    import pyarrow.parquet as pq

    with open_source(source) as handle:
        try:
            parquet = pq.ParquetFile(handle)
        except Exception as exc:
            yield _quarantined(source, 0, fmt, _file_failure(exc))
            return
        metadata = parquet.metadata
        groups = list(range(metadata.num_row_groups)) if part is None else [part]
        first = sum(metadata.row_group(index).num_rows for index in range(groups[0] if groups else 0))
        names = parquet.schema_arrow.names
        if config.text_column not in names:
            reason = _no_text_column(config, names)
            rows = sum(metadata.row_group(index).num_rows for index in groups)
            for number in range(first, first + rows):
                yield _quarantined(source, number, fmt, reason)
            return
        columns = _wanted_columns(config, names)
        batches = parquet.iter_batches(batch_size=BATCH_ROWS, row_groups=groups, columns=columns)
        yield from _batch_rows(source, fmt, batches, first, config)


def read_arrow(
    source: str, fmt: str, size: int, config: IngestConfig, part: int | None = None
) -> Iterator[dict[str, Any]]:
    """An Arrow IPC file as Hugging Face's ``Dataset.save_to_disk`` writes its shards (the stream format;
    the random-access file format is read too), record batch by record batch."""
    with open_source(source) as handle:
        try:
            try:
                stream = pa.ipc.open_stream(handle)
                names, batches = stream.schema.names, iter(stream)
            except pa.ArrowInvalid:  # not a stream: the file format starts with its own magic bytes
                handle.seek(0)
                reader = pa.ipc.open_file(handle)
                names = reader.schema.names
                batches = (reader.get_batch(index) for index in range(reader.num_record_batches))
        except Exception as exc:
            yield _quarantined(source, 0, fmt, _file_failure(exc))
            return
        if config.text_column not in names:
            batches = (batch.select([]) for batch in batches)  # read only to number the records
            yield from _batch_rows(source, fmt, batches, 0, config, _no_text_column(config, names))
            return
        columns = _wanted_columns(config, names)
        yield from _batch_rows(source, fmt, (batch.select(columns) for batch in batches), 0, config)


def _no_text_column(config: IngestConfig, names: list[str]) -> str:
    return f"missing_text_column: {config.text_column} (columns: {', '.join(names)[:200]})"


def _wanted_columns(config: IngestConfig, names: list[str]) -> list[str]:
    wanted = [config.text_column, config.url_column, config.id_column, *config.metadata_columns]
    return [name for name in dict.fromkeys(wanted) if name in names]


def _batch_rows(
    source: str,
    fmt: str,
    batches: Iterator[pa.RecordBatch],
    first: int,
    config: IngestConfig,
    missing: str | None = None,
) -> Iterator[dict[str, Any]]:
    """Rows of a columnar file's record batches (Parquet, Arrow), numbered from ``first``: texts are read
    as bytes, so invalid UTF-8 and oversized texts are quarantined one by one, not for the whole batch.
    ``missing``: the file has no text column; every record is quarantined with that reason."""
    number = first - 1
    try:
        for batch in batches:
            if missing is not None:
                for _ in range(batch.num_rows):
                    number += 1
                    yield _quarantined(source, number, fmt, missing)
                continue
            text_column = batch.column(config.text_column)
            if pa.types.is_string(text_column.type) or pa.types.is_large_string(text_column.type):
                raw_texts = text_column.cast(pa.large_binary()).to_pylist()  # no UTF-8 check on the way
            else:
                raw_texts = _values(text_column)
            others = {
                name: _values(batch.column(name)) for name in batch.schema.names if name != config.text_column
            }
            for row, raw in enumerate(raw_texts):
                number += 1
                nbytes: int | None = None
                if isinstance(raw, bytes):
                    nbytes = len(raw)
                    if nbytes > config.max_record_bytes:
                        reason = f"too_large: {nbytes} bytes > {config.max_record_bytes}"
                        yield _quarantined(source, number, fmt, reason, nbytes)
                        continue
                    try:
                        raw = raw.decode("utf-8")
                    except UnicodeDecodeError as exc:
                        yield _quarantined(source, number, fmt, f"invalid_utf8: byte {exc.start}", nbytes)
                        continue
                elif isinstance(raw, _Undecodable):
                    yield _quarantined(source, number, fmt, raw.reason(config.text_column), nbytes)
                    continue
                bad = next(
                    (name for name, values in others.items() if isinstance(values[row], _Undecodable)), None
                )
                if bad is not None:
                    yield _quarantined(source, number, fmt, others[bad][row].reason(bad), nbytes)
                    continue
                fields = {name: values[row] for name, values in others.items()}
                fields[config.text_column] = raw
                try:
                    yield _record(source, number, fmt, fields, nbytes or 0, config)
                except Exception as exc:
                    yield _quarantined(source, number, fmt, f"ingest_error:{type(exc).__name__}", nbytes)
    except Exception as exc:
        yield _quarantined(source, number + 1, fmt, _file_failure(exc))


@dataclass(frozen=True)
class _Undecodable:
    """A column value that could not be turned into a Python value; its record is quarantined alone."""

    kind: str  # invalid_utf8 | undecodable
    detail: str

    def reason(self, column: str) -> str:
        return f"{self.kind}: column {column}: {self.detail}"[:300]


def _values(column: pa.Array) -> list[Any]:
    """The column's values, one per record; a value that cannot be decoded becomes ``_Undecodable`` for its
    record only (one invalid UTF-8 url used to cost its whole row group, 1,000 rows, as one quarantine row)."""
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        values = column.cast(pa.large_binary()).to_pylist()  # read as bytes: no UTF-8 check for the batch
        decoded: list[Any] = []
        for value in values:
            if value is None:
                decoded.append(None)
                continue
            try:
                decoded.append(value.decode("utf-8"))
            except UnicodeDecodeError as exc:
                decoded.append(_Undecodable("invalid_utf8", f"byte {exc.start}"))
        return decoded
    try:
        return column.to_pylist()
    except Exception:  # one bad value (a nested string, an out-of-range date): find it record by record
        values = []
        for index in range(len(column)):
            try:
                values.append(column[index].as_py())
            except Exception as exc:
                values.append(_Undecodable("undecodable", f"{type(exc).__name__}: {exc}"))
        return values


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
                rows.append(_quarantined(source, emitted, fmt, _file_failure(exc)))
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
                    stream = _HashingStream(handle)
                    counts = None
                    if splittable(path, listed["format"], listed["bytes"], config):
                        counts = _records_before(stream, listed["bytes"], config)
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
