"""The vectorised MinHash path against plain-Python references; no Spark."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.dedup import minhash
from pipeline.dedup.minhash import EMPTY_SIGNATURE, MinHasher, jaccard_pairs, permutation_parameters
from tests.dedup import reference
from tests.dedup.synthetic import WordSource, near_copy

# Letters, digits, punctuation, spaces and line breaks, accented Latin, Han, Hiragana, Katakana.
ALPHABET = st.sampled_from(
    list("abcdefghijXYZ0123456789 .,;!?-'\n\t")
    + list("éñßøÅ")
    + list("東京大学日本語中文字")
    + list("あいうえおアイウエオー")
)
TEXTS = st.text(ALPHABET, max_size=120)
HASHER = MinHasher(ngram_size=3, cjk_ngram_size=2, bands=4, rows=3, seed=7)


def words(seed: int, count: int) -> str:
    rng = random.Random(seed)
    return " ".join(WordSource(rng, 2000).draw(count))


@settings(max_examples=150, deadline=None)
@given(st.lists(TEXTS, min_size=1, max_size=6))
def test_shingle_hashes_match_reference(texts):
    shingles = HASHER.shingles(pa.array(texts))
    for i, text in enumerate(texts):
        got = shingles.hashes[shingles.offsets[i] : shingles.offsets[i + 1]].tolist()
        expected = [reference.shingle_hash(s) for s in reference.shingles(text, 3, 2)]
        assert got == expected, (text, reference.shingles(text, 3, 2))
        assert shingles.tokens[i] == len(reference.tokens(text))


@settings(max_examples=60, deadline=None)
@given(st.lists(TEXTS, min_size=1, max_size=5))
def test_signatures_match_reference(texts):
    a, b = permutation_parameters(HASHER.num_perm, HASHER.seed)
    signatures = HASHER.signatures(HASHER.shingles(pa.array(texts)))
    for i, text in enumerate(texts):
        assert signatures[i].tolist() == reference.signature(text, a.tolist(), b.tolist(), 3, 2)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(TEXTS, TEXTS), min_size=1, max_size=6))
def test_jaccard_pairs_match_set_jaccard(pairs):
    left = HASHER.shingles(pa.array([p[0] for p in pairs]))
    right = HASHER.shingles(pa.array([p[1] for p in pairs]))
    got = jaccard_pairs(left, right)
    for value, (x, y) in zip(got, pairs, strict=True):
        assert value == pytest.approx(reference.jaccard(x, y, 3, 2), abs=1e-12)


def test_signature_of_a_text_does_not_depend_on_its_batch(monkeypatch):
    texts = [words(seed, random.Random(seed).randint(0, 300)) for seed in range(40)] + [None, ""]
    hasher = MinHasher(5, 5, 16, 8, seed=1234)
    alone = np.stack([hasher.signatures(hasher.shingles(pa.array([t], pa.string())))[0] for t in texts])
    # Small passes and small matrix chunks split documents across chunks; the result must not move.
    monkeypatch.setattr(minhash, "MAX_BYTES_PER_PASS", 700)
    monkeypatch.setattr(minhash, "MATRIX_ELEMENTS", 128 * 37)
    together = hasher.signatures(hasher.shingles(pa.array(texts, pa.string())))
    np.testing.assert_array_equal(together, alone)
    assert (together[-2:] == EMPTY_SIGNATURE).all(), "no token, no signature"


def test_minhash_agreement_estimates_jaccard():
    rng = random.Random(5)
    source = WordSource(rng, 5000)
    hasher = MinHasher(5, 5, 32, 16, seed=99)
    for target in (0.3, 0.5, 0.7, 0.8, 0.9):
        base = source.draw(400)
        copy = near_copy(base, target, source)
        texts = pa.array([" ".join(base), " ".join(copy)])
        signatures = hasher.signatures(hasher.shingles(texts))
        estimate = float(np.mean(signatures[0] == signatures[1]))
        truth = reference.jaccard(texts[0].as_py(), texts[1].as_py())
        # 512 permutations: standard error sqrt(J(1-J)/512) <= 0.023; five of them stay within 0.1.
        assert abs(estimate - truth) < 0.1, (target, truth, estimate)


def test_short_documents_do_not_collide():
    hasher = MinHasher(5, 5, 16, 8, seed=3)
    texts = ["hello world", "Hello, World!", "goodbye world", "a b c d", "one", "x", "", "!!!"]
    shingles = hasher.shingles(pa.array(texts))
    assert shingles.counts.tolist() == [1, 1, 1, 1, 1, 1, 0, 0]
    keys = hasher.band_keys(hasher.signatures(shingles))
    assert (keys[0] == keys[1]).all(), "same tokens: same signature"
    for i in range(2, 6):
        for j in range(i):
            assert not (keys[i] == keys[j]).any(), (texts[i], texts[j])


def test_cjk_text_gets_character_ngrams():
    hasher = MinHasher(5, 3, 4, 2, seed=3)
    chinese = "东京大学是日本最好的大学之一。它位于东京。"
    shingles = hasher.shingles(pa.array([chinese, "Tokyo is a city in Japan", "東京タワー は 高い です"]))
    toks = reference.tokens(chinese)
    assert len(toks) == 19 and all(len(t) == 1 for t in toks)
    assert shingles.counts.tolist() == [
        19 - 3 + 1,
        6 - 5 + 1,
        len(reference.shingles("東京タワー は 高い です", 5, 3)),
    ]
    edited = chinese.replace("最好", "很好")
    got = jaccard_pairs(hasher.shingles(pa.array([chinese])), hasher.shingles(pa.array([edited])))[0]
    assert got == pytest.approx(reference.jaccard(chinese, edited, 5, 3))
    assert 0.5 < got < 1.0


def test_band_keys_equal_exactly_when_band_rows_are_equal():
    rng = np.random.default_rng(11)
    signatures = rng.integers(0, 1 << 63, size=(50, 12), dtype=np.uint64)
    signatures[1] = signatures[0]
    signatures[2, :3] = signatures[0, :3]  # same first band only
    keys = minhash.band_hashes(signatures, bands=4, rows=3, seed=1)
    assert (keys[1] == keys[0]).all()
    assert keys[2, 0] == keys[0, 0] and not (keys[2, 1:] == keys[0, 1:]).any()
    # Same rows in different bands must not give the same key.
    signatures[3] = np.tile(signatures[0, :3], 4)
    keys = minhash.band_hashes(signatures, bands=4, rows=3, seed=1)
    assert len(set(keys[3].tolist())) == 4
    assert len(set(keys[4:].ravel().tolist())) == keys[4:].size


def test_permutations_are_seeded_and_odd():
    a1, b1 = permutation_parameters(64, 1)
    a2, b2 = permutation_parameters(64, 1)
    a3, _ = permutation_parameters(64, 2)
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(b1, b2)
    assert not np.array_equal(a1, a3)
    assert (a1 & np.uint64(1) == 1).all(), "odd multipliers make x -> a*x + b a bijection"


def test_jaccard_pairs_rejects_mismatched_sides():
    with pytest.raises(ValueError, match="as many left as right"):
        jaccard_pairs(HASHER.shingles(pa.array(["a"])), HASHER.shingles(pa.array(["a", "b"])))
