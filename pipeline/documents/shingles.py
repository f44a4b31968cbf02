"""Words and shingle hashes of texts, vectorised over Arrow string arrays with numpy.

Shared by near-duplicate detection (dedup's MinHash) and contamination checks (decontaminate's n-grams), so
both see the same words:

* tokens: NFKC, lower case, split on anything that is not a letter, number or combining mark; every Han,
  Hiragana or Katakana character is a token of its own, so CJK text gets character n-grams while text
  with spaces gets word n-grams;
* shingles: each run of n consecutive tokens. A document with fewer than n tokens has exactly one
  shingle, all of its tokens, so short documents match only documents with the same tokens instead of
  all colliding on an empty signature; a document with no token has no shingle;
* shingle hash: a polynomial hash mod 2^64 of the shingle's UTF-8 bytes (tokens joined by one space),
  finished with the splitmix64 mixer; computed for all shingles of a batch at once from prefix sums.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

U64 = np.uint64
MASK64 = (1 << 64) - 1
# RE2 classes (Arrow's regex engine). Han/kana have no spaces between words: one token per character.
CJK_CLASS = r"\p{Han}\p{Hiragana}\p{Katakana}"
_CJK_CHAR = f"([{CJK_CLASS}])"
NOT_WORD = r"[^\pL\pN\pM]+"
_SPACE = 32
# Odd multiplier of the shingle polynomial hash, and its inverse mod 2^64 (to shift a substring hash to 0).
POLY_BASE = 0x100000001B3 * 2 + 1
POLY_INVERSE = pow(POLY_BASE, -1, 1 << 64)
LENGTH_SALT = 0x9E3779B97F4A7C15


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection of uint64 that spreads every input bit over the output."""
    x = x ^ (x >> U64(30))
    x = x * U64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> U64(27))
    x = x * U64(0x94D049BB133111EB)
    return x ^ (x >> U64(31))


def normalize_for_dedup(texts: pa.Array) -> pa.Array:
    """Texts as space-separated tokens (see module doc); null becomes the empty string."""
    # Python's unicodedata, not pc.utf8_normalize: Arrow 25 leaves "å" decomposed under NFC and NFKC.
    texts = pa.array(
        [unicodedata.normalize("NFKC", text).lower() if text else "" for text in texts.to_pylist()],
        pa.large_string(),
    )
    texts = pc.replace_substring_regex(texts, _CJK_CHAR, r" \1 ")
    texts = pc.replace_substring_regex(texts, NOT_WORD, " ")
    return pc.utf8_trim(texts, " ")


def cjk_majority(normalized: pa.Array) -> np.ndarray:
    """True where most tokens of a normalised text are CJK characters."""
    cjk = pc.count_substring_regex(normalized, f"[{CJK_CLASS}]").to_numpy(zero_copy_only=False)
    spaces = pc.count_substring(normalized, " ").to_numpy(zero_copy_only=False)
    tokens = np.where(pc.utf8_length(normalized).to_numpy(zero_copy_only=False) > 0, spaces + 1, 0)
    return 2 * cjk > tokens


class _Powers:
    """POLY_BASE**i and POLY_INVERSE**i mod 2^64 for i < n, grown on demand and kept per process."""

    def __init__(self) -> None:
        self.forward: np.ndarray = np.ones(1, dtype=U64)
        self.inverse: np.ndarray = np.ones(1, dtype=U64)

    def get(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.forward) < n:
            size = max(n, 2 * len(self.forward))
            self.forward = np.cumprod(np.full(size, POLY_BASE, dtype=U64)) * U64(POLY_INVERSE)
            self.inverse = np.cumprod(np.full(size, POLY_INVERSE, dtype=U64)) * U64(POLY_BASE)
        return self.forward[:n], self.inverse[:n]


_POWERS = _Powers()


@dataclass
class Shingles:
    """Shingle hashes of a batch of texts: ``hashes[offsets[d]:offsets[d + 1]]`` belong to text d."""

    hashes: np.ndarray
    offsets: np.ndarray
    tokens: np.ndarray = field(repr=False)

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)


def _string_buffers(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    array = array.cast(pa.large_string())
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64)[array.offset : array.offset + len(array) + 1]
    data_buffer = array.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    return offsets, data


def shingle_hashes(normalized: pa.Array, ngram_sizes: np.ndarray) -> Shingles:
    """64-bit hashes of every shingle of every normalised text (``ngram_sizes``: n for each text)."""
    offsets, data = _string_buffers(normalized)
    n_docs = len(offsets) - 1
    if n_docs == 0:
        return Shingles(np.zeros(0, U64), np.zeros(1, np.int64), np.zeros(0, np.int64))
    begin, end = int(offsets[0]), int(offsets[-1])
    starts, ends = offsets[:-1], offsets[1:]
    nonempty = ends > starts
    spaces = np.flatnonzero(data[begin:end] == _SPACE) + begin
    n_tokens = np.where(nonempty, np.searchsorted(spaces, ends) - np.searchsorted(spaces, starts) + 1, 0)
    # Tokens are [token_start[i], token_end[i]); texts are contiguous, so sorting keeps text order. Each is two
    # sorted runs: the stable sort (Timsort for int64) finds them and merges in linear time.
    token_start = np.sort(np.concatenate([starts[nonempty], spaces + 1]), kind="stable")
    token_end = np.sort(np.concatenate([spaces, ends[nonempty]]), kind="stable")
    first_token = np.concatenate([[0], np.cumsum(n_tokens)])[:-1]

    width = np.minimum(ngram_sizes.astype(np.int64), n_tokens)
    n_shingles = np.where(n_tokens > 0, n_tokens - width + 1, 0)
    shingle_offsets = np.concatenate([[0], np.cumsum(n_shingles)])
    doc_of = np.repeat(np.arange(n_docs), n_shingles)
    local = np.arange(shingle_offsets[-1]) - shingle_offsets[:-1][doc_of]
    first = first_token[doc_of] + local
    left = token_start[first] - begin
    right = token_end[first + width[doc_of] - 1] - begin

    forward, inverse = _POWERS.get(end - begin + 1)
    prefix = np.zeros(end - begin + 1, dtype=U64)
    np.cumsum((data[begin:end].astype(U64) + U64(1)) * forward[: end - begin], out=prefix[1:])
    raw = (prefix[right] - prefix[left]) * inverse[left]
    lengths = (right - left).astype(U64)
    hashes = mix64(raw ^ (lengths * U64(LENGTH_SALT)))
    return Shingles(hashes, shingle_offsets.astype(np.int64), n_tokens.astype(np.int64))
