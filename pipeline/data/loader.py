"""Training batches from token shards: memmapped, split by data-parallel rank, resumable to the exact batch.

Two ways to batch a folder of shards (``<tokenize output>/train``):

- ``PackedSequences`` + ``DistributedBatchLoader``: all documents back to back (each ends in end-of-text) as one
  token stream, cut into windows of ``seq_len + 1`` tokens that overlap by one (inputs and shifted targets).
  Every batch is ``[batch_size, seq_len]``; ``document_ids`` says which document each input token is in, so the
  model can keep attention inside documents.
- ``DocumentSequences`` + ``TokenBudgetBatchLoader`` (dynamic batching): one document per row (a long one is cut
  into ``max_len`` pieces), rows of similar length batched together so that rows x longest row never exceeds
  ``max_tokens``; the rest is padding (targets ``IGNORE_INDEX``).

Both loaders are endless iterators of ``Batch``. An epoch is a seeded order over all samples (packed windows or
token-budget batches) that does not depend on the number of ranks; each step takes the next
``world_size`` shares of it, rank r taking share r. ``state_dict()`` holds the epoch and the position in that
order, so a resumed run sees exactly the batches it would have seen, and a run resumed with another
data-parallel size continues at the same position with the rest of the epoch split over the new ranks (no
sample repeated or skipped; only the incomplete last step of the epoch, dropped in any case, differs).
"""

from __future__ import annotations

import bisect
import functools
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.data.sequences import (
    IGNORE_INDEX,
    PAD_DOCUMENT,
    Batch,
    DocumentSequences,
    PackedSequences,
    SourcedBatch,
    TokenStream,
)

__all__ = ["IGNORE_INDEX", "PAD_DOCUMENT", "Batch", "SourcedBatch", "TokenStream"]
log = logging.getLogger(__name__)
STATE_VERSION = 1


class _EpochLoader:
    """Shared bookkeeping: rank checks, epochs, the global position, state_dict/load_state_dict."""

    kind = ""

    def __init__(self, rank: int, world_size: int, seed: int) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a data-parallel group of size {world_size}")
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.epoch = 0
        self.position = 0  # units (samples or batches) of this epoch's order consumed by all ranks together

    # Implemented by subclasses.
    def _units_in_epoch(self, epoch: int) -> int:
        raise NotImplementedError

    def _units_per_step(self) -> int:
        raise NotImplementedError

    def _batch(self, epoch: int, start: int) -> Batch:
        raise NotImplementedError

    def _settings(self) -> dict[str, Any]:
        """Settings that define the epoch order; a checkpoint is only valid with the same ones."""
        raise NotImplementedError

    @property
    def batches_per_epoch(self) -> int:
        """Steps in the current epoch."""
        return self._units_in_epoch(self.epoch) // self._units_per_step()

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        step = self._units_per_step()
        if self.position + step > self._units_in_epoch(self.epoch):
            self.epoch += 1
            self.position = 0
        batch = self._batch(self.epoch, self.position)
        self.position += step
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "kind": self.kind,
            "epoch": self.epoch,
            "position": self.position,
            "world_size": self.world_size,
            "seed": self.seed,
            **self._settings(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` left off. Raises ValueError, naming the difference, if the checkpoint was
        made with another loader kind, seed, dataset or batching setting; a different data-parallel size is
        resharded: the next step starts at the saved position, split over this run's ranks."""
        if state.get("version") != STATE_VERSION or state.get("kind") != self.kind:
            raise ValueError(
                f"the checkpoint's data loader state ({state.get('kind')!r}, version {state.get('version')}) "
                f"is not a {self.kind!r} state of version {STATE_VERSION}; it cannot be resumed by this loader"
            )
        expected = {"seed": self.seed, **self._settings()}
        for key, value in expected.items():
            if state.get(key) != value:
                raise ValueError(
                    f"cannot resume the data loader: the checkpoint has {key}={state.get(key)!r}, this run has "
                    f"{value!r}; resuming would not continue the same sample order"
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        if not 0 <= position <= self._units_in_epoch(epoch):
            raise ValueError(f"checkpoint position {position} is outside epoch {epoch}")
        if state["world_size"] != self.world_size:
            log.warning(
                "resharding the data loader: checkpoint from %d data-parallel ranks, this run has %d; "
                "continuing epoch %d at position %d with the rest split over the new ranks",
                state["world_size"],
                self.world_size,
                epoch,
                position,
            )
        self.epoch, self.position = epoch, position


class DistributedBatchLoader(_EpochLoader):
    """Endless [batch_size, seq_len] batches of packed windows.

    Each epoch is a seeded permutation of all windows; a step takes the next batch_size * world_size of them,
    rank r taking the r-th run of batch_size. The last windows of an epoch that cannot fill a step are skipped.
    """

    kind = "packed"

    def __init__(
        self,
        dataset: PackedSequences,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
    ) -> None:
        super().__init__(rank, world_size, seed)
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.dataset = dataset
        self.batch_size = batch_size
        self._cached_epoch, self._cached_order = -1, np.empty(0, dtype=np.int64)
        if len(dataset) < batch_size * world_size:
            raise ValueError(
                f"{len(dataset)} sequences cannot fill one batch of {batch_size} on each of {world_size} ranks"
            )

    def epoch_order(self, epoch: int) -> np.ndarray:
        if epoch != self._cached_epoch:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.dataset))
            self._cached_epoch, self._cached_order = epoch, order
        return self._cached_order

    def _units_in_epoch(self, epoch: int) -> int:
        return len(self.dataset)

    def _units_per_step(self) -> int:
        return self.batch_size * self.world_size

    def _settings(self) -> dict[str, Any]:
        # batch_size is not here: the position counts windows, so a new batch size continues correctly.
        return {"dataset": self.dataset.fingerprint()}

    def _batch(self, epoch: int, start: int) -> Batch:
        first = start + self.rank * self.batch_size
        indices = self.epoch_order(epoch)[first : first + self.batch_size]
        rows = torch.from_numpy(np.stack([self.dataset[int(i)] for i in indices]))
        documents = torch.from_numpy(np.stack([self.dataset.document_ids(int(i)) for i in indices]))
        return Batch(rows[:, :-1], rows[:, 1:], documents[:, :-1])

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "batch_size": self.batch_size}


def _padded_tokens(end: int, start: int, lengths: np.ndarray) -> int:
    """Tokens in a padded batch of rows start..end of a length-sorted pool: rows x the longest (the last)."""
    return (end - start + 1) * int(lengths[end])


def token_budget_batches(lengths: np.ndarray, order: np.ndarray, max_tokens: int, pool_size: int) -> list:
    """Split ``order`` (sample indices) into batches whose rows x longest row <= max_tokens.

    Each run of pool_size samples is sorted by length, then cut greedily: a batch grows while its padded size
    (rows x the newest, longest row) stays within the budget, so rows in a batch have similar lengths.
    """
    batches = []
    for pool_start in range(0, len(order), pool_size):
        pool = order[pool_start : pool_start + pool_size]
        pool = pool[np.argsort(lengths[pool], kind="stable")]
        pool_lengths = lengths[pool]
        start = 0
        while start < len(pool):
            # (rows) x (length of the last row) grows with the end, so the largest end can be bisected.
            padded = functools.partial(_padded_tokens, start=start, lengths=pool_lengths)
            stop = bisect.bisect_right(range(start, len(pool)), max_tokens, key=padded)
            stop = start + max(stop, 1)
            batches.append(pool[start:stop])
            start = stop
    return batches


class TokenBudgetBatchLoader(_EpochLoader):
    """Endless variable-shape batches of whole documents (dynamic batching) under a padded-token budget.

    Each epoch: a seeded permutation of the samples, cut into length-sorted batches by
    ``token_budget_batches``, then the batches in a seeded random order. A step takes the next world_size
    batches, rank r taking the r-th. ``Batch.inputs.numel() <= max_tokens`` always.
    """

    kind = "token_budget"

    def __init__(
        self,
        dataset: DocumentSequences,
        max_tokens: int,
        pad_id: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        pool_size: int = 16_384,
    ) -> None:
        super().__init__(rank, world_size, seed)
        if max_tokens < dataset.max_len:
            raise ValueError(
                f"max_tokens {max_tokens} is below max_len {dataset.max_len}: one long sample would not fit"
            )
        if pool_size < 1:
            raise ValueError(f"pool_size must be positive, got {pool_size}")
        self.dataset = dataset
        self.max_tokens = max_tokens
        self.pad_id = pad_id
        self.pool_size = pool_size
        self._cached_epoch = -1
        self._cached_batches: list[np.ndarray] = []
        if self._units_in_epoch(0) < world_size:
            raise ValueError(
                f"the data makes {self._units_in_epoch(0)} batches of {max_tokens} tokens, fewer than "
                f"one for each of {world_size} ranks"
            )

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        if epoch != self._cached_epoch:
            batches = shuffled_budget_batches(
                self.dataset, [self.seed, epoch], self.max_tokens, self.pool_size
            )
            self._cached_epoch, self._cached_batches = epoch, batches
        return self._cached_batches

    def _units_in_epoch(self, epoch: int) -> int:
        return len(self.epoch_batches(epoch))

    def _units_per_step(self) -> int:
        return self.world_size

    def _settings(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset.fingerprint(),
            "max_tokens": self.max_tokens,
            "pool_size": self.pool_size,
        }

    def _batch(self, epoch: int, start: int) -> Batch:
        return padded_batch(self.dataset, self.epoch_batches(epoch)[start + self.rank], self.pad_id)


def shuffled_budget_batches(
    dataset: DocumentSequences, key: list[int], max_tokens: int, pool_size: int
) -> list[np.ndarray]:
    """One epoch of token-budget batches: a permutation of the samples seeded by ``key``, cut into
    length-sorted batches (``token_budget_batches``), the batches then in an order seeded by ``key + [1]``."""
    order = np.random.default_rng(key).permutation(len(dataset))
    batches = token_budget_batches(dataset.lengths, order, max_tokens, pool_size)
    shuffle = np.random.default_rng([*key, 1]).permutation(len(batches))
    return [batches[i] for i in shuffle]


def padded_batch(dataset: DocumentSequences, indices: np.ndarray, pad_id: int) -> Batch:
    """The samples ``indices`` of ``dataset``, one per row, left-aligned and padded to the longest."""
    width = int(dataset.lengths[indices].max())
    inputs = np.full((len(indices), width), pad_id, dtype=np.int64)
    targets = np.full((len(indices), width), IGNORE_INDEX, dtype=np.int64)
    documents = np.full((len(indices), width), PAD_DOCUMENT, dtype=np.int64)
    for row, index in enumerate(indices):
        tokens = dataset[int(index)]
        inputs[row, : len(tokens) - 1] = tokens[:-1]
        targets[row, : len(tokens) - 1] = tokens[1:]
        documents[row, : len(tokens) - 1] = 0
    return Batch(torch.from_numpy(inputs), torch.from_numpy(targets), torch.from_numpy(documents))


def build_train_loader(
    folder: Path,
    config,
    rank: int = 0,
    world_size: int = 1,
    pad_id: int | None = None,
) -> DistributedBatchLoader | TokenBudgetBatchLoader:
    """The loader ``config.data.batching`` asks for, sized by ``config.train`` (seq_len, batch_size)."""
    train, data = config.train, config.data
    if data.batching == "packed":
        return DistributedBatchLoader(
            PackedSequences(folder, train.seq_len),
            train.batch_size,
            rank=rank,
            world_size=world_size,
            seed=data.shuffle_seed(config.project.seed),
        )
    if pad_id is None:
        raise ValueError(
            "token_budget batching needs the tokenizer's pad id (the tokenize manifest's pad_id)"
        )
    return TokenBudgetBatchLoader(
        DocumentSequences(folder, train.seq_len),
        data.max_tokens_per_batch or train.batch_size * train.seq_len,
        pad_id=pad_id,
        rank=rank,
        world_size=world_size,
        seed=data.shuffle_seed(config.project.seed),
    )
