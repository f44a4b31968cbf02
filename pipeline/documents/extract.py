"""HTML to main text, reading each page straight from its WARC record.

This is the only place pages are decoded and extracted; the crawl stage stores raw responses.
"""

from __future__ import annotations

import codecs
import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from pipeline.documents.normalize import strip_terminal_escapes

EXTRACTED_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("url", pa.string()),
        ("domain", pa.string()),
        ("fetch_time", pa.timestamp("us", tz="UTC")),
        ("text", pa.string()),
        ("drop_reason", pa.string()),
        ("charset", pa.string()),  # the codec the page was decoded with
        ("charset_fix", pa.string()),  # why it is not the declared one (DecodedHtml.fix), else null
    ]
)

_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
_BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
# What browsers do (WHATWG Encoding): these labels all mean windows-1252.
_WHATWG_ALIASES = {"ascii": "cp1252", "latin_1": "cp1252", "iso8859_1": "cp1252"}
_HIGH_BYTES = bytes(range(0x80, 0x100))
_LIKELY_LEGACY = "cp1252"  # the most common legacy web charset
# charset_normalizer's mess ratio of a decoding: right Latin texts stay below ~0.2, a wrong script
# (Cyrillic or Greek bytes read as cp1252) scores 0.6 and more.
GARBAGE = 0.4


def read_warc_payload(path: Path, offset: int) -> bytes:
    from warcio.archiveiterator import ArchiveIterator

    with open(path, "rb") as handle:
        handle.seek(offset)
        record = next(iter(ArchiveIterator(handle)))
        return record.content_stream().read()


def declared_charset(content_type: str | None, payload: bytes) -> str | None:
    """The charset the HTTP header declares, else the one a <meta> tag declares (lower-case label)."""
    if content_type and "charset=" in content_type.lower():
        return content_type.lower().split("charset=", 1)[1].split(";")[0].strip(" \"'") or None
    match = _META_CHARSET.search(payload[:4096])
    return match.group(1).decode("ascii").lower() if match else None


def codec_name(label: str | None) -> str | None:
    """Python's codec name for a charset label (``ISO-8859-1`` -> ``cp1252`` as in browsers), None if unknown."""
    if not label:
        return None
    try:
        name = codecs.lookup(label).name.replace("-", "_")
    except LookupError:
        return None
    return _WHATWG_ALIASES.get(name, name)


@dataclass(frozen=True)
class DecodedHtml:
    text: str
    charset: str  # codec used
    declared: str | None  # label the header or <meta> gave, if any
    fix: str | None  # None when the declaration held (or none was needed); else why another codec was used

    @staticmethod
    def fixes() -> dict[str, str]:
        return {
            "declared_mismatch": "the declared charset was wrong (e.g. UTF-8 bytes declared latin-1)",
            "declared_unknown": "the declared charset is not a known encoding",
            "detected": "nothing was declared and the bytes are not UTF-8: a legacy charset was guessed",
            "invalid_bytes_replaced": "UTF-8 with a few invalid bytes, replaced by U+FFFD",
        }


def _legacy_guess(payload: bytes) -> tuple[str, float]:
    """(codec, garbage ratio) for bytes that are not UTF-8: cp1252 unless it reads as garbage.

    cp1252 is by far the most common legacy web charset, and charset detection on a short Latin text
    often prefers a rare code page (cp1257 turns "déjà" into "déją"); so detection is only asked when
    cp1252 clearly fails, as it does for Cyrillic, Greek or Central European bytes.
    """
    from charset_normalizer import from_bytes
    from charset_normalizer.md import mess_ratio

    legacy = mess_ratio(payload.decode(_LIKELY_LEGACY, errors="replace"), maximum_threshold=1.0)
    if legacy < GARBAGE:
        return _LIKELY_LEGACY, legacy
    best = from_bytes(payload).best()
    detected = codec_name(best.encoding) if best is not None else None
    if best is None or detected is None or best.chaos >= legacy:
        return _LIKELY_LEGACY, legacy
    return detected, best.chaos


def decode_html_detailed(payload: bytes, content_type: str | None) -> DecodedHtml:
    """Decode a page, repairing a declared charset that does not match the bytes.

    Order: a byte-order mark; pure ASCII; valid UTF-8 (multi-byte UTF-8 sequences almost never occur by
    chance in legacy single-byte text, so they beat a latin-1 declaration); the declared charset if it
    decodes and does not read as garbage; UTF-8 with a few broken bytes replaced; a legacy-charset
    guess (cp1252, or what charset_normalizer detects when that reads clearly better).
    """
    label = declared_charset(content_type, payload)
    declared = codec_name(label)
    for bom, codec in _BOMS:
        if payload.startswith(bom):
            return DecodedHtml(payload.decode(codec, errors="replace"), codec.replace("-", "_"), label, None)

    def result(text: str, codec: str, fix: str | None = None) -> DecodedHtml:
        if fix is None and label is not None and declared is None:
            fix = "declared_unknown"
        elif fix is None and declared is not None and codec != declared and not payload.isascii():
            fix = "declared_mismatch"
        return DecodedHtml(text, codec, label, fix)

    if declared is not None and declared.startswith(("utf_16", "utf_32")) and b"\x00" in payload[:1024]:
        with contextlib.suppress(UnicodeDecodeError):
            return result(payload.decode(declared), declared)
    if payload.isascii():
        return result(payload.decode("ascii"), "ascii")
    with contextlib.suppress(UnicodeDecodeError):
        return result(payload.decode("utf-8"), "utf_8")
    guess = None
    if declared is not None and declared != "utf_8":
        with contextlib.suppress(UnicodeDecodeError):
            text = payload.decode(declared)
            from charset_normalizer.md import mess_ratio

            if mess_ratio(text, maximum_threshold=1.0) < GARBAGE:
                return result(text, declared)
            guess = _legacy_guess(payload)
            if guess[0] == declared or guess[1] >= mess_ratio(text, maximum_threshold=1.0):
                return result(text, declared)
    lenient = payload.decode("utf-8", errors="replace")
    broken = lenient.count("\ufffd")
    valid = sum(1 for char in lenient if ord(char) > 0x7F) - broken
    if valid >= 4 * broken:  # mostly UTF-8, with a few stray bytes
        return result(lenient, "utf_8", "invalid_bytes_replaced")
    codec, _ = guess or _legacy_guess(payload)
    return result(payload.decode(codec, errors="replace"), codec, "detected" if label is None else None)


def decode_html(payload: bytes, content_type: str | None) -> str:
    """The page as text; see decode_html_detailed for how the charset is chosen."""
    return decode_html_detailed(payload, content_type).text


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


@dataclass(frozen=True)
class ExtractedPage:
    text: str | None
    reason: str | None  # why there is no text (binary_content, no_main_text), else None
    charset: str | None
    fix: str | None


def extract_page(payload: bytes, content_type: str | None, url: str | None) -> ExtractedPage:
    """One HTTP response body to its main text: the crawl's pages and ingested WARC records alike."""
    from pipeline.documents.content import looks_binary

    if looks_binary(payload):
        return ExtractedPage(None, "binary_content", None, None)
    decoded = decode_html_detailed(payload, content_type)
    # Before parsing: the parser drops the ESC control and would leave "[32m" behind.
    text = extract_main_text(strip_terminal_escapes(decoded.text), url)
    return ExtractedPage(text, None if text else "no_main_text", decoded.charset, decoded.fix)


def extract_batches(
    batches: Iterator[pa.RecordBatch], crawl_root: str, url_filter=None
) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: fetch-index rows in, one extracted document (or a drop reason) per row out.

    ``url_filter`` (a shared ``pipeline.clean.url_filter.UrlFilter``, ``pipeline.core.spark.share``) is checked first: a blocked page is
    not read at all, its reason is the URL rule's."""
    root = Path(crawl_root)
    checker = url_filter.value if url_filter is not None else None
    for batch in batches:
        out: dict[str, list] = {name: [] for name in EXTRACTED_SCHEMA.names}
        for row in batch.to_pylist():
            text, reason, charset, fix = None, None, None, None
            blocked = checker.check(row["url"]) if checker is not None else None
            if blocked is not None:
                reason = blocked[1][:500]
            else:
                try:
                    if row["warc_file"] is None:
                        raise FileNotFoundError("the crawl stored no response for this row")
                    payload = read_warc_payload(root / row["warc_file"], row["warc_offset"])
                    page = extract_page(payload, row["content_type"], row["url"])
                    text, reason, charset, fix = page.text, page.reason, page.charset, page.fix
                except Exception as exc:  # one bad record must not fail the partition
                    reason = f"extract_error:{type(exc).__name__}"
            out["id"].append(row["id"])
            out["url"].append(row["url"])
            out["domain"].append(row["domain"])
            out["fetch_time"].append(row["fetch_time"])
            out["text"].append(text)
            out["drop_reason"].append(reason)
            out["charset"].append(charset)
            out["charset_fix"].append(fix)
        yield pa.RecordBatch.from_pydict(out, schema=EXTRACTED_SCHEMA)
