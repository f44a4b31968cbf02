"""MinHash signatures and exact Jaccard over Arrow string arrays, vectorised with numpy.

A text becomes tokens, shingles, 64-bit shingle hashes (``pipeline.documents.shingles``) and then a
signature:

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

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.documents.shingles import (
    LENGTH_SALT,
    MASK64,
    U64,
    Shingles,
    cjk_majority,
    mix64,
    normalize_for_dedup,
    shingle_hashes,
)

# Bytes of text hashed in one pass; bounds the prefix-sum arrays whatever the batch size.
MAX_BYTES_PER_PASS = 8 << 20
# Elements of the (shingles x permutations) matrix per chunk: 4M x 8 bytes = 32 MB.
MATRIX_ELEMENTS = 4 << 20
EMPTY_SIGNATURE = MASK64


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
