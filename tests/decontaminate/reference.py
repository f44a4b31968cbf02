"""An independent brute-force decontamination: words from Unicode categories one character at a time, n-grams
as tuples in a Python set. No hashing, no numpy, no Arrow: what the stage must agree with."""

from __future__ import annotations

import unicodedata

CJK_PREFIXES = ("CJK UNIFIED IDEOGRAPH", "HIRAGANA", "KATAKANA")


def words(text: str) -> list[str]:
    text = unicodedata.normalize("NFKC", text).lower()
    found, current = [], ""
    for char in text:
        if unicodedata.category(char)[0] not in "LNM":
            if current:
                found.append(current)
            current = ""
        elif unicodedata.name(char, "").startswith(CJK_PREFIXES):
            if current:
                found.append(current)
            found.append(char)
            current = ""
        else:
            current += char
    if current:
        found.append(current)
    return found


def item_ngrams(items: list[str], n: int, min_n: int) -> set[tuple[str, ...]]:
    grams: set[tuple[str, ...]] = set()
    for item in items:
        tokens = words(item)
        if len(tokens) < min_n:
            continue
        width = min(n, len(tokens))
        grams.update(tuple(tokens[i : i + width]) for i in range(len(tokens) - width + 1))
    return grams


def contaminated(text: str, grams: set[tuple[str, ...]]) -> bool:
    tokens = words(text)
    widths = {len(g) for g in grams}
    return any(tuple(tokens[i : i + w]) in grams for w in widths for i in range(max(0, len(tokens) - w + 1)))


def shared_grams(text: str, grams: set[tuple[str, ...]]) -> set[tuple[str, ...]]:
    """The item n-grams a text holds."""
    tokens = words(text)
    widths = {len(g) for g in grams}
    return {tuple(tokens[i : i + w]) for w in widths for i in range(max(0, len(tokens) - w + 1))} & grams


def contaminated_with_cap(texts: list[str], grams: set[tuple[str, ...]], cap: int) -> list[bool]:
    """A text is contaminated when it holds an item n-gram that at most ``cap`` of the texts hold."""
    held = [shared_grams(text, grams) for text in texts]
    documents: dict[tuple[str, ...], int] = {}
    for found in held:
        for gram in found:
            documents[gram] = documents.get(gram, 0) + 1
    return [any(documents[gram] <= cap for gram in found) for found in held]
