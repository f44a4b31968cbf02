"""C4 rules (Raffel et al. 2020), defined as datatrove's C4QualityFilter, line removals included.

Each line is stripped, then, in this order: dropped if one of its words is over ``max_word_length``;
citation markers removed; dropped without terminal punctuation (or ending in "..."); dropped under
``min_words_per_line`` words; the document is dropped for "lorem ipsum"; dropped for "javascript"; the
document is dropped for "{"; dropped for cookie/terms-of-use phrases. Words here are whitespace-separated
(segmenter words for Chinese). Sentences in the kept lines are counted with spaCy's sentencizer rules.
The kept lines, joined by newlines, become the document's text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa

from pipeline.documents.rules import Rule, per_language

NAME = "c4"
CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
ELLIPSIS = "..."
POLICY_SUBSTRINGS = (
    "terms of use",
    "privacy policy",
    "cookie policy",
    "uses cookies",
    "use of cookies",
    "use cookies",
)
LINE_REMOVALS = ("too_long_word", "no_terminal_punct", "too_few_words", "javascript", "policy")
SIGNALS = pa.struct(
    [
        ("lines", pa.int64()),
        ("lines_kept", pa.int64()),
        *[(f"lines_{reason}", pa.int64()) for reason in LINE_REMOVALS],
        ("citations_removed", pa.int64()),
        ("sentences", pa.int64()),
        ("doc_drop", pa.string()),
    ]
)


@dataclass
class C4Result:
    text: str
    signals: dict
    words: int  # words of ``text``, counted line by line on the way


def apply(
    text: str,
    section,
    line_words: Callable[[str], list[str]],
    sentences_and_words: Callable[[str], tuple[int, int]],
) -> C4Result:
    """Run the line rules of ``section`` (a C4Config) over ``text``.

    Unlike datatrove, lines after a document-level drop ("lorem ipsum", "{") are still processed so
    that every signal is complete; ``doc_drop`` records the first document-level drop.
    """
    removed = dict.fromkeys(LINE_REMOVALS, 0)
    kept_lines: list[str] = []
    sentences = citations = kept_words = 0
    doc_drop = None
    end_punctuation = tuple(section.end_punctuation)
    max_word_length = section.max_word_length
    min_words = section.min_words_per_line
    lines = text.splitlines()
    for line in lines:
        line = line.strip()
        words = line_words(line)
        if (
            max_word_length is not None
            and len(line) > max_word_length
            and any(len(word) > max_word_length for word in words)
        ):
            removed["too_long_word"] += 1
            continue
        if section.remove_citations and "[" in line:
            line, found = CITATION.subn("", line)
            citations += found
        if section.filter_no_terminal_punct and (
            not line.endswith(end_punctuation) or line.endswith(ELLIPSIS)
        ):
            removed["no_terminal_punct"] += 1
            continue
        if min_words is not None and len(words) < min_words:
            removed["too_few_words"] += 1
            continue
        lowered = line.lower()
        if section.filter_lorem_ipsum and "lorem ipsum" in lowered:
            doc_drop = doc_drop or "lorem_ipsum"
        if section.filter_javascript and "javascript" in lowered:
            removed["javascript"] += 1
            continue
        if section.filter_curly_bracket and "{" in line:
            doc_drop = doc_drop or "curly_bracket"
        if section.filter_policy and any(phrase in lowered for phrase in POLICY_SUBSTRINGS):
            removed["policy"] += 1
            continue
        line_sentences, line_word_count = sentences_and_words(line)
        if section.min_num_sentences is not None:
            sentences += line_sentences
        kept_words += line_word_count
        kept_lines.append(line)
    signals = {
        "lines": len(lines),
        "lines_kept": len(kept_lines),
        **{f"lines_{reason}": count for reason, count in removed.items()},
        "citations_removed": citations,
        "sentences": sentences,
        "doc_drop": doc_drop,
    }
    return C4Result("\n".join(kept_lines).strip(), signals, kept_words)


def rules(config, languages: Sequence[str]) -> list[Rule]:
    """Document drops in datatrove's order: the first of lorem ipsum / curly bracket, then sentences."""

    def min_sentences(section) -> int | None:
        return section.min_num_sentences if section.enabled else None

    def doc_drop(section, kind: str) -> str | None:
        return kind if section.enabled else None

    sections = {lang: config.for_language(lang).c4 for lang in languages}
    built = [
        Rule(
            f"{NAME}.{kind}",
            f"{NAME}.doc_drop",
            "==",
            per_language(
                doc_drop(config.c4, kind), {lang: doc_drop(s, kind) for lang, s in sections.items()}
            ),
        )
        for kind in ("lorem_ipsum", "curly_bracket")
    ]
    built.append(
        Rule(
            f"{NAME}.min_num_sentences",
            f"{NAME}.sentences",
            "<",
            per_language(min_sentences(config.c4), {lang: min_sentences(s) for lang, s in sections.items()}),
        )
    )
    return built
