"""Text normalisation that keeps sentences intact: mojibake repair, NFKC, no control characters, tidy whitespace."""

from __future__ import annotations

import re
import unicodedata
from functools import cache

# C0/C1 controls except tab and newline, zero-width and bidi formatting characters, and lone surrogates.
_INVISIBLE = re.compile(
    r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff\ud800-\udfff]"
)
_SPACES = re.compile(r"[^\S\n]+")
_BLANK_LINES = re.compile(r"\n{3,}")


@cache
def _ftfy_config():
    import ftfy

    # Only the repairs: width, ligatures and NFKC are ours below; quotes, HTML entities and line breaks
    # are content (uncurling quotes would change which lines end in terminal punctuation).
    return ftfy.TextFixerConfig(
        unescape_html=False,
        fix_latin_ligatures=False,
        fix_character_width=False,
        uncurl_quotes=False,
        fix_line_breaks=False,
        normalization=None,
        explain=False,
    )


def repair_mojibake(text: str) -> str:
    """UTF-8 read as Latin-1/Windows-1252 and similar ("doesnâ€™t" -> "doesn’t"), via ftfy."""
    import ftfy

    return ftfy.fix_text(text, _ftfy_config())


def normalize_text(text: str) -> str:
    """Punctuation and symbols are kept: stripping them (the naive [^\\w\\s]) destroys sentences.

    Paragraph breaks survive as one blank line; any other run of whitespace becomes one space.
    Repeated to a fixed point (at most a few rounds), so normalising twice changes nothing.
    """
    for _ in range(4):
        normalized = _normalize_once(text)
        if normalized == text:
            break
        text = normalized
    return text


def _normalize_once(text: str) -> str:
    # Plain ASCII cannot hold mojibake; ftfy would only strip terminal escapes from it.
    if not text.isascii() or "\x1b" in text:
        text = repair_mojibake(text)
    text = unicodedata.normalize("NFKC", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _INVISIBLE.sub("", text)
    lines = [_SPACES.sub(" ", line).strip() for line in text.split("\n")]
    return _BLANK_LINES.sub("\n\n", "\n".join(lines)).strip()


def decode_utf8(raw: bytes) -> str:
    """Text bytes from Arrow/Parquet, which need not be valid UTF-8 (binary junk, encoded surrogates)."""
    return raw.decode("utf-8", errors="replace")
