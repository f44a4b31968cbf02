"""Gopher quality signals (Rae et al. 2021), defined as datatrove's GopherQualityFilter.

"Words" are tokens, punctuation tokens included; word counts and the mean word length use only the
non-symbol words (a token with at least one character outside datatrove's punctuation set). Ratios of
'#' and ellipses are per token, bullet and ellipsis lines per line, stop words are distinct exact
(case-sensitive) tokens from the language's list.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from pipeline.clean.filters.punctuation import PUNCTUATION_SET
from pipeline.documents.rules import Rule, per_language

NAME = "gopher_quality"
SIGNALS = pa.struct(
    [
        ("n_words", pa.int64()),
        ("n_non_symbol_words", pa.int64()),
        ("avg_word_length", pa.float64()),
        ("hash_word_ratio", pa.float64()),
        ("ellipsis_word_ratio", pa.float64()),
        ("bullet_lines_ratio", pa.float64()),
        ("ellipsis_lines_ratio", pa.float64()),
        ("alpha_words_ratio", pa.float64()),
        ("n_stop_words", pa.int64()),
    ]
)


def is_symbol_word(word: str) -> bool:
    return all(char in PUNCTUATION_SET for char in word)


def has_alpha(word: str) -> bool:
    return any(char.isalpha() for char in word)


def signals(
    text: str,
    lines: Sequence[str],
    n_words: int,
    non_symbol_lengths: Sequence[int],
    n_alpha_words: int,
    n_stop_words: int | None,
) -> dict[str, float | int | None]:
    """Counts over words come from the caller (``Document``), which computes them once per document."""
    n_non_symbol = len(non_symbol_lengths)
    n_lines = len(lines)
    return {
        "n_words": n_words,
        "n_non_symbol_words": n_non_symbol,
        "avg_word_length": sum(non_symbol_lengths) / n_non_symbol if n_non_symbol else None,
        "hash_word_ratio": text.count("#") / n_words if n_words else None,
        "ellipsis_word_ratio": (text.count("...") + text.count("…")) / n_words if n_words else None,
        "bullet_lines_ratio": (
            sum(line.lstrip().startswith(("•", "-")) for line in lines) / n_lines if n_lines else None
        ),
        "ellipsis_lines_ratio": (
            sum(line.rstrip().endswith(("...", "…")) for line in lines) / n_lines if n_lines else None
        ),
        "alpha_words_ratio": n_alpha_words / n_words if n_words else None,
        "n_stop_words": n_stop_words,
    }


def rules(config, languages: Sequence[str]) -> list[Rule]:
    """In datatrove's order. Like datatrove, a threshold of 0 switches its rule off."""
    spec = [
        ("min_doc_words", "n_non_symbol_words", "<", "min_doc_words"),
        ("max_doc_words", "n_non_symbol_words", ">", "max_doc_words"),
        ("min_avg_word_length", "avg_word_length", "<", "min_avg_word_length"),
        ("max_avg_word_length", "avg_word_length", ">", "max_avg_word_length"),
        ("max_hash_word_ratio", "hash_word_ratio", ">", "max_symbol_word_ratio"),
        ("max_ellipsis_word_ratio", "ellipsis_word_ratio", ">", "max_symbol_word_ratio"),
        ("max_bullet_lines_ratio", "bullet_lines_ratio", ">", "max_bullet_lines_ratio"),
        ("max_ellipsis_lines_ratio", "ellipsis_lines_ratio", ">", "max_ellipsis_lines_ratio"),
        ("min_alpha_words_ratio", "alpha_words_ratio", "<", "min_alpha_words_ratio"),
        ("min_stop_words", "n_stop_words", "<", "min_stop_words"),
    ]
    sections = {lang: config.for_language(lang).gopher_quality for lang in languages}
    built = []
    for name, signal, op, field in spec:
        default = _threshold(config.gopher_quality, field)
        overrides = {lang: _threshold(section, field) for lang, section in sections.items()}
        built.append(Rule(f"{NAME}.{name}", f"{NAME}.{signal}", op, per_language(default, overrides)))
    return built


def _threshold(section, field: str):
    if not section.enabled:
        return None
    if field == "min_stop_words" and not section.stop_words:
        return None
    return getattr(section, field) or None
