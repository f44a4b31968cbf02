"""HTML to main text, reading each page straight from its WARC record.

This is the only place pages are decoded and extracted; the crawl stage stores raw responses.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

EXTRACTED_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("url", pa.string()),
        ("domain", pa.string()),
        ("fetch_time", pa.timestamp("us", tz="UTC")),
        ("text", pa.string()),
        ("drop_reason", pa.string()),
    ]
)

_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9_.:-]+)""", re.IGNORECASE)


def read_warc_payload(path: Path, offset: int) -> bytes:
    from warcio.archiveiterator import ArchiveIterator

    with open(path, "rb") as handle:
        handle.seek(offset)
        record = next(iter(ArchiveIterator(handle)))
        return record.content_stream().read()


def declared_charset(content_type: str | None, payload: bytes) -> str | None:
    if content_type and "charset=" in content_type.lower():
        return content_type.lower().split("charset=", 1)[1].split(";")[0].strip(" \"'") or None
    match = _META_CHARSET.search(payload[:4096])
    return match.group(1).decode("ascii").lower() if match else None


def decode_html(payload: bytes, content_type: str | None) -> str:
    """Decode with the declared charset when it decodes cleanly, else detect it from the bytes."""
    charset = declared_charset(content_type, payload)
    if charset:
        try:
            return payload.decode(charset)
        except (LookupError, UnicodeDecodeError):
            pass
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError:
        from charset_normalizer import from_bytes

        best = from_bytes(payload).best()
        return str(best) if best is not None else payload.decode("utf-8", errors="replace")


def extract_main_text(html: str, url: str | None = None) -> str | None:
    import trafilatura

    return trafilatura.extract(
        html,
        url=url,
        include_comments=False,
        include_tables=False,
        favor_precision=True,
        deduplicate=False,
    )


def extract_batches(batches: Iterator[pa.RecordBatch], crawl_root: str) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: fetch-index rows in, one extracted document (or a drop reason) per row out."""
    root = Path(crawl_root)
    for batch in batches:
        out = {name: [] for name in EXTRACTED_SCHEMA.names}
        for row in batch.to_pylist():
            text, reason = None, None
            try:
                payload = read_warc_payload(root / row["warc_file"], row["warc_offset"])
                text = extract_main_text(decode_html(payload, row["content_type"]), row["url"])
                if not text:
                    reason = "no_main_text"
            except Exception as exc:  # one bad record must not fail the partition
                reason = f"extract_error:{type(exc).__name__}"
            out["id"].append(row["id"])
            out["url"].append(row["url"])
            out["domain"].append(row["domain"])
            out["fetch_time"].append(row["fetch_time"])
            out["text"].append(text)
            out["drop_reason"].append(reason)
        yield pa.RecordBatch.from_pydict(out, schema=EXTRACTED_SCHEMA)
