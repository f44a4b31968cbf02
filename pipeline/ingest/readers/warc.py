"""WARC responses (HTML extracted as the crawl's pages are) and WET conversions (already text)."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from pipeline.documents.extract import extract_page
from pipeline.ingest.config import IngestConfig
from pipeline.ingest.readers.records import (
    SKIPPED,
    document_row,
    file_failure,
    new_row,
    quarantined,
    text_id,
    url_id,
)
from pipeline.ingest.sources import open_source

HTML_TYPES = ("text/html", "application/xhtml+xml")


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
            yield quarantined(source, number + 1, fmt, file_failure(exc))
            return
        if records.offset < size:
            reason = (
                f"{cut}: {size - records.offset} bytes after offset {records.offset} hold no whole record"
            )
            yield quarantined(source, number + 1, fmt, reason)


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
        return quarantined(source, number, fmt, f"{cut}: damaged record header (type {kind!r})")
    wanted = "conversion" if fmt == "wet" else "response"
    if kind != wanted:
        return new_row(source, number, fmt, drop_reason=f"{SKIPPED}:{fmt}.{kind}")
    headers = record.rec_headers
    url = headers.get_header("WARC-Target-URI")
    fetch_time = _warc_date(headers.get_header("WARC-Date"))
    declared = int(headers.get_header("Content-Length") or 0)
    common = {"url": url, "id": url_id(url) if url else None, "fetch_time": fetch_time}
    if declared > config.max_record_bytes:
        reason = f"too_large: {declared} bytes > {config.max_record_bytes}"
        return quarantined(source, number, fmt, reason, declared, **common)
    try:
        if fmt == "warc":
            status = record.http_headers.get_statuscode() if record.http_headers else None
            if status != "200":
                return quarantined(source, number, fmt, f"http_status: {status}", declared, **common)
        raw = record.raw_stream = _CountingStream(record.raw_stream)
        payload = decoded_payload(record, config.max_record_bytes)
        if payload is None:
            reason = f"too_large: decodes to more than {config.max_record_bytes} bytes"
            return quarantined(source, number, fmt, reason, declared, **common)
        header_bytes = record.http_headers.total_len if record.http_headers else 0
        if raw.count + header_bytes < declared:
            reason = f"{cut}: {raw.count + header_bytes} of {declared} bytes"
            return quarantined(source, number, fmt, reason, declared, **common)
        if fmt == "wet":
            try:
                text = payload.decode("utf-8")
            except UnicodeDecodeError as exc:
                return quarantined(source, number, fmt, f"invalid_utf8: byte {exc.start}", declared, **common)
            return document_row(
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
            return quarantined(source, number, fmt, reason, declared, **common)
        page = extract_page(payload, content_type, url)
        if page.reason is not None or page.text is None:  # no text always comes with a reason
            return quarantined(source, number, fmt, page.reason or "no_main_text", declared, **common)
        return document_row(
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
        return quarantined(source, number, fmt, f"ingest_error:{type(exc).__name__}", declared, **common)
