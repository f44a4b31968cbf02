"""Independent, literal re-statements of datatrove 0.10.1's filter arithmetic (plain loops, joined strings),
used to check the vectorised signals. They take the words from the caller."""

from __future__ import annotations

import re
from collections import Counter

from pipeline.clean.filters.punctuation import PUNCTUATION_SET, TERMINAL_PUNCTUATION


def _duplicates(elements):
    seen, count, chars = set(), 0, 0
    for element in elements:
        if element in seen:
            count += 1
            chars += len(element)
        else:
            seen.add(element)
    return count, chars


def gopher_repetition(text: str, words: list[str], ngram_separator: str = "") -> dict:
    # datatrove joins duplicated n-grams with "" (so "... ." equals ". ..."); "\x00" compares word sequences.
    out = {}
    paragraphs = re.split(r"\n{2,}", text.strip())
    count, chars = _duplicates(paragraphs)
    out["dup_para_frac"], out["dup_para_char_frac"] = count / len(paragraphs), chars / len(text)
    lines = re.split("\n+", text)
    count, chars = _duplicates(lines)
    out["dup_line_frac"], out["dup_line_char_frac"] = count / len(lines), chars / len(text)
    for n in (2, 3, 4):
        grams = [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]
        if not grams:
            out[f"top_{n}_gram_char_frac"] = None
            continue
        gram, count = Counter(grams).most_common(1)[0]
        out[f"top_{n}_gram_char_frac"] = len(gram) * count / len(text)
    for n in range(5, 11):
        seen, repeated, index = set(), 0, 0
        while index < len(words) - n + 1:
            gram = ngram_separator.join(words[index : index + n])
            if gram in seen:
                repeated += len(gram) - len(ngram_separator) * (n - 1)
                index += n
            else:
                seen.add(gram)
                index += 1
        out[f"dup_{n}_gram_char_frac"] = repeated / len(text)
    return out


def gopher_quality(text: str, words: list[str], stop_words) -> dict:
    non_symbol = [w for w in words if any(ch not in PUNCTUATION_SET for ch in w)]
    lines = text.splitlines()
    return {
        "n_words": len(words),
        "n_non_symbol_words": len(non_symbol),
        # datatrove divides by zero here only when min_doc_words is off; the signal is then undefined.
        "avg_word_length": sum(len(w) for w in non_symbol) / len(non_symbol) if non_symbol else None,
        "hash_word_ratio": text.count("#") / len(words),
        "ellipsis_word_ratio": (text.count("...") + text.count("…")) / len(words),
        "bullet_lines_ratio": sum(s.lstrip().startswith("•") or s.lstrip().startswith("-") for s in lines)
        / len(lines),
        "ellipsis_lines_ratio": sum(s.rstrip().endswith("...") or s.rstrip().endswith("…") for s in lines)
        / len(lines),
        "alpha_words_ratio": sum(any(c.isalpha() for c in w) for w in words) / len(words),
        "n_stop_words": len(set(stop_words) & set(words)) if stop_words else None,
    }


def fineweb(text: str, words: list[str], short_line_length: int = 30) -> dict:
    lines = [line for line in text.split("\n") if line.strip() != ""]
    return {
        "lines": len(lines),
        "line_punct_ratio": sum(1 for line in lines if line.endswith(tuple(TERMINAL_PUNCTUATION)))
        / len(lines),
        "short_line_ratio": sum(1 for line in lines if len(line) <= short_line_length) / len(lines),
        "char_dup_ratio": _duplicates(lines)[1] / len(text.replace("\n", "")),
        "newline_word_ratio": text.count("\n") / len(words),
    }
