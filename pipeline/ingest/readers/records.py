"""The row every reader makes of a record (the ingested schema), its id, and the rules tabular sources
(JSONL objects, Parquet and Arrow rows) share."""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from typing import Any

import pyarrow as pa

from pipeline.documents.extract import EXTRACTED_SCHEMA
from pipeline.documents.normalize import normalize_text
from pipeline.ingest.config import IngestConfig

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


def new_row(source: str, number: int, fmt: str, **values: Any) -> dict[str, Any]:
    row = dict.fromkeys(INGESTED_SCHEMA.names)
    row.update(source_file=source, source_record=number, format=fmt, **values)
    return row


def quarantined(source: str, number: int, fmt: str, reason: str, nbytes: int | None = None, **values):
    return new_row(source, number, fmt, drop_reason=reason, record_bytes=nbytes, **values)


def document_row(
    source, number, fmt, *, url, text, doc_id, fetch_time=None, charset="utf_8", fix=None, **rest
):
    if not text.strip():
        return quarantined(source, number, fmt, "empty_text", rest.get("record_bytes"), url=url, id=doc_id)
    return new_row(
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


def file_failure(exc: Exception) -> str:
    if isinstance(exc, EOFError | zlib.error | gzip.BadGzipFile):
        return f"truncated_gzip: {type(exc).__name__}: {str(exc)[:200]}"
    return f"unreadable_file: {type(exc).__name__}: {str(exc)[:200]}"


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def tabular_row(
    source, number, fmt, fields: dict[str, Any], nbytes: int, config: IngestConfig
) -> dict[str, Any]:
    """A JSONL object or a Parquet row (column -> value) as a row: the shared rules for tabular sources."""
    if config.text_column not in fields:
        return quarantined(source, number, fmt, f"missing_text_column: {config.text_column}", nbytes)
    text = fields[config.text_column]
    if text is None:
        return quarantined(source, number, fmt, f"missing_text_column: {config.text_column} is null", nbytes)
    if not isinstance(text, str):
        return quarantined(source, number, fmt, f"text_not_a_string: {type(text).__name__}", nbytes)
    if len(text.encode("utf-8", errors="surrogatepass")) > config.max_record_bytes:
        return quarantined(
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
        return quarantined(source, number, fmt, f"invalid_utf8: {exc.reason}", nbytes)
    if given is not None and not isinstance(given, bool) and str(given):
        doc_id = str(given)
    else:
        doc_id = url_id(url) if url else text_id(text)
    return document_row(
        source, number, fmt, url=url, text=text, doc_id=doc_id, record_bytes=nbytes, metadata=encoded_metadata
    )
