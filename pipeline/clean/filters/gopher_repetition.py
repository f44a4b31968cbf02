"""Gopher repetition signals (Rae et al. 2021, table A1), defined as datatrove's GopherRepetitionFilter.

Line and paragraph duplicates count an element as duplicate from its second occurrence on; fractions of
characters are over ``len(text)``. The top n-gram fraction is the most frequent n-gram's length (words
joined by one space) times its count, even when that count is 1, as in datatrove. The duplicated n-gram
fraction walks the words, and after a repeated n-gram jumps past it, so overlapping repeats count once.

n-grams are compared as sequences of word ids (numpy), not as joined strings: datatrove joins the words
of a duplicated n-gram without separators, so it also equates different splits of the same characters
("ab c" and "a bc"); spaCy tokenisation almost never produces such pairs.
"""

from __future__ import annotations

import hashlib
import re
from bisect import bisect_left
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from pipeline.documents.rules import Rule, per_language

NAME = "gopher_repetition"
TOP_NGRAMS = (2, 3, 4)
DUP_NGRAMS = (5, 6, 7, 8, 9, 10)
_PARAGRAPH = re.compile(r"\n{2,}")
_LINES = re.compile(r"\n+")

SIGNALS = pa.struct(
    [
        ("dup_para_frac", pa.float64()),
        ("dup_para_char_frac", pa.float64()),
        ("dup_line_frac", pa.float64()),
        ("dup_line_char_frac", pa.float64()),
        *[(f"top_{n}_gram_char_frac", pa.float64()) for n in TOP_NGRAMS],
        *[(f"dup_{n}_gram_char_frac", pa.float64()) for n in DUP_NGRAMS],
    ]
)


def find_duplicates(elements: Sequence[str]) -> tuple[int, int]:
    """(number of repeated elements, their characters), each element counted from its second occurrence."""
    seen: set[str] = set()
    elements_repeated = chars_repeated = 0
    for element in elements:
        if element in seen:
            elements_repeated += 1
            chars_repeated += len(element)
        else:
            seen.add(element)
    return elements_repeated, chars_repeated


def word_hash(word: str) -> int:
    """A 64-bit hash that depends on the word alone (unlike hash(), which is salted per process)."""
    return int.from_bytes(
        hashlib.blake2b(word.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little"
    )


def ngram_keys(ids: np.ndarray, n: int) -> np.ndarray:
    """One uint64 key per n-gram start: a polynomial hash of the word hashes, wrapping modulo 2**64."""
    count = ids.size - n + 1
    keys = ids[:count].copy()
    multiplier = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        for offset in range(1, n):
            keys = keys * multiplier + ids[offset : offset + count] + np.uint64(1)
    return keys


def top_ngram_chars(keys: np.ndarray, word_chars: np.ndarray, n: int) -> int:
    """len(" ".join(top n-gram)) * its count; ties go to the n-gram seen first (Counter.most_common)."""
    _, first, counts = np.unique(keys, return_index=True, return_counts=True)
    best = counts.max()
    start = int(first[counts == best].min())
    return (int(word_chars[start + n] - word_chars[start]) + n - 1) * int(best)


def duplicated_ngram_chars(keys: np.ndarray, word_chars: np.ndarray, n: int) -> int:
    """datatrove's find_all_duplicate: walk the n-grams; one seen before (at a position the walk visited)
    adds its characters and the walk jumps past it, any other is remembered and the walk steps by one.

    Only positions whose n-gram occurred earlier can be repeats, so the walk visits just those: a repeat
    at p is real when some earlier occurrence of its n-gram was not jumped over.
    """
    count = keys.size
    order = np.argsort(keys, kind="stable")  # equal keys stay in position order
    sorted_keys = keys[order]
    starts_group = np.ones(count, dtype=bool)
    starts_group[1:] = sorted_keys[1:] != sorted_keys[:-1]
    group_start = np.flatnonzero(starts_group)
    group = np.empty(count, dtype=np.int64)
    group[order] = np.cumsum(starts_group) - 1
    first = order[group_start[group]]
    candidates = np.flatnonzero(first < np.arange(count))
    if candidates.size == 0:
        return 0
    order_list, group_list, start_list = order.tolist(), group.tolist(), group_start.tolist()
    chars = (word_chars[n:] - word_chars[:-n]).tolist()  # characters of the n-gram at each position
    jumps: list[int] = []  # positions of repeats found so far; the n-1 after each are never visited
    repeated, next_visited = 0, 0
    for position in candidates.tolist():
        if position < next_visited:
            continue
        index = start_list[group_list[position]]
        while True:
            earlier = order_list[index]
            if earlier >= position:
                break
            jump = bisect_left(jumps, earlier)
            if not (jump and earlier < jumps[jump - 1] + n):  # visited, so its n-gram was remembered
                repeated += chars[position]
                jumps.append(position)
                next_visited = position + n
                break
            index += 1
    return repeated


def signals(text: str, word_hashes: np.ndarray, word_lengths: np.ndarray) -> dict[str, float | None]:
    """``word_hashes``: ``word_hash`` of each word (uint64); ``word_lengths``: their lengths."""
    out: dict[str, float | None] = {}
    text_chars = len(text)
    paragraphs = _PARAGRAPH.split(text.strip())
    repeated, chars = find_duplicates(paragraphs)
    out["dup_para_frac"] = repeated / len(paragraphs)
    out["dup_para_char_frac"] = chars / text_chars if text_chars else None
    lines = _LINES.split(text)
    repeated, chars = find_duplicates(lines)
    out["dup_line_frac"] = repeated / len(lines)
    out["dup_line_char_frac"] = chars / text_chars if text_chars else None

    ids = word_hashes.astype(np.uint64, copy=False)
    word_chars = np.concatenate(([0], np.cumsum(word_lengths, dtype=np.int64)))
    for n in TOP_NGRAMS:
        if ids.size < n or not text_chars:
            out[f"top_{n}_gram_char_frac"] = None
            continue
        out[f"top_{n}_gram_char_frac"] = top_ngram_chars(ngram_keys(ids, n), word_chars, n) / text_chars
    any_repeat = True
    for n in DUP_NGRAMS:
        if not text_chars:
            out[f"dup_{n}_gram_char_frac"] = None
        elif ids.size < n or not any_repeat:
            out[f"dup_{n}_gram_char_frac"] = 0.0
        else:
            chars = duplicated_ngram_chars(ngram_keys(ids, n), word_chars, n)
            out[f"dup_{n}_gram_char_frac"] = chars / text_chars
            # No repeated n-gram means no repeated longer one either.
            any_repeat = chars > 0
    return out


def rules(config, languages: Sequence[str]) -> list[Rule]:
    """In datatrove's order: paragraphs, lines, top n-grams, duplicated n-grams."""
    from pipeline.clean.config import GopherRepetitionConfig

    names = [
        ("dup_para_frac", "max_dup_para_frac"),
        ("dup_para_char_frac", "max_dup_para_char_frac"),
        ("dup_line_frac", "max_dup_line_frac"),
        ("dup_line_char_frac", "max_dup_line_char_frac"),
        *[(f"top_{n}_gram_char_frac", f"max_top_{n}_gram_char_frac") for n in TOP_NGRAMS],
        *[(f"dup_{n}_gram_char_frac", f"max_dup_{n}_gram_char_frac") for n in DUP_NGRAMS],
    ]
    sections: dict[str, GopherRepetitionConfig] = {
        lang: config.for_language(lang).gopher_repetition for lang in languages
    }
    built = []
    for signal, field in names:
        default = _threshold(config.gopher_repetition, field)
        overrides = {lang: _threshold(section, field) for lang, section in sections.items()}
        built.append(Rule(f"{NAME}.{signal}", f"{NAME}.{signal}", ">", per_language(default, overrides)))
    return built


def _threshold(section, field: str):
    # datatrove skips a paragraph/line rule whose threshold is 0 (falsy); n-gram rules always run.
    value = getattr(section, field) if section.enabled else None
    if value == 0 and field in (
        "max_dup_para_frac",
        "max_dup_para_char_frac",
        "max_dup_line_frac",
        "max_dup_line_char_frac",
    ):
        return None
    return value
