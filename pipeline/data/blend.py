"""Training batches drawn from a weighted mixture of sources (``data.mixture``), resumable to the exact batch.

**Blending rule.** Megatron-LM's (``build_blending_indices`` in ``megatron/core/datasets/helpers.cpp``, which
``BlendedDataset`` uses): sample k of the blend comes from the source furthest behind its share,
``argmax_i(w_i * max(k, 1) - c_i)`` with ``c_i`` the samples source i has given so far (ties: the first
source). Megatron builds that index once for the run's total number of samples; this loader is endless, so the
rule runs over one period of ``BLEND_PERIOD`` (65,536) samples and the period repeats. At every point of a
period each source is within two samples of its share (1.25 at most, measured on random weights; tested), so
a period holds within two samples of ``w_i * P`` from source i, and after any N samples source i's share is
within 2/N + 2/P of w_i.

**Samples and tokens.** With ``packed`` batching a sample is one window of ``seq_len + 1`` tokens from every
source, so shares of samples are shares of tokens. With ``token_budget`` batching a sample is one token-budget
batch of whole documents from one source, and batches hold different numbers of tokens; the rule then runs on
``w_i / t_i``, normalised, where ``t_i`` is source i's mean tokens per batch (its first epoch's tokens over its
batches), so the token shares match the weights on average (each source's batches are drawn in a shuffled order,
so its batch sizes average out over the run).

**Order within a source.** Epoch e of source i is a permutation of its samples seeded by
``(seed, i, e)``; the j-th sample drawn from source i is the (j mod n_i)-th of epoch (j div n_i). A source
smaller than its share is so repeated, every time in a fresh order; ``source_epochs()`` counts how often.

**Ranks and resume.** The blend is one sequence of samples, the same for any number of ranks; each step
takes the next ``world_size`` runs of ``samples_per_rank`` and rank r takes run r. ``state_dict()`` records
the position in the sequence (plus seed, sources, weights and their data's fingerprints, which must match on
resume). Resuming continues with exactly the batches the interrupted run would have seen; resuming with
another data-parallel size continues at the same sample, split over the new ranks. The blend never ends an
epoch, so nothing is skipped.

Each batch is a ``SourcedBatch``: ``batch.sources[b]`` is the index (in ``source_names``) of row b's source.
"""

from __future__ import annotations

import bisect
import functools
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from pipeline.data.loader import (
    DistributedBatchLoader,
    TokenBudgetBatchLoader,
    build_train_loader,
    padded_batch,
    shuffled_budget_batches,
)
from pipeline.data.mixture import Mixture
from pipeline.data.sequences import DocumentSequences, PackedSequences, SourcedBatch

log = logging.getLogger(__name__)
BLEND_PERIOD = 1 << 16
STATE_VERSION = 1


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


class _Blend:
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


class _PackedSource:
    """A source's packed windows, epoch e in the order seeded by (seed, source index, e)."""

    def __init__(self, dataset: PackedSequences, key: list[int]) -> None:
        self.dataset = dataset
        self.key = key
        self.size = len(dataset)
        self._orders: dict[int, np.ndarray] = {}

    @property
    def tokens_per_sample(self) -> float:
        return float(self.dataset.seq_len)

    def _order(self, epoch: int) -> np.ndarray:
        order = self._orders.get(epoch)
        if order is None:
            order = np.random.default_rng([*self.key, epoch]).permutation(self.size)
            # Keep this epoch and the one before: a batch may straddle the two.
            self._orders = {e: o for e, o in self._orders.items() if e == epoch - 1} | {epoch: order}
        return order

    def epoch_of(self, drawn: int) -> tuple[int, int]:
        return divmod(drawn, self.size)

    def window(self, drawn: int) -> int:
        epoch, index = self.epoch_of(drawn)
        return int(self._order(epoch)[index])

    def fingerprint(self) -> str:
        return self.dataset.fingerprint()


class _BudgetSource:
    """A source's token-budget batches, epoch e cut and ordered by (seed, source index, e)."""

    def __init__(self, dataset: DocumentSequences, key: list[int], max_tokens: int, pool_size: int) -> None:
        self.dataset = dataset
        self.key = key
        self.max_tokens = max_tokens
        self.pool_size = pool_size
        self._batches: dict[int, list[np.ndarray]] = {}
        first = self.epoch_batches(0)
        self.tokens_per_batch = float(dataset.lengths.sum()) / len(first)
        # All samples in one length-sorting pool: every epoch cuts the same lengths into the same number of
        # batches, so epochs have one size and the epoch of a draw is a division. Otherwise sizes are summed.
        self.fixed_size = len(first) if len(dataset) <= pool_size else None
        self._starts = [0, len(first)]  # first batch of each epoch, as far as known

    @property
    def tokens_per_sample(self) -> float:
        return self.tokens_per_batch

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        batches = self._batches.get(epoch)
        if batches is None:
            batches = shuffled_budget_batches(
                self.dataset, [*self.key, epoch], self.max_tokens, self.pool_size
            )
            self._batches = {e: b for e, b in self._batches.items() if e == epoch - 1} | {epoch: batches}
        return batches

    def epoch_of(self, drawn: int) -> tuple[int, int]:
        if self.fixed_size is not None:
            return divmod(drawn, self.fixed_size)
        while self._starts[-1] <= drawn:
            epoch = len(self._starts) - 1
            self._starts.append(self._starts[-1] + len(self.epoch_batches(epoch)))
        epoch = bisect.bisect_right(self._starts, drawn) - 1
        return epoch, drawn - self._starts[epoch]

    def batch(self, drawn: int) -> np.ndarray:
        epoch, index = self.epoch_of(drawn)
        return self.epoch_batches(epoch)[index]

    def fingerprint(self) -> str:
        return self.dataset.fingerprint()


class _BlendedLoader:
    """Shared by both batchings: the blend, the position, epochs per source, state_dict/load_state_dict."""

    kind = ""
    samples_per_rank = 1

    def __init__(
        self,
        names: Sequence[str],
        weights: Sequence[float],
        sources: Sequence[_PackedSource | _BudgetSource],
        rank: int,
        world_size: int,
        seed: int,
    ) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a data-parallel group of size {world_size}")
        if not (len(names) == len(weights) == len(sources)) or not names:
            raise ValueError("a mixture needs one name and one weight per source, and at least one source")
        if len(set(names)) != len(names):
            raise ValueError(f"mixture source names must be distinct, got {list(names)}")
        if any(not weight > 0 for weight in weights):
            raise ValueError(f"mixture weights must be positive, got {list(weights)}")
        total = sum(weights)
        self.source_names = list(names)
        self.weights = [weight / total for weight in weights]
        self.sources = list(sources)
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        # Samples of one source carry t_i tokens on average: draw w_i / t_i of them for w_i of the tokens.
        rates = [
            weight / source.tokens_per_sample for weight, source in zip(self.weights, sources, strict=True)
        ]
        self.blend = _Blend(rates, self.source_names)
        self.position = 0  # samples of the blend consumed by all ranks together

    # Implemented by subclasses.
    def _batch(self, positions: np.ndarray) -> SourcedBatch:
        raise NotImplementedError

    def _settings(self) -> dict[str, Any]:
        """Settings that define the samples; a checkpoint is only valid with the same ones."""
        raise NotImplementedError

    def __iter__(self):
        return self

    def __next__(self) -> SourcedBatch:
        per_rank = self.samples_per_rank
        first = self.position + self.rank * per_rank
        batch = self._batch(np.arange(first, first + per_rank, dtype=np.int64))
        self.position += per_rank * self.world_size
        return batch

    # --- what the trainer logs and records -------------------------------------------------------------

    def source_samples(self) -> dict[str, int]:
        """Samples (packed windows, or token-budget batches) each source has given so far, all ranks."""
        return dict(zip(self.source_names, map(int, self.blend.drawn(self.position)), strict=True))

    def source_epochs(self) -> dict[str, float]:
        """Passes over each source so far, all ranks: 2.25 means twice through and a quarter of the third.
        A source above 1 is being repeated (it is smaller than its share of the tokens seen so far)."""
        epochs = {}
        for name, source, drawn in zip(
            self.source_names, self.sources, self.blend.drawn(self.position), strict=True
        ):
            epoch, index = source.epoch_of(int(drawn))
            size = source.size if isinstance(source, _PackedSource) else len(source.epoch_batches(epoch))
            epochs[name] = epoch + index / size
        return epochs

    # --- checkpointing ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "kind": self.kind,
            "position": self.position,
            "world_size": self.world_size,
            "seed": self.seed,
            "sources": list(self.source_names),
            "weights": list(self.weights),
            "period": self.blend.period,
            **self._settings(),
            # For people reading a checkpoint; recomputed from the position on resume.
            "source_samples": self.source_samples(),
            "source_epochs": self.source_epochs(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` left off; ValueError naming the difference when the checkpoint was made
        with another kind of loader, seed, sources, weights, data or batching setting. Another data-parallel
        size is fine: the next step starts at the saved position, split over this run's ranks."""
        if state.get("version") != STATE_VERSION or state.get("kind") != self.kind:
            raise ValueError(
                f"the checkpoint's data loader state ({state.get('kind')!r}, version {state.get('version')}) "
                f"is not a {self.kind!r} state of version {STATE_VERSION}; it cannot be resumed by this loader"
            )
        expected = {
            "seed": self.seed,
            "sources": list(self.source_names),
            "weights": list(self.weights),
            "period": self.blend.period,
            **self._settings(),
        }
        for key, value in expected.items():
            if state.get(key) != value:
                raise ValueError(
                    f"cannot resume the data loader: the checkpoint has {key}={state.get(key)!r}, this run has "
                    f"{value!r}; resuming would not continue the same sample order"
                )
        position = int(state["position"])
        if position < 0:
            raise ValueError(f"checkpoint position {position} is negative")
        if state["world_size"] != self.world_size:
            log.warning(
                "resharding the mixture loader: checkpoint from %d data-parallel ranks, this run has %d; "
                "continuing at sample %d with the rest split over the new ranks",
                state["world_size"],
                self.world_size,
                position,
            )
        self.position = position


class BlendedPackedLoader(_BlendedLoader):
    """Endless [batch_size, seq_len] batches of packed windows, each row from the source the blend names."""

    kind = "blended_packed"

    def __init__(
        self,
        names: Sequence[str],
        datasets: Sequence[PackedSequences],
        weights: Sequence[float],
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if len({dataset.seq_len for dataset in datasets}) > 1:
            raise ValueError("every mixture source must have the same seq_len")
        sources = [_PackedSource(dataset, [seed, index]) for index, dataset in enumerate(datasets)]
        super().__init__(names, weights, sources, rank, world_size, seed)
        self.samples_per_rank = batch_size
        self.seq_len = datasets[0].seq_len

    def _settings(self) -> dict[str, Any]:
        # batch_size is not here: the position counts windows, so a new batch size continues correctly.
        return {"datasets": [source.fingerprint() for source in self.sources]}

    def _batch(self, positions: np.ndarray) -> SourcedBatch:
        owners, drawn = self.blend.locate(positions)
        width = self.seq_len + 1
        rows = np.empty((len(positions), width), dtype=np.int64)
        documents = np.empty((len(positions), width), dtype=np.int64)
        for row, (owner, number) in enumerate(zip(owners.tolist(), drawn.tolist(), strict=True)):
            source = self.sources[owner]
            window = source.window(number)
            rows[row] = source.dataset[window]
            documents[row] = source.dataset.document_ids(window)
        tokens, ids = torch.from_numpy(rows), torch.from_numpy(documents)
        return SourcedBatch(tokens[:, :-1], tokens[:, 1:], ids[:, :-1], torch.from_numpy(owners.astype(np.int64)))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "batch_size": self.samples_per_rank}


class BlendedTokenBudgetLoader(_BlendedLoader):
    """Endless token-budget batches (one document per row, rows x longest row <= max_tokens); each batch holds
    documents of one source, the source the blend names for it."""

    kind = "blended_token_budget"

    def __init__(
        self,
        names: Sequence[str],
        datasets: Sequence[DocumentSequences],
        weights: Sequence[float],
        max_tokens: int,
        pad_id: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        pool_size: int = 16_384,
    ) -> None:
        for name, dataset in zip(names, datasets, strict=True):
            if max_tokens < dataset.max_len:
                raise ValueError(
                    f"max_tokens {max_tokens} is below source {name}'s max_len {dataset.max_len}: one long "
                    "sample would not fit"
                )
        if pool_size < 1:
            raise ValueError(f"pool_size must be positive, got {pool_size}")
        sources = [
            _BudgetSource(dataset, [seed, index], max_tokens, pool_size)
            for index, dataset in enumerate(datasets)
        ]
        super().__init__(names, weights, sources, rank, world_size, seed)
        self.max_tokens = max_tokens
        self.pad_id = pad_id
        self.pool_size = pool_size

    def _settings(self) -> dict[str, Any]:
        return {
            "datasets": [source.fingerprint() for source in self.sources],
            "max_tokens": self.max_tokens,
            "pool_size": self.pool_size,
        }

    def _batch(self, positions: np.ndarray) -> SourcedBatch:
        owners, drawn = self.blend.locate(positions)
        (owner,), (number,) = owners.tolist(), drawn.tolist()
        source = self.sources[owner]
        batch = padded_batch(source.dataset, source.batch(number), self.pad_id)
        return SourcedBatch(*batch, torch.full((batch.inputs.shape[0],), owner, dtype=torch.int64))


def build_loader(
    mixture: Mixture, config, rank: int = 0, world_size: int = 1
) -> DistributedBatchLoader | TokenBudgetBatchLoader | BlendedPackedLoader | BlendedTokenBudgetLoader:
    """The training loader for ``mixture`` (``pipeline.data.mixture.resolve_mixture``), sized by
    ``config.train`` (seq_len, batch_size) and ``config.data`` (batching, max_tokens_per_batch).

    No ``data.mixture`` (the mixture is the one snapshot being trained): today's loaders, unchanged
    (``build_train_loader``). A declared mixture, even of one source: a blended loader.
    """
    pad_id = mixture.tokenizer.get("pad_id")
    if mixture.is_default:
        (folder,) = mixture.sources[0].folders()
        return build_train_loader(folder, config, rank=rank, world_size=world_size, pad_id=pad_id)
    train, data = config.train, config.data
    names, weights = mixture.names, mixture.weights
    if data.batching == "packed":
        windows = [PackedSequences(source.folders(), train.seq_len) for source in mixture.sources]
        return BlendedPackedLoader(
            names,
            windows,
            weights,
            train.batch_size,
            rank=rank,
            world_size=world_size,
            seed=data.shuffle_seed(config.project.seed),
        )
    if pad_id is None:
        raise ValueError(
            "token_budget batching needs the tokenizer's pad id (the tokenize manifest's pad_id)"
        )
    documents = [DocumentSequences(source.folders(), train.seq_len) for source in mixture.sources]
    return BlendedTokenBudgetLoader(
        names,
        documents,
        weights,
        data.max_tokens_per_batch or train.batch_size * train.seq_len,
        pad_id=pad_id,
        rank=rank,
        world_size=world_size,
        seed=data.shuffle_seed(config.project.seed),
    )
