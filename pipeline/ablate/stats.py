"""The test behind an ablation's verdict: paired per-document losses of two arms over the same seeds.

Each arm (a variant, or the base) is trained with seeds ``s`` and every checkpoint is scored on the same ``N``
held-out documents, so ``x[s, d]`` = base loss - variant loss of document ``d`` under seed ``s`` (summed nats)
pairs what can be paired: the same document, and the same seed's initial weights (``project.seed``; the data
order differs because the data does). The effect is the byte-weighted mean difference,

    effect = sum_s,d x[s, d] / (S * sum_d bytes[d])        (nats per byte; bits per byte = / ln 2)

positive when the variant's loss is lower. Its uncertainty has two sources, and both are estimated:

* **seeds**: another set of trainings would give other weights (the seed-to-seed noise of the difference);
* **documents**: another sample of held-out documents from the same source would give another mean.

With ``z[s, d] = N * x[s, d] / sum_d bytes[d]`` (so the effect is the plain mean of ``z``), a two-way analysis
of variance without replication gives mean squares for seeds (``MS_s``, S-1 degrees of freedom), documents
(``MS_d``, N-1) and their interaction (``MS_r``, (S-1)(N-1)), and

    Var(effect) = (MS_s + MS_d - MS_r) / (N * S)

(its expectation is seed variance / S + document variance / N + interaction / (N S)), floored at the larger of
``MS_s`` and ``MS_d`` over ``N S`` when the interaction makes the combination smaller. ``t = effect / SE`` is
referred to Student's t with the seeds' S - 1 degrees of freedom, the scarcest source of information: exact
when the seeds' noise dominates, conservative when the documents' does. Satterthwaite's degrees of freedom for
the combination (reported beside it) would be larger, but they are estimated from the same few seeds and,
on simulated A/A comparisons, called noise a finding 7-12% of the time at 2 seeds and up to 7% at 3
(``tests/ablate/test_stats.py`` holds the rule to at most 5%). So two seeds can only show very large effects
(the two-sided 5% point of t with 1 degree of freedom is 12.7), three need over 4.3 standard errors, five 2.8.

Why not a bootstrap over seeds: with three seeds a resample has ten distinct outcomes and the percentile
interval is too narrow by about (S-1)/S in variance, which calls noise a finding far more often than 5%.
``benchmarks/ablate.py`` measures the false-finding rate of this rule on A/A controls (the base trained again
with another data order) instead of assuming it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

ALPHA = 0.05  # a verdict needs p below this
LN2 = math.log(2)


@dataclass(frozen=True)
class PairedComparison:
    effect_bpb: (
        float  # base minus variant, bits per byte of the held-out text (positive: the variant is better)
    )
    low_bpb: float  # the effect's 95% interval
    high_bpb: float
    effect_nats: float  # the same difference in nats per token (the loss's own unit)
    p_value: float
    degrees_of_freedom: float  # the test's: the seeds' S - 1
    satterthwaite_df: float  # the combination's, estimated (reported, not used: see the module docstring)
    seeds: int
    documents: int
    seed_share: float  # the share of the effect's variance that comes from seeds (the rest: documents)

    @property
    def verdict(self) -> str:
        if self.p_value < ALPHA:
            return "better" if self.effect_bpb > 0 else "worse"
        return "within noise"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict}


def paired_comparison(
    base: np.ndarray, variant: np.ndarray, document_bytes: np.ndarray, document_tokens: np.ndarray
) -> PairedComparison:
    """``base``, ``variant``: summed nats per (seed, document), seeds in the same order in both."""
    from scipy import stats

    base, variant = np.asarray(base, dtype=np.float64), np.asarray(variant, dtype=np.float64)
    if base.shape != variant.shape or base.ndim != 2:
        raise ValueError(
            f"paired losses need equal (seeds, documents) shapes, got {base.shape}, {variant.shape}"
        )
    seeds, documents = base.shape
    if seeds < 2 or documents < 2:
        raise ValueError(f"a paired test needs at least 2 seeds and 2 documents, got {seeds} and {documents}")
    total_bytes = float(np.sum(document_bytes))
    total_tokens = float(np.sum(document_tokens))
    z = documents * (base - variant) / total_bytes  # nats per byte; its mean is the effect
    effect = float(z.mean())
    seed_means, document_means = z.mean(axis=1), z.mean(axis=0)
    ms_seeds = documents * float(np.var(seed_means, ddof=1))
    ms_documents = seeds * float(np.var(document_means, ddof=1))
    residual = z - seed_means[:, None] - document_means[None, :] + effect
    df_residual = (seeds - 1) * (documents - 1)
    ms_residual = float(np.sum(residual**2)) / df_residual
    combined = ms_seeds + ms_documents - ms_residual
    if combined >= max(ms_seeds, ms_documents):
        terms = [(ms_seeds, seeds - 1), (ms_documents, documents - 1), (-ms_residual, df_residual)]
    elif ms_seeds >= ms_documents:
        combined, terms = ms_seeds, [(ms_seeds, seeds - 1)]
    else:
        combined, terms = ms_documents, [(ms_documents, documents - 1)]
    variance = combined / (seeds * documents)
    if variance <= 0:  # identical arms: no difference and no noise
        return PairedComparison(
            0.0, 0.0, 0.0, 0.0, 1.0, float(seeds - 1), float(seeds - 1), seeds, documents, 0.0
        )
    satterthwaite = combined**2 / sum(value**2 / freedom for value, freedom in terms)
    df = seeds - 1
    error = math.sqrt(variance)
    p_value = float(2 * stats.t.sf(abs(effect) / error, df))
    half = float(stats.t.ppf(1 - ALPHA / 2, df)) * error
    seed_part = max(ms_seeds - ms_residual, 0.0) / documents
    document_part = max(ms_documents - ms_residual, 0.0) / seeds
    share = seed_part / (seed_part + document_part) if seed_part + document_part > 0 else 0.0
    per_token = total_bytes / total_tokens  # nats per byte x bytes per token = nats per token
    return PairedComparison(
        effect_bpb=effect / LN2,
        low_bpb=(effect - half) / LN2,
        high_bpb=(effect + half) / LN2,
        effect_nats=effect * per_token,
        p_value=p_value,
        degrees_of_freedom=float(df),
        satterthwaite_df=float(satterthwaite),
        seeds=seeds,
        documents=documents,
        seed_share=share,
    )


def seeds_for_effect(comparison: PairedComparison, effect_bpb: float) -> int | None:
    """About how many seeds would show an effect of ``effect_bpb`` at p < ALPHA, given the noise measured
    in ``comparison`` (its seed share scaled by seeds, its document share fixed); None above 64 seeds."""
    from scipy import stats

    if comparison.high_bpb == comparison.low_bpb or effect_bpb == 0:
        return None
    error = (
        (comparison.high_bpb - comparison.low_bpb)
        / 2
        / stats.t.ppf(1 - ALPHA / 2, comparison.degrees_of_freedom)
    )
    seed_variance = error**2 * comparison.seed_share * comparison.seeds
    document_variance = error**2 * (1 - comparison.seed_share)
    for seeds in range(2, 65):
        wanted = math.sqrt(seed_variance / seeds + document_variance) * stats.t.ppf(1 - ALPHA / 2, seeds - 1)
        if abs(effect_bpb) > wanted:
            return seeds
    return None
