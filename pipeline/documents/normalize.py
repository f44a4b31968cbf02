"""Text normalisation that keeps sentences intact: mojibake repair, a Unicode normal form, no control characters,
tidy whitespace.

The normal form is a setting (``clean.unicode_form``, ``bpe.unicode_form``). NFC (the default) only
composes characters, so text stays as written; NFKC also folds "compatibility" characters into others:
full-width punctuation into ASCII (Chinese "，" becomes ","), "…" into "...", "™" into "TM", full-width
letters and superscripts into plain ones. FineWeb and datatrove keep the text as ftfy leaves it, which is NFC;
docs/clean.md has the measurement that chose the default.
"""

from __future__ import annotations

import re
import unicodedata
from functools import cache
from typing import get_args

from pipeline.core.config import UnicodeForm

# C0/C1 controls except tab and newline, soft hyphen, zero-width, bidi and deprecated formatting characters,
# interlinear annotations, lone surrogates and tag characters.
_INVISIBLE = re.compile(
    r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u200b-\u200f\u202a-\u202e\u2060-\u2064\u206a-\u206f"
    r"\ufeff\ufff9-\ufffb\ud800-\udfff\U000e0000-\U000e007f]"
)
# Terminal control sequences (ECMA-48), whole: CSI such as colours (ESC [ 32 m, and its one-byte form
# U+009B), OSC such as window titles (ESC ] ... BEL or ESC \), and two-character escapes. Removing only the
# ESC control character (as an HTML parser does) leaves "[32m" in the text.
TERMINAL_ESCAPE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"
    r"|\x1b[@-Z\\-_]"
)
# What ftfy's repairs act on besides mojibake: C1 controls, terminal escapes, surrogates.
_FTFY_TRIGGER = re.compile(r"[\x80-\x9f\x1b\ud800-\udfff]")
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")
_SPACES = re.compile(r"[^\S\n]+")
_BLANK_LINES = re.compile(r"\n{3,}")
UNICODE_FORMS: tuple[UnicodeForm, ...] = get_args(UnicodeForm)
DEFAULT_FORM: UnicodeForm = "NFC"


@cache
def _ftfy_config():
    import ftfy

    # Only the repairs: width, ligatures and the normal form are ours below; quotes, HTML entities and line breaks
    # are content (uncurling quotes would change which lines end in terminal punctuation).
    return ftfy.TextFixerConfig(
        unescape_html=False,
        remove_control_chars=False,  # _INVISIBLE below
        fix_latin_ligatures=False,
        fix_character_width=False,
        uncurl_quotes=False,
        fix_line_breaks=False,
        normalization=None,
        explain=False,
    )


def repair_mojibake(text: str) -> str:
    """UTF-8 read as Latin-1/Windows-1252 and similar ("doesnâ€™t" -> "doesn’t"), via ftfy.

    ftfy walks the text line by line in Python; most text has nothing for it to do, which one regex
    search (and ftfy's own mojibake test) tells first.
    """
    import ftfy

    if _FTFY_TRIGGER.search(text) is None and not _may_be_mojibake(text):
        return text
    return ftfy.fix_text(text, _ftfy_config())


def _may_be_mojibake(text: str) -> bool:
    """ftfy's ``is_bad`` on just the non-ASCII runs with three characters either side.

    Every pattern of ftfy's badness regex holds a non-ASCII character and reaches at most a few ASCII
    characters from it, so this finds every match ``is_bad`` finds, at a fraction of the cost on text that
    is mostly ASCII (tests/documents/test_normalize.py checks it against always running ftfy).
    """
    from ftfy.badness import is_bad

    spans: list[list[int]] = []
    for run in _NON_ASCII.finditer(text):
        start, end = max(0, run.start() - 3), run.end() + 3
        if spans and start <= spans[-1][1]:
            spans[-1][1] = end
        else:
            spans.append([start, end])
    return bool(spans) and is_bad("\x00".join(text[start:end] for start, end in spans))


def strip_terminal_escapes(text: str) -> str:
    """``text`` without terminal control sequences; a no-op (one search) for text that has none."""
    if "\x1b" not in text and "\x9b" not in text:
        return text
    return TERMINAL_ESCAPE.sub("", text)


def normalize_text(text: str, form: UnicodeForm = DEFAULT_FORM) -> str:
    """Punctuation and symbols are kept: stripping them (the naive [^\\w\\s]) destroys sentences.

    ``form`` is the Unicode normal form (``UNICODE_FORMS``). Paragraph breaks survive as one blank line; any
    other run of whitespace becomes one space. Repeated to a fixed point (at most a few rounds), so
    normalising twice changes nothing.
    """
    for _ in range(4):
        normalized = _normalize_once(text, form)
        # One round already gives a fixed point for ASCII: nothing is left for ftfy or the normal form.
        if normalized == text or normalized.isascii():
            return normalized
        text = normalized
    return text


def _normalize_once(text: str, form: UnicodeForm) -> str:
    text = strip_terminal_escapes(text)
    # Plain ASCII cannot hold mojibake.
    if not text.isascii():
        text = repair_mojibake(text)
    text = unicodedata.normalize(form, text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _INVISIBLE.sub("", text)
    lines = [_SPACES.sub(" ", line).strip() for line in text.split("\n")]
    return _BLANK_LINES.sub("\n\n", "\n".join(lines)).strip()


def decode_utf8(raw: bytes) -> str:
    """Text bytes from Arrow/Parquet, which need not be valid UTF-8 (binary junk, encoded surrogates)."""
    return raw.decode("utf-8", errors="replace")
