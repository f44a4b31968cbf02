"""Diversity metrics of a document sample, for the quality report (computed on the driver).

Every function is pure: texts or arrays in, floats out. The sample is bounded and seeded by the caller
(``pipeline.quality.report.sample_documents``); the pairwise metrics take a further seeded subsample of
at most ``max_pairwise_docs`` documents, since their cost grows with its square. Pass texts in a
canonical order (the report sorts by id) so that the same snapshot gives the same numbers.

Definitions (n documents, lower self-BLEU / BERTScore and higher Vendi mean more diverse):

* ``self_bleu``: for each document i, sacrebleu's sentence BLEU (4-grams, ``exp`` smoothing, effective
  order, tokenizer ``zh``) of i as the hypothesis against the other n - 1 documents as its references;
  the mean over i, on sacrebleu's 0-100 scale. None when n < 2.
* ``bertscore_f1``: token embeddings E_a (rows unit-length, special tokens removed) per document; for a
  pair (a, b) with S = E_a E_b^T, precision P = mean over rows of the row maximum of S, recall R = mean
  over columns of the column maximum, F1 = 2PR / (P + R) (0 when either document has no tokens, as in
  bert-score); the mean F1 over the pairs. No idf weighting, no baseline rescaling. None without pairs.
* ``vendi_score``: with K the n x n cosine-similarity matrix of the rows and lambda_k the eigenvalues of
  K / n (they sum to 1), exp(-sum_k lambda_k log lambda_k): 1 when all rows are equal, n when they are
  orthogonal, the "effective number" of distinct documents (Friedman & Dieng 2023). None when n = 0.
* ``compression_ratio``: len(gzip(text)) / len(text), both in UTF-8 bytes, gzip at level 9 with mtime 0;
  repetitive text compresses well (a low ratio). gzip adds 18 bytes of header and trailer, so texts of
  a few dozen bytes have a ratio above 1. Empty text has no ratio (ValueError); ``sample_diversity``
  leaves empty texts out of the ratio statistics.
* ``lexical_diversity``: for n = 1, 2, the distinct lower-cased word n-grams (runs of word characters) of the whole
  sample over all of them; None when the sample has no n-gram.
"""

from __future__ import annotations

import gzip
import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.embeddings import EncoderConfig, load_encoder

_WORD = re.compile(r"\w+", re.UNICODE)

# sacrebleu's 'zh' tokenizer puts spaces around each CJK ideograph (and CJK and full-width punctuation)
# and then applies the same regular expressions as '13a'. One tokenizer has to serve the whole sample,
# since hypothesis and references must be split alike, and 'zh' serves both scripts: on text without
# CJK characters it is '13a' except that it skips 13a's mteval/SGML clean-up (``<skipped>``, ``-\n``,
# ``&quot;``-style entities, all absent from cleaned text) and also splits off symbols in U+2001..U+2A6D
# (curly quotes, dashes, arrows; sacrebleu writes the range of CJK Extension B as '\u20000', which Python
# reads as U+2000 then '0'), which only makes the split finer. '13a' would leave a Chinese clause as one
# "word" (its BLEU is then ~0 unless clauses repeat verbatim); 'char' would turn English into character
# n-grams; 'flores200' downloads its SentencePiece model, and the pipeline runs offline. Kana and
# Hangul runs stay whole under 'zh' (Korean has spaces; Japanese self-BLEU is underestimated).
BLEU_TOKENIZER = "zh"
GZIP_LEVEL = 9


def self_bleu(texts: Sequence[str]) -> float | None:
    """Mean sentence BLEU of each text against all the others (see the module docstring).

    Equal to ``mean(BLEU(tokenize='zh', effective_order=True).sentence_score(t_i, others_i).score)``,
    but each text is tokenized and counted once: sacrebleu's multi-reference statistics only need,
    per n-gram, its largest count among the references, and leaving one document out of the maximum
    only needs each n-gram's two largest counts over all documents. That is O(total n-grams) instead of
    sentence_score's O(n^2) reference extractions (200 texts of 256 words: 0.5 s of CPU instead of 50 s).
    """
    if len(texts) < 2:
        return None
    from sacrebleu.metrics import BLEU
    from sacrebleu.metrics.helpers import extract_all_word_ngrams

    bleu = BLEU(tokenize=BLEU_TOKENIZER, effective_order=True)
    # BLEU's private steps (sacrebleu 2.6.0, pinned), so that sacrebleu still does the tokenizing,
    # clipping, closest reference length and smoothing; the tests compare with sentence_score.
    segments = [bleu._preprocess_segment(text) for text in texts]
    counts = []
    lengths = []
    for segment in segments:
        ngrams, length = extract_all_word_ngrams(segment, 1, bleu.max_ngram_order)
        counts.append(ngrams)
        lengths.append(length)

    # per n-gram: (largest count, the document holding it, second largest count)
    top: dict[tuple[str, ...], tuple[int, int, int]] = {}
    for doc, ngrams in enumerate(counts):
        for ngram, count in ngrams.items():
            best, holder, second = top.get(ngram, (0, -1, 0))
            if count > best:
                top[ngram] = (count, doc, best)
            elif count > second:
                top[ngram] = (best, holder, count)

    scores = []
    for doc, (segment, ngrams) in enumerate(zip(segments, counts, strict=True)):
        # the reference counts sacrebleu's _extract_reference_info would merge from the other
        # documents, restricted to the n-grams the hypothesis has (the only ones it looks up)
        reference_ngrams = {}
        for ngram in ngrams:
            best, holder, second = top[ngram]
            count = second if holder == doc else best
            if count:
                reference_ngrams[ngram] = count
        reference_lengths = lengths[:doc] + lengths[doc + 1 :]
        statistics = bleu._compute_segment_statistics(
            segment, {"ref_ngrams": reference_ngrams, "ref_lens": reference_lengths}
        )
        scores.append(bleu._compute_score_from_stats(statistics).score)
    return float(np.mean(scores))


def token_embeddings(texts: Sequence[str], encoder: EncoderConfig) -> list[np.ndarray]:
    """Per text, the encoder's contextual token vectors (its last layer, as sentence-transformers'
    ``token_embeddings``), without padding and the tokens the tokenizer adds ([CLS], [SEP]; <s>, </s>),
    rows L2-normalised, float32. Texts are truncated to ``encoder.max_seq_length`` tokens, specials
    included."""
    model = load_encoder(encoder.model, encoder.max_seq_length)
    # the added tokens are found by id, not assumed to be the first and last rows
    added = np.array(sorted(model.added_token_ids), dtype=np.int64)
    vectors = []
    for ids, rows in model.token_embeddings(list(texts), encoder.batch_size):
        rows = rows[~np.isin(ids, added)].astype(np.float32)
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        vectors.append(rows / np.maximum(norms, 1e-12))
    return vectors


def bertscore_f1(tokens: Sequence[np.ndarray], pairs: Sequence[tuple[int, int]]) -> float | None:
    """Mean greedy-matching F1 over the pairs of documents (see the module docstring)."""
    if not pairs:
        return None
    scores = []
    for a, b in pairs:
        if len(tokens[a]) == 0 or len(tokens[b]) == 0:
            scores.append(0.0)
            continue
        # float32 products, as bert-score computes them (half the time of float64), float64 means
        similarity = np.asarray(tokens[a], dtype=np.float32) @ np.asarray(tokens[b], dtype=np.float32).T
        precision = similarity.max(axis=1).mean(dtype=np.float64)
        recall = similarity.max(axis=0).mean(dtype=np.float64)
        total = precision + recall
        scores.append(float(2 * precision * recall / total) if total else 0.0)
    return float(np.mean(scores))


def sample_pairs(n: int, max_pairs: int, seed: int) -> list[tuple[int, int]]:
    """Distinct unordered pairs (i, j), i < j < n, sorted: all of them when there are at most
    ``max_pairs``, otherwise ``max_pairs`` drawn without replacement with ``seed``. Unordered is enough
    for F1, which is symmetric (swapping a and b swaps P and R)."""
    total = n * (n - 1) // 2
    if max_pairs <= 0 or total == 0:
        return []
    if total <= max_pairs:
        chosen = np.arange(total)
    else:
        chosen = np.sort(np.random.default_rng(seed).choice(total, size=max_pairs, replace=False))
    # pair k in row-major order over i < j: row i holds n - 1 - i pairs and ends at ends[i]
    ends = np.cumsum(np.arange(n - 1, 0, -1))
    rows = np.searchsorted(ends, chosen, side="right")
    columns = chosen - (ends[rows] - (n - 1 - rows)) + rows + 1
    return [(int(i), int(j)) for i, j in zip(rows, columns, strict=True)]


def vendi_score(embeddings: np.ndarray) -> float | None:
    """exp of the entropy of the eigenvalues of K / n, K the cosine similarities of the rows."""
    count = len(embeddings)
    if count == 0:
        return None
    rows = np.asarray(embeddings, dtype=np.float64).reshape(count, -1)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    if not np.all(norms > 0):
        raise ValueError("vendi_score: a zero vector has no cosine similarity")
    # K / n = X X^T / n with X the unit rows: its nonzero eigenvalues are the squared singular values
    # of X / sqrt(n), which an SVD gives without forming K and without negative rounding noise.
    eigenvalues = np.linalg.svd(rows / norms, compute_uv=False) ** 2 / count
    eigenvalues = eigenvalues[eigenvalues > 0]
    return float(math.exp(-np.sum(eigenvalues * np.log(eigenvalues))))


def compression_ratio(text: str) -> float:
    """gzip bytes / UTF-8 bytes (see the module docstring); ValueError for empty text."""
    data = text.encode("utf-8")
    if not data:
        raise ValueError("compression_ratio: empty text")
    return len(gzip.compress(data, compresslevel=GZIP_LEVEL, mtime=0)) / len(data)


def lexical_diversity(texts: Sequence[str], max_n: int = 2) -> dict[str, float | None]:
    """``distinct_{n}gram_ratio`` for n = 1..max_n: distinct word n-grams over all n-grams of ``texts``."""
    words = [_WORD.findall(text.lower()) for text in texts]
    ratios: dict[str, float | None] = {}
    for n in range(1, max_n + 1):
        grams = [tuple(tokens[i : i + n]) for tokens in words for i in range(len(tokens) - n + 1)]
        ratios[f"distinct_{n}gram_ratio"] = len(set(grams)) / len(grams) if grams else None
    return ratios


def sample_diversity(
    texts: Sequence[str],
    embeddings: np.ndarray,
    encoder: EncoderConfig,
    max_pairwise_docs: int,
    max_pairs: int,
    seed: int,
) -> dict[str, float | None]:
    """The report's diversity metrics for one sample.

    ``embeddings`` are the sample's sentence embeddings, row i for ``texts[i]``. Vendi and the
    compression ratios use every document (empty texts left out of the ratios); self-BLEU and
    BERTScore use a seeded subsample of at most ``max_pairwise_docs`` documents (``pairwise_docs``
    says how many), BERTScore over at most ``max_pairs`` of its pairs. The encoder is only loaded
    when there are pairs to score.
    """
    if len(embeddings) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(embeddings)} embeddings")
    ratios = np.array([compression_ratio(text) for text in texts if text], dtype=np.float64)
    count = min(len(texts), max(0, max_pairwise_docs))
    chosen = np.sort(np.random.default_rng(seed).choice(len(texts), size=count, replace=False))
    subsample = [texts[i] for i in chosen]
    pairs = sample_pairs(count, max_pairs, seed)
    return {
        "self_bleu": self_bleu(subsample),
        "bertscore_f1": bertscore_f1(token_embeddings(subsample, encoder), pairs) if pairs else None,
        "vendi_score": vendi_score(embeddings),
        "compression_ratio_mean": float(ratios.mean()) if len(ratios) else None,
        "compression_ratio_p10": float(np.percentile(ratios, 10)) if len(ratios) else None,
        "compression_ratio_p50": float(np.percentile(ratios, 50)) if len(ratios) else None,
        "pairwise_docs": count,
    }


def plot_compression(ratios: Sequence[float], path: Path) -> Path:
    """Histogram of per-document compression ratios: a spike at the low end is repeated boilerplate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 3.5))
    if len(ratios):
        axis.hist(ratios, bins=40, color="tab:purple")
    axis.set(title="gzip compression ratio", xlabel="compressed / UTF-8 bytes", ylabel="documents")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path
