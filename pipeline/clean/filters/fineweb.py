"""FineWeb's own rules (Penedo et al. 2024), defined as datatrove's FineWebQualityFilter.

Computed on the text C4 leaves (the recipe runs C4 first). Lines are the non-blank ones; a line "ends in
punctuation" with one of datatrove's terminal marks (any script); short lines have at most
``short_line_length`` characters; duplicated-line characters are over the text without newlines;
newlines are counted per word.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from pipeline.clean.filters.gopher_repetition import find_duplicates
from pipeline.clean.filters.punctuation import TERMINAL_PUNCTUATION
from pipeline.documents.rules import Rule, per_language

NAME = "fineweb"
SIGNALS = pa.struct(
    [
        ("lines", pa.int64()),
        ("line_punct_ratio", pa.float64()),
        ("short_line_ratio", pa.float64()),
        ("char_dup_ratio", pa.float64()),
        ("newline_word_ratio", pa.float64()),
    ]
)


def signals(text: str, n_words: int, short_line_length: int) -> dict[str, float | int | None]:
    lines = [line for line in text.split("\n") if line.strip() != ""]
    if not lines:
        return {"lines": 0, **dict.fromkeys(SIGNALS.names[1:])}
    chars_without_newlines = len(text) - text.count("\n")
    return {
        "lines": len(lines),
        "line_punct_ratio": sum(line.endswith(TERMINAL_PUNCTUATION) for line in lines) / len(lines),
        "short_line_ratio": sum(len(line) <= short_line_length for line in lines) / len(lines),
        "char_dup_ratio": (
            find_duplicates(lines)[1] / chars_without_newlines if chars_without_newlines else None
        ),
        "newline_word_ratio": text.count("\n") / n_words if n_words else None,
    }


def rules(config, languages: Sequence[str]) -> list[Rule]:
    spec = [
        ("empty", "lines", "<", lambda s: 1),
        ("min_line_punct_ratio", "line_punct_ratio", "<", lambda s: s.min_line_punct_ratio),
        ("max_short_line_ratio", "short_line_ratio", ">", lambda s: s.max_short_line_ratio),
        ("max_char_dup_ratio", "char_dup_ratio", ">", lambda s: s.max_char_dup_ratio),
        ("max_newline_word_ratio", "newline_word_ratio", ">", lambda s: s.max_newline_word_ratio),
    ]
    sections = {lang: config.for_language(lang).fineweb for lang in languages}
    built = []
    for name, signal, op, field in spec:

        def threshold(section, field=field):
            return field(section) if section.enabled else None

        built.append(
            Rule(
                f"{NAME}.{name}",
                f"{NAME}.{signal}",
                op,
                per_language(threshold(config.fineweb), {lang: threshold(s) for lang, s in sections.items()}),
                unless_zero=name == "min_line_punct_ratio" and config.fineweb.line_punct_exclude_zero,
            )
        )
    return built
