"""Plain-Python references written from the specs in pipeline/documents/shingles.py and pipeline/dedup/minhash.py,
one character at a time.

They share no code with the vectorised implementation (no Arrow regex, no numpy): Python's unicodedata
for tokens, Python ints for the 64-bit arithmetic, sets for Jaccard, union-find for components.
"""

from __future__ import annotations

import unicodedata

from pipeline.documents.shingles import LENGTH_SALT, POLY_BASE

M64 = (1 << 64) - 1
# The scripts tests draw from: CJK Unified Ideographs, Hiragana, Katakana (the prolonged sound mark
# U+30FC is script Common, a letter of a word like any other).
CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x3041, 0x3096), (0x309D, 0x309F), (0x30A1, 0x30FA))


def is_cjk(ch: str) -> bool:
    return any(lo <= ord(ch) <= hi for lo, hi in CJK_RANGES)


def tokens(text: str) -> list[str]:
    text = unicodedata.normalize("NFKC", text).lower()
    out: list[str] = []
    word = ""
    for ch in text:
        if is_cjk(ch):
            if word:
                out.append(word)
                word = ""
            out.append(ch)
        elif unicodedata.category(ch)[0] in "LNM":
            word += ch
        elif word:
            out.append(word)
            word = ""
    if word:
        out.append(word)
    return out


def ngram_size(toks: list[str], words: int = 5, chars: int = 5) -> int:
    cjk = sum(1 for t in toks if len(t) == 1 and is_cjk(t))
    return chars if 2 * cjk > len(toks) else words


def shingles(text: str, words: int = 5, chars: int = 5) -> list[str]:
    """Shingles as strings (tokens joined by one space), in order, repeats kept."""
    toks = tokens(text)
    if not toks:
        return []
    n = ngram_size(toks, words, chars)
    if len(toks) < n:
        return [" ".join(toks)]
    return [" ".join(toks[i : i + n]) for i in range(len(toks) - n + 1)]


def jaccard(a: str, b: str, words: int = 5, chars: int = 5) -> float:
    sa, sb = set(shingles(a, words, chars)), set(shingles(b, words, chars))
    union = sa | sb
    return len(sa & sb) / len(union) if union else 1.0


def mix64(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def shingle_hash(shingle: str) -> int:
    data = shingle.encode()
    h, power = 0, 1
    for byte in data:
        h = (h + (byte + 1) * power) & M64
        power = (power * POLY_BASE) & M64
    return mix64(h ^ ((len(data) * LENGTH_SALT) & M64))


def signature(text: str, a: list[int], b: list[int], words: int = 5, chars: int = 5) -> list[int]:
    hashes = [shingle_hash(s) for s in shingles(text, words, chars)]
    if not hashes:
        return [M64] * len(a)
    return [min((ai * x + bi) & M64 for x in hashes) for ai, bi in zip(a, b, strict=True)]


class UnionFind:
    def __init__(self) -> None:
        self.parent: dict = {}

    def find(self, x):
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, x, y) -> None:
        rx, ry = self.find(x), self.find(y)
        if rx != ry:
            self.parent[max(rx, ry)] = min(rx, ry)

    def components(self) -> dict:
        """node -> smallest node of its component."""
        groups: dict = {}
        for node in list(self.parent):
            groups.setdefault(self.find(node), []).append(node)
        return {node: min(members) for members in groups.values() for node in members}
