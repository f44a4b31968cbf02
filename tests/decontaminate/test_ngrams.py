"""The n-gram index and matching, against planted contaminations and an independent brute-force reference."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.decontaminate.ngrams import BloomFilter, NgramIndex, cut_spans, item_ngram_rows, word_spans
from tests.decontaminate import reference

VOCABULARY = [f"w{i}" for i in range(40)] + ["Café", "naïve", "über", "東", "京", "α"]
ITEMS = [
    "What is the boiling point of water at sea level in degrees Celsius? The answer is one hundred degrees.",
    "Which planet in our solar system is known as the red planet and has two small moons called Phobos and Deimos?",
    "The mitochondria is the powerhouse of the cell, producing most of the chemical energy needed for biochemical reactions.",
]


def index_of(items: list[str], n: int = 13, min_n: int = 8) -> NgramIndex:
    rows, _ = item_ngram_rows(items, [0] * len(items), n, min_n)
    columns = rows.to_pydict()
    return NgramIndex.from_columns(columns, min_n)


def disguise(text: str, rng: random.Random) -> str:
    """Case, punctuation and whitespace changes, as a copy on a web page makes them."""
    out = []
    for word in text.split():
        word = word.upper() if rng.random() < 0.3 else word.lower() if rng.random() < 0.5 else word
        out.append(word.strip("?,.") + rng.choice(["", ",", ";", " -", "...", "!"]))
    return rng.choice(["\n", "  ", "\t"]).join(out) if rng.random() < 0.5 else "  ".join(out)


def filler(rng: random.Random, words: int) -> str:
    return " ".join(
        rng.choice(["river", "stone", "music", "window", "garden", "paper"]) for _ in range(words)
    )


def test_planted_items_are_all_found_through_case_punctuation_and_whitespace_changes():
    rng = random.Random(1)
    index = index_of(ITEMS)
    documents, planted = [], []
    for _ in range(60):
        item = rng.choice(ITEMS)
        documents.append(f"{filler(rng, 40)}. {disguise(item, rng)} {filler(rng, 30)}")
        planted.append(ITEMS.index(item))
        documents.append(filler(rng, 80))
    found = index.matches(documents)
    for position, matches in enumerate(found):
        if position % 2 == 0:
            assert matches, documents[position]
            tokens = reference.words(ITEMS[planted[position // 2]])
            assert matches[0].ngram == " ".join(tokens[: len(matches[0].ngram.split())]) or matches[
                0
            ].ngram in " ".join(tokens)
        else:
            assert not matches


def test_documents_sharing_only_n_minus_1_grams_are_kept():
    index = index_of(ITEMS)
    tokens = reference.words(ITEMS[2])
    # Every 12-gram of the item, each in its own document, separated by words that break longer runs.
    documents = [
        f"prefix words here {' '.join(tokens[i : i + 12])} suffix words there"
        for i in range(len(tokens) - 11)
    ]
    assert not any(index.matches(documents))
    assert all(index.matches([f"x {' '.join(tokens[i : i + 13])} y"])[0] for i in range(len(tokens) - 12))


def test_short_items_are_one_ngram_of_their_own_length_and_shorter_ones_are_skipped():
    items = ["alpha beta gamma delta epsilon zeta eta theta iota", "one two three"]
    rows, per_item = item_ngram_rows(items, [0, 0], 13, 8)
    assert per_item == [1, 0] and rows.column("width").to_pylist() == [9]
    index = index_of(items)
    assert index.matches(["before ALPHA, beta; gamma delta epsilon zeta eta theta iota after"])[0]
    assert not index.matches(["alpha beta gamma delta epsilon zeta eta theta"])[0]  # 8 of its 9 words


def test_cut_mode_removes_the_span_and_keeps_the_rest():
    item = ITEMS[0]
    before, after = (
        "A" * 50 + " " + filler(random.Random(2), 120),
        filler(random.Random(3), 120) + " " + "Z" * 50,
    )
    text = f"{before}\n{disguise(item, random.Random(4))}\n{after}"
    index = index_of([item])
    matches = index.matches([text])[0]
    pieces = cut_spans(text, matches, margin=20, min_piece=100)
    assert pieces and len(pieces) == 2
    assert pieces[0].startswith("A" * 50) and pieces[1].endswith("Z" * 50)
    assert not index.matches(["\n".join(pieces)])[0]
    assert not reference.contaminated("\n".join(pieces), reference.item_ngrams([item], 13, 8))


def test_word_spans_map_normalised_words_back_to_the_text():
    text = "Ｆｕｌｌ-width, ﬁne ligatures; e\u0301te\u0301 東京 done."
    words, spans = word_spans(text)
    assert words == reference.words(text)
    assert [text[a:b] for a, b in spans][:2] == ["Ｆｕｌｌ", "width"]


def test_the_bloom_filter_never_misses_a_key():
    rng = np.random.default_rng(5)
    keys = rng.integers(-(2**63), 2**63 - 1, size=20_000, dtype=np.int64)
    bloom = BloomFilter.sized(len(keys))
    bloom.add(keys)
    assert bloom.may_contain(keys).all()
    others = rng.integers(-(2**63), 2**63 - 1, size=20_000, dtype=np.int64)
    assert bloom.may_contain(others).mean() < 0.02


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from(VOCABULARY), min_size=0, max_size=40), min_size=1, max_size=8),
    st.lists(st.lists(st.sampled_from(VOCABULARY[:12]), min_size=3, max_size=14), min_size=1, max_size=3),
    st.integers(3, 6),
    st.randoms(use_true_random=False),
)
def test_matching_agrees_with_a_brute_force_reference(documents, items, n, rng):
    """Random documents over a small vocabulary (so n-grams recur), some with an item planted, disguised."""
    item_texts = [" ".join(words) for words in items]
    texts = []
    for words in documents:
        text = " ".join(words)
        if rng.random() < 0.5:
            text = f"{text} {disguise(rng.choice(item_texts), rng)} {' '.join(rng.sample(VOCABULARY, 3))}"
        texts.append(text)
    min_n = min(n, 3)
    index = index_of(item_texts, n, min_n)
    grams = reference.item_ngrams(item_texts, n, min_n)
    assert [bool(m) for m in index.matches(texts)] == [reference.contaminated(t, grams) for t in texts]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(st.text(max_size=60), st.text(alphabet="aZ 09,.-'\n\tÉé東京", max_size=60), st.none()),
        max_size=12,
    )
)
def test_the_ascii_fast_path_normalises_exactly_as_dedup_does(texts):
    import pyarrow as pa

    from pipeline.decontaminate.ngrams import normalize_words
    from pipeline.documents.shingles import normalize_for_dedup

    assert normalize_words(texts).to_pylist() == normalize_for_dedup(pa.array(texts, pa.string())).to_pylist()


# Letters whose normalised form depends on their neighbours or on a character class Python's tables and RE2's
# disagree on: a final sigma, 々 (Han by script, not by name), ー (Common by script, Katakana by name), İ (two
# characters in lower case), a combining acute, a ligature, full-width letters, and separators.
TRICKY = "ΟΔΣΟΣΑαß々ーİe\u0301ﬁＡ日あア ,.'-\n"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=TRICKY + "abcXYZ", max_size=40))
def test_word_spans_are_the_words_dedup_normalisation_makes(text):
    """Cut mode maps matches back to the text through word_spans: where its words differ from
    normalize_for_dedup's, a document that shares an n-gram was dropped instead of cut."""
    import pyarrow as pa

    from pipeline.documents.shingles import normalize_for_dedup

    words, spans = word_spans(text)
    assert " ".join(words) == normalize_for_dedup(pa.array([text], pa.string()))[0].as_py()
    assert len(spans) == len(words) and spans == sorted(spans)
    assert all(0 <= start < end <= len(text) for start, end in spans)


def test_cut_mode_cuts_greek_and_japanese_documents_instead_of_dropping_them():
    item = "Η ΟΔΟΣ ΠΡΟΣ ΤΗΝ ΑΘΗΝΑ ΠΕΡΝΑ ΑΠΟ ΤΟ ΠΑΛΙΟ ΛΙΜΑΝΙ ΚΑΙ ΤΟΝ ΛΟΦΟ ΤΟΥ ΝΑΟΥ ΣΤΗΝ ΑΚΡΗ ΤΗΣ ΠΟΛΗΣ"
    before, after = "Λόγος " * 40, " abc々def xーy" * 20
    text = f"{before}\n{item.title()}\n{after}"
    index = index_of([item])
    matches = index.matches([text])[0]
    assert matches
    pieces = cut_spans(text, matches, margin=0, min_piece=10)
    assert pieces is not None and len(pieces) == 2
    assert pieces[0] == before.strip() and pieces[1] == after.strip()
    assert not index.matches(["\n".join(pieces)])[0]


def test_a_short_document_is_a_candidate_once_on_the_join_path():
    """A document shorter than the widest n-gram was looked up under that width too (one shingle of all its
    words) and counted twice when its own length was also a width of the index."""
    from pipeline.decontaminate.ngrams import candidate_rows

    items = ["alpha beta gamma delta epsilon zeta eta theta iota kappa", " ".join(f"w{i}" for i in range(20))]
    rows, _ = item_ngram_rows(items, [0, 0], 13, 8)
    bloom = BloomFilter.sized(len(rows))
    bloom.add(np.array(rows.column("hash").to_pylist(), dtype=np.int64))
    widths = sorted(set(rows.column("width").to_pylist()))
    assert widths == [10, 13]
    found = candidate_rows(
        ["short"], ["Alpha, beta gamma delta epsilon zeta eta theta iota kappa."], bloom, widths
    )
    confirmed = {(s, w, c) for s, w, c in zip(found["start"], found["width"], found["check"], strict=True)}
    assert len(found["id"]) == len(confirmed) == 1
