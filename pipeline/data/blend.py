"""Megatron-LM's blending rule: which source each sample of a weighted mixture comes from.

``build_blending_indices`` in ``megatron/core/datasets/helpers.cpp`` (which ``BlendedDataset`` uses): sample k
of the blend comes from the source furthest behind its share, ``argmax_i(w_i * max(k, 1) - c_i)`` with ``c_i``
the samples source i has given so far (ties: the first source). Megatron builds that index once for the run's
total number of samples; the training loader is endless, so the rule runs over one period of
``BLEND_PERIOD`` (65,536) samples and the period repeats. At every point of a period each source is within
two samples of its share (1.25 at most, measured on random weights; tested), so a period holds within two
samples of ``w_i * P`` from source i, and after any N samples source i's share is within 2/N + 2/P of w_i.

How the loader uses it (weights per unit of each batching, the order within a source, resume) is in
``pipeline.data.loader``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

BLEND_PERIOD = 1 << 16


@functools.lru_cache(maxsize=8)
def blending_schedule(weights: tuple[float, ...], size: int = BLEND_PERIOD) -> np.ndarray:
    """Megatron's rule for ``size`` samples: the source of each, as int32 (weights normalised here)."""
    total = sum(weights)
    shares = [weight / total for weight in weights]
    counts = [0] * len(shares)
    schedule = np.empty(size, dtype=np.int32)
    for k in range(size):
        at = max(k, 1)
        best, best_error = 0, shares[0] * at - counts[0]
        for index in range(1, len(shares)):
            error = shares[index] * at - counts[index]
            if error > best_error:
                best, best_error = index, error
        schedule[k] = best
        counts[best] += 1
    return schedule


class Blend:
    """The periodic schedule and where each global sample falls: (source, how many that source gave before)."""

    def __init__(self, rates: Sequence[float], names: Sequence[str], period: int = BLEND_PERIOD) -> None:
        self.period = period
        self.schedule = blending_schedule(tuple(float(rate) for rate in rates), period)
        self.per_period = np.bincount(self.schedule, minlength=len(rates)).astype(np.int64)
        starved = [name for name, count in zip(names, self.per_period, strict=True) if count == 0]
        if starved:
            raise ValueError(
                f"mixture sources {starved} have a share below 1/{period} of the samples: they would never be "
                "drawn; raise their weight"
            )
        # For each slot of the period: how many samples its source gave earlier in the period.
        self.earlier_in_period = np.empty(period, dtype=np.int64)
        for source in range(len(rates)):
            slots = np.flatnonzero(self.schedule == source)
            self.earlier_in_period[slots] = np.arange(len(slots))

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, that source's sample number) of each global sample position."""
        periods, slots = np.divmod(positions, self.period)
        sources = self.schedule[slots]
        return sources, periods * self.per_period[sources] + self.earlier_in_period[slots]

    def drawn(self, position: int) -> np.ndarray:
        """Samples each source has given in the first ``position`` samples of the blend."""
        periods, slot = divmod(position, self.period)
        return periods * self.per_period + np.bincount(self.schedule[:slot], minlength=len(self.per_period))
