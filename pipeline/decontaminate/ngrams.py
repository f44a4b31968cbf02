"""Word n-grams of evaluation items and of documents, the index that holds the first, and the matching.

Normalisation is dedup's (``pipeline.documents.shingles.normalize_for_dedup``): NFKC, lower case, every run of
characters that are not letters, digits or marks is one separator, and each Han, Hiragana or Katakana
character is a word of its own. So case, punctuation and whitespace changes do not hide an item, and Chinese
is matched by characters. An n-gram is ``ngram_size`` consecutive words; an item shorter than that but at
least ``min_ngram_size`` words long is one n-gram of its own length (GPT-3, NeMo Curator).

Each n-gram has two independent 64-bit hashes: the polynomial hash dedup computes for all shingles of a batch
at once (``shingle_hashes``, the index key) and a BLAKE2b of its text (``check``). A key hit is confirmed by the
check, so a 64-bit collision between a document's n-gram and the index (likely at corpus scale) is never a
false match. The index is small enough to broadcast in most uses (sorted arrays, ``NgramIndex``); a larger one
is summarised as a Bloom filter for the workers and the few candidates are joined with it in Spark.
"""

from __future__ import annotations

import functools
import hashlib
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.documents.shingles import CJK_CLASS, NOT_WORD, U64, mix64, normalize_for_dedup, shingle_hashes

INDEX_SCHEMA = pa.schema(
    [
        ("hash", pa.int64()),
        ("check", pa.int64()),
        ("set_order", pa.int32()),
        ("width", pa.int32()),
        ("prefix", pa.int64()),  # the shingle hash of the n-gram's first min_ngram_size words
    ]
)


def check_hash(ngram: str) -> int:
    """The second, independent hash of an n-gram's normalised text (signed, as Spark's LongType)."""
    return int.from_bytes(hashlib.blake2b(ngram.encode(), digest_size=8).digest(), "little", signed=True)


@dataclass
class Shingled:
    """Every n-gram of a batch of texts for one width: ``hashes[offsets[d]:offsets[d + 1]]`` are text d's, in
    word order (the i-th starts at word i); a text shorter than the width has one, all its words."""

    normalized: pa.Array
    hashes: np.ndarray  # int64
    offsets: np.ndarray
    width: int
    _words: dict[int, list[str]] = field(default_factory=dict)

    def words(self, doc: int) -> list[str]:
        """A text's normalised words, split only for the texts that need them (a hit, an item)."""
        if doc not in self._words:
            text = self.normalized[doc].as_py()
            self._words[doc] = text.split(" ") if text else []
        return self._words[doc]

    def ngram(self, doc: int, local: int) -> str:
        return " ".join(self.words(doc)[local : local + self.width])


_ASCII_NOT_WORD = r"[^a-z0-9]+"


def normalize_words(texts: Sequence[str | None]) -> pa.Array:
    """``normalize_for_dedup`` of each text, faster where a text is ASCII: there NFKC changes nothing and no
    character is CJK, so lower case and one RE2 pass give the same words (held to it by a property test)."""
    strings = [text or "" for text in texts]
    plain = [row for row, text in enumerate(strings) if text.isascii()]
    if not plain:
        return normalize_for_dedup(pa.array(strings, pa.string()))
    lowered = pa.array([strings[row].lower() for row in plain], pa.large_string())
    fast = pc.utf8_trim(pc.replace_substring_regex(lowered, _ASCII_NOT_WORD, " "), " ")
    if len(plain) == len(strings):
        return fast
    other = [row for row, text in enumerate(strings) if not text.isascii()]
    slow = normalize_for_dedup(pa.array([strings[row] for row in other], pa.string())).cast(pa.large_string())
    back = np.argsort(np.array(plain + other, dtype=np.int64), kind="stable")
    return pa.concat_arrays([fast.cast(pa.large_string()), slow]).take(pa.array(back))


def shingle(texts: Sequence[str | None], width: int, normalized: pa.Array | None = None) -> Shingled:
    if normalized is None:
        normalized = normalize_words(texts)
    found = shingle_hashes(normalized, np.full(len(normalized), width, dtype=np.int64))
    return Shingled(normalized, found.hashes.view(np.int64), found.offsets, width)


def item_ngram_rows(
    texts: Sequence[str], set_orders: Sequence[int], ngram_size: int, min_ngram_size: int
) -> tuple[pa.RecordBatch, list[int]]:
    """INDEX_SCHEMA rows for every n-gram of every item, and per item how many it gave (0: too short)."""
    shingled = shingle(texts, ngram_size)
    # The n-gram starting at word i begins with the min_ngram_size-gram starting there: its prefix.
    prefixes = shingle(texts, min_ngram_size, shingled.normalized)
    hashes, checks, orders, widths, prefix, per_item = [], [], [], [], [], []
    for item in range(len(texts)):
        words = shingled.words(item)
        if len(words) < min_ngram_size:
            per_item.append(0)
            continue
        width = min(ngram_size, len(words))
        lo, hi = int(shingled.offsets[item]), int(shingled.offsets[item + 1])
        first_prefix = int(prefixes.offsets[item])
        per_item.append(hi - lo)
        for local in range(hi - lo):
            hashes.append(int(shingled.hashes[lo + local]))
            checks.append(check_hash(" ".join(words[local : local + width])))
            orders.append(set_orders[item])
            widths.append(width)
            prefix.append(int(prefixes.hashes[first_prefix + local]))
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(hashes, pa.int64()),
            pa.array(checks, pa.int64()),
            pa.array(orders, pa.int32()),
            pa.array(widths, pa.int32()),
            pa.array(prefix, pa.int64()),
        ],
        schema=INDEX_SCHEMA,
    )
    return batch, per_item


@dataclass(frozen=True)
class Match:
    start: int  # first word
    width: int  # words
    set_order: int
    ngram: str


@dataclass
class NgramIndex:
    """The evaluation n-grams, broadcast to the workers whole.

    Matching hashes each document's ``prefix_size``-grams once (every indexed n-gram, whatever its width,
    starts with one), keeps the positions whose hash is an indexed prefix, and confirms each candidate by the
    BLAKE2b of the candidate n-gram's text, looked up among the index's checks: one hashing pass per
    document, whatever the widths, and no false match."""

    prefixes: np.ndarray  # int64, sorted, unique
    checks: np.ndarray  # int64, sorted
    set_orders: np.ndarray  # aligned with checks
    widths: tuple[int, ...]
    prefix_size: int

    @classmethod
    def from_columns(cls, columns: Mapping[str, Sequence], prefix_size: int) -> NgramIndex:
        """From INDEX_SCHEMA columns (``item_ngram_rows(...).to_pydict()``, or the rows collected in Spark)."""
        checks = np.asarray(columns["check"], dtype=np.int64)
        order = np.argsort(checks, kind="stable")
        return cls(
            np.unique(np.asarray(columns["prefix"], dtype=np.int64)),
            checks[order],
            np.asarray(columns["set_order"], dtype=np.int32)[order],
            tuple(sorted({int(w) for w in columns["width"]}, reverse=True)),
            prefix_size,
        )

    def __len__(self) -> int:
        return len(self.checks)

    def matches(self, texts: Sequence[str | None]) -> list[list[Match]]:
        """Every confirmed match in every text, in word order."""
        found: list[list[Match]] = [[] for _ in texts]
        if not len(self.checks):
            return found
        shingled = shingle(texts, self.prefix_size)
        position = np.minimum(np.searchsorted(self.prefixes, shingled.hashes), len(self.prefixes) - 1)
        candidates = np.flatnonzero(self.prefixes[position] == shingled.hashes)
        owner = np.searchsorted(shingled.offsets, candidates, side="right") - 1
        # Every candidate n-gram's text and check first, then one sorted lookup of all the checks.
        spans: list[tuple[int, int, int, str]] = []  # (doc, start, width, ngram)
        for candidate, doc in zip(candidates.tolist(), owner.tolist(), strict=True):
            local = candidate - int(shingled.offsets[doc])
            words = shingled.words(doc)
            if len(words) < self.prefix_size:  # one shingle of all its words: shorter than any n-gram
                continue
            for width in self.widths:
                if local + width <= len(words):
                    spans.append((doc, local, width, " ".join(words[local : local + width])))
        checks = np.fromiter((check_hash(span[3]) for span in spans), dtype=np.int64, count=len(spans))
        entries = np.minimum(np.searchsorted(self.checks, checks), len(self.checks) - 1)
        for row in np.flatnonzero(self.checks[entries] == checks).tolist():
            doc, local, width, ngram = spans[row]
            found[doc].append(Match(local, width, int(self.set_orders[entries[row]]), ngram))
        for matches in found:
            matches.sort(key=lambda m: (m.start, m.width))
        return found


class BloomFilter:
    """A bit array with k probes per key (double hashing of the 64-bit n-gram hash), for indexes too large to
    broadcast whole: a worker keeps only the n-grams that may be in the index."""

    def __init__(self, bits: np.ndarray, probes: int) -> None:
        self.bits = bits  # uint64 words
        self.probes = probes

    @classmethod
    def sized(cls, entries: int, bits_per_entry: int = 12) -> BloomFilter:
        words = max(1, (entries * bits_per_entry + 63) // 64)
        return cls(np.zeros(words, dtype=np.uint64), max(1, round(bits_per_entry * 0.693)))

    def _positions(self, keys: np.ndarray) -> np.ndarray:
        size = U64(len(self.bits) * 64)
        h1 = keys.view(np.uint64)
        h2 = mix64(h1 ^ U64(0x9E3779B97F4A7C15)) | U64(1)
        return np.stack([(h1 + U64(i) * h2) % size for i in range(self.probes)])

    def add(self, keys: np.ndarray) -> None:
        positions = self._positions(np.asarray(keys, dtype=np.int64)).ravel()
        np.bitwise_or.at(self.bits, positions // U64(64), U64(1) << (positions % U64(64)))

    def may_contain(self, keys: np.ndarray) -> np.ndarray:
        keys = np.asarray(keys, dtype=np.int64)
        if not keys.size:
            return np.zeros(0, dtype=bool)
        positions = self._positions(keys)
        present = (self.bits[positions // U64(64)] >> (positions % U64(64))) & U64(1)
        return np.asarray(present.astype(bool).all(axis=0))


def candidate_rows(
    ids: Sequence[str], texts: Sequence[str | None], bloom: BloomFilter, widths: Sequence[int]
) -> dict[str, list]:
    """For the join path: (id, start, width, hash, check, ngram) of every n-gram the Bloom filter may hold."""
    rows: dict[str, list] = {"id": [], "start": [], "width": [], "hash": [], "check": [], "ngram": []}
    normalized = normalize_words(texts)
    for width in widths:
        shingled = shingle(texts, width, normalized)
        hits = np.flatnonzero(bloom.may_contain(shingled.hashes))
        owner = np.searchsorted(shingled.offsets, hits, side="right") - 1
        for hit, doc in zip(hits.tolist(), owner.tolist(), strict=True):
            if len(shingled.words(doc)) < width:
                # A text shorter than the width is one shingle of all its words: that n-gram is looked up
                # under its own width, if the index has it, and is counted there once.
                continue
            local = hit - int(shingled.offsets[doc])
            ngram = shingled.ngram(doc, local)
            rows["id"].append(ids[doc])
            rows["start"].append(local)
            rows["width"].append(width)
            rows["hash"].append(int(shingled.hashes[hit]))
            rows["check"].append(check_hash(ngram))
            rows["ngram"].append(ngram)
    return rows


# --- cutting spans out (mode cut) ----------------------------------------------------------------------------

_SEPARATOR, _WORD, _CJK = 0, 1, 2


@functools.lru_cache(maxsize=65536)
def _char_class(char: str) -> int:
    """What ``normalize_for_dedup`` makes of one normalised character, by its own RE2 classes (not Python's
    Unicode tables or character names, which disagree on marks like 々 and ー)."""
    one = pa.array([char], pa.string())
    if pc.match_substring_regex(one, NOT_WORD)[0].as_py():
        return _SEPARATOR
    return _CJK if pc.match_substring_regex(one, f"^[{CJK_CLASS}]$")[0].as_py() else _WORD


def word_spans(text: str) -> tuple[list[str], list[tuple[int, int]]]:
    """The normalised words of ``text`` and each one's (start, end) in the original text. Each base character
    and its combining marks are normalised together, as NFKC of the whole text would, and lower case is taken
    of the whole normalised text (a final sigma depends on its neighbours), as ``normalize_for_dedup`` does."""
    folded: list[str] = []
    sources: list[tuple[int, int]] = []
    index = 0
    while index < len(text):
        end = index + 1
        while end < len(text) and unicodedata.category(text[end])[0] == "M":
            end += 1
        for char in unicodedata.normalize("NFKC", text[index:end]):
            folded.append(char)
            sources.append((index, end))
        index = end
    lowered = "".join(folded).lower()

    words: list[str] = []
    spans: list[tuple[int, int]] = []
    current: list[str] = []
    start = last_end = 0

    def close() -> None:
        if current:
            words.append("".join(current))
            spans.append((start, last_end))
            current.clear()

    position = 0
    for char, (lo, hi) in zip(folded, sources, strict=True):
        width = len(char.lower())  # one character except U+0130, whose lower case is two
        for low in lowered[position : position + width]:
            kind = _char_class(low)
            if kind == _SEPARATOR:
                close()
            elif kind == _CJK:
                close()
                words.append(low)
                spans.append((lo, hi))
            else:
                if not current:
                    start = lo
                current.append(low)
                last_end = hi
        position += width
    close()
    return words, spans


def cut_spans(text: str, matches: Sequence[Match], margin: int, min_piece: int) -> list[str] | None:
    """The pieces of ``text`` left after removing every match (plus ``margin`` characters each side), those of at
    least ``min_piece`` characters; None when the words cannot be mapped back to the text (then drop it)."""
    words, spans = word_spans(text)
    if " ".join(words) != normalize_for_dedup(pa.array([text], pa.string()))[0].as_py():
        return None
    removed = []
    for match in matches:
        first, last = spans[match.start], spans[match.start + match.width - 1]
        removed.append((max(0, first[0] - margin), min(len(text), last[1] + margin)))
    removed.sort()
    merged: list[list[int]] = []
    for lo, hi in removed:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    pieces, position = [], 0
    for lo, hi in merged:
        pieces.append(text[position:lo])
        position = hi
    pieces.append(text[position:])
    return [piece.strip() for piece in pieces if len(piece.strip()) >= max(1, min_piece)]
