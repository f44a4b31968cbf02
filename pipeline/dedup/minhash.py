"""MinHash signatures and exact Jaccard over Arrow string arrays, vectorised with numpy.

A text becomes tokens, shingles, 64-bit shingle hashes and then a signature:

* tokens: NFKC, lower case, split on anything that is not a letter, number or combining mark; every Han,
  Hiragana or Katakana character is a token of its own, so CJK text gets character n-grams while text
  with spaces gets word n-grams (``ngram_size`` words, ``cjk_ngram_size`` characters when most tokens
  of a document are CJK characters);
* shingles: each run of n consecutive tokens. A document with fewer than n tokens has exactly one
  shingle, all of its tokens, so short documents match only documents with the same tokens instead of
  all colliding on an empty signature; a document with no token has no shingle and no signature;
* shingle hash: a polynomial hash mod 2^64 of the shingle's UTF-8 bytes (tokens joined by one space),
  finished with the splitmix64 mixer; computed for all shingles of a batch at once from prefix sums;
* signature: for each of K seeded permutations x -> a*x + b (mod 2^64, a odd: a bijection of the 64-bit
  space) the smallest permuted shingle hash, computed as one (shingles x K) matrix per chunk and reduced
  per document with ``np.minimum.reduceat``; no Python loop over documents or permutations.

All constants come from ``seed``, so signatures are identical on every worker and every run.
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
# Bytes of text hashed in one pass; bounds the prefix-sum arrays whatever the batch size.
MAX_BYTES_PER_PASS = 8 << 20
# Elements of the (shingles x permutations) matrix per chunk: 4M x 8 bytes = 32 MB.
MATRIX_ELEMENTS = 4 << 20
EMPTY_SIGNATURE = MASK64


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


def permutation_parameters(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) of the permutations x -> a*x + b mod 2^64; a is odd, so each one is a bijection."""
    rng = np.random.Generator(np.random.PCG64(seed))
    a = rng.integers(0, 1 << 64, size=num_perm, dtype=U64, endpoint=False) | U64(1)
    b = rng.integers(0, 1 << 64, size=num_perm, dtype=U64, endpoint=False)
    return a, b


def minhash_signatures(shingles: Shingles, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(documents x permutations) minimum of a*x + b over each document's shingles; all-ones when none."""
    n_docs = len(shingles.offsets) - 1
    num_perm = len(a)
    signatures = np.full((n_docs, num_perm), EMPTY_SIGNATURE, dtype=U64)
    total = len(shingles.hashes)
    if total == 0:
        return signatures
    doc_of = np.repeat(np.arange(n_docs), shingles.counts)
    chunk = max(1, MATRIX_ELEMENTS // num_perm)
    buffer = np.empty((min(chunk, total), num_perm), dtype=U64)
    for lo in range(0, total, chunk):
        hi = min(lo + chunk, total)
        permuted = buffer[: hi - lo]
        np.multiply(shingles.hashes[lo:hi, None], a[None, :], out=permuted)
        permuted += b[None, :]
        docs = doc_of[lo:hi]
        segment = np.concatenate([[0], np.flatnonzero(docs[1:] != docs[:-1]) + 1])
        minima = np.minimum.reduceat(permuted, segment, axis=0)
        owners = docs[segment]
        signatures[owners] = np.minimum(signatures[owners], minima)
    return signatures


def band_multipliers(rows: int, seed: int) -> np.ndarray:
    rng = np.random.Generator(np.random.PCG64([seed, rows, 0xBA4D]))
    return rng.integers(0, 1 << 64, size=rows, dtype=U64) | U64(1)


def band_hashes(signatures: np.ndarray, bands: int, rows: int, seed: int) -> np.ndarray:
    """(documents x bands) 64-bit keys: documents share a key in band i when their rows there are equal."""
    n_docs = signatures.shape[0]
    grouped = signatures[:, : bands * rows].reshape(n_docs, bands, rows)
    combined = (grouped * band_multipliers(rows, seed)[None, None, :]).sum(axis=2, dtype=U64)
    return mix64(combined + np.arange(bands, dtype=U64)[None, :] * U64(LENGTH_SALT))


def jaccard_pairs(left: Shingles, right: Shingles) -> np.ndarray:
    """Exact Jaccard similarity of the shingle sets of left[i] and right[i], for every i at once.

    Two texts without any shingle are identical for our purpose (similarity 1.0); one empty set gives 0.
    """
    n = len(left.offsets) - 1
    if n != len(right.offsets) - 1:
        raise ValueError(f"jaccard_pairs needs as many left as right texts ({n} != {len(right.offsets) - 1})")
    owner = np.concatenate(
        [np.repeat(np.arange(n), left.counts), np.repeat(np.arange(n), right.counts)]
    ).astype(np.int64)
    side = np.concatenate([np.zeros(len(left.hashes), np.int8), np.ones(len(right.hashes), np.int8)])
    values = np.concatenate([left.hashes, right.hashes])
    order = np.lexsort((side, values, owner))
    owner, side, values = owner[order], side[order], values[order]
    # A set keeps one copy of a repeated shingle: drop entries equal to the previous one on the same side.
    fresh = np.ones(len(values), dtype=bool)
    fresh[1:] = (owner[1:] != owner[:-1]) | (values[1:] != values[:-1]) | (side[1:] != side[:-1])
    owner, side, values = owner[fresh], side[fresh], values[fresh]
    sizes = np.bincount(owner, minlength=n)
    shared = np.zeros(len(values), dtype=bool)
    shared[1:] = (owner[1:] == owner[:-1]) & (values[1:] == values[:-1])
    intersection = np.bincount(owner[shared], minlength=n)
    union = sizes - intersection
    return np.where(union > 0, intersection / np.maximum(union, 1), 1.0)


@dataclass(frozen=True)
class MinHasher:
    """Everything a worker needs to turn texts into shingles, signatures and band keys."""

    ngram_size: int
    cjk_ngram_size: int
    bands: int
    rows: int
    seed: int

    @property
    def num_perm(self) -> int:
        return self.bands * self.rows

    def shingles(self, texts: pa.Array) -> Shingles:
        return self.shingles_of_normalized(normalize_for_dedup(texts))

    def shingles_of_normalized(self, normalized: pa.Array) -> Shingles:
        """Shingles of texts already through ``normalize_for_dedup``."""
        parts = [self._shingles_one_pass(piece) for piece in _slices_by_bytes(normalized)]
        if len(parts) == 1:
            return parts[0]
        offsets = [parts[0].offsets]
        for part in parts[1:]:
            offsets.append(part.offsets[1:] + offsets[-1][-1])
        return Shingles(
            np.concatenate([p.hashes for p in parts]),
            np.concatenate(offsets),
            np.concatenate([p.tokens for p in parts]),
        )

    def _shingles_one_pass(self, normalized: pa.Array) -> Shingles:
        sizes = np.where(cjk_majority(normalized), self.cjk_ngram_size, self.ngram_size)
        return shingle_hashes(normalized, sizes)

    def signatures(self, shingles: Shingles) -> np.ndarray:
        a, b = permutation_parameters(self.num_perm, self.seed)
        return minhash_signatures(shingles, a, b)

    def band_keys(self, signatures: np.ndarray) -> np.ndarray:
        return band_hashes(signatures, self.bands, self.rows, self.seed)


def _slices_by_bytes(texts: pa.Array) -> list[pa.Array]:
    """Consecutive slices of at most MAX_BYTES_PER_PASS bytes of text (at least one text each)."""
    if len(texts) == 0:
        return [texts]
    sizes = pc.fill_null(pc.binary_length(texts.cast(pa.large_string())), 0).to_numpy(zero_copy_only=False)
    ends = np.cumsum(sizes)
    pieces, lo = [], 0
    while lo < len(texts):
        hi = int(np.searchsorted(ends, (ends[lo - 1] if lo else 0) + MAX_BYTES_PER_PASS, side="right"))
        hi = max(hi, lo + 1)
        pieces.append(texts.slice(lo, hi - lo))
        lo = hi
    return pieces
