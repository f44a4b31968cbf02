"""Text normalisation that keeps sentences intact: NFKC, no control characters, tidy whitespace."""

from __future__ import annotations

import re
import unicodedata

# C0/C1 controls except tab and newline, plus zero-width and bidi formatting characters.
_INVISIBLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]")
_SPACES = re.compile(r"[^\S\n]+")
_BLANK_LINES = re.compile(r"\n{3,}")


def normalize_text(text: str) -> str:
    """Punctuation and symbols are kept: stripping them (the naive [^\\w\\s]) destroys sentences."""
    text = unicodedata.normalize("NFKC", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _INVISIBLE.sub("", text)
    lines = [_SPACES.sub(" ", line).strip() for line in text.split("\n")]
    return _BLANK_LINES.sub("\n\n", "\n".join(lines)).strip()
