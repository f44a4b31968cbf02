"""How samples become a rank's batch: the batching strategies ``data.batching`` chooses between.

A strategy says what one *unit* of the data order is, how an epoch of one source orders its units, and how
a rank's units become a ``Batch``. The order itself (which unit of which source a step reads) is the
loader's (``pipeline.data.loader``), the same for both strategies.

- ``Packed``: a unit is one window of ``seq_len + 1`` tokens (``PackedSequences``); an epoch is a seeded
  permutation of the windows; a rank takes ``batch_size`` units, one per row: ``[batch_size, seq_len]``.
- ``TokenBudget`` (dynamic batching): a unit is a whole batch of documents (``DocumentSequences``) whose rows
  x longest row never exceeds ``max_tokens``; an epoch is a seeded permutation of the samples cut into
  length-sorted batches (``token_budget_batches``), the batches then in a seeded order; a rank takes one
  unit. The rest of a row is padding (targets ``IGNORE_INDEX``).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from pipeline.data.sequences import (
    IGNORE_INDEX,
    PAD_DOCUMENT,
    Batch,
    DocumentSequences,
    PackedSequences,
)

Dataset = PackedSequences | DocumentSequences
EpochUnits = np.ndarray | list[np.ndarray]  # packed: window indices; token budget: batches of sample indices


class Batching(Protocol):
    kind: str  # how a checkpoint's loader state names it
    units_per_rank: int  # units one rank takes per batch

    def dataset(self, folders: Sequence[Path], seq_len: int) -> Dataset: ...

    def check(self, datasets: Sequence[Dataset], where: Sequence[str]) -> None:
        """ValueError (``where`` names each source) if the datasets cannot be batched this way together."""

    def epoch_units(self, dataset: Dataset, key: list[int]) -> EpochUnits:
        """One epoch's units of ``dataset`` in the order seeded by ``key``."""

    def fixed_epoch_size(self, dataset: Dataset, first_epoch: EpochUnits) -> int | None:
        """Units in every epoch when all epochs have one size; None when each must be counted."""

    def tokens_per_unit(self, dataset: Dataset, first_epoch: EpochUnits) -> float: ...

    def batch(self, picks: Sequence[tuple[Dataset, Any]]) -> tuple[Batch, list[int]]:
        """The batch of ``picks`` (dataset, unit) and, per row, the index in ``picks`` the row came from."""

    def too_few(self, units: int, world_size: int) -> str:
        """Why ``units`` per epoch cannot give each of ``world_size`` ranks a batch."""

    def identity(self) -> dict[str, Any]:
        """Settings that define the units; a checkpoint is only valid with the same ones."""

    def recorded(self) -> dict[str, Any]:
        """Settings a checkpoint records without checking them."""


class Packed:
    """``[batch_size, seq_len]`` batches of packed windows, one window per row."""

    kind = "packed"

    def __init__(self, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.batch_size = batch_size
        self.units_per_rank = batch_size

    def dataset(self, folders: Sequence[Path], seq_len: int) -> PackedSequences:
        return PackedSequences(folders, seq_len)

    def check(self, datasets: Sequence[Dataset], where: Sequence[str]) -> None:
        for dataset, name in zip(datasets, where, strict=True):
            if not isinstance(dataset, PackedSequences):
                raise TypeError(
                    f"packed batching reads PackedSequences, {name} is a {type(dataset).__name__}"
                )
        if len({dataset.seq_len for dataset in datasets if isinstance(dataset, PackedSequences)}) > 1:
            raise ValueError("every mixture source must have the same seq_len")

    def epoch_units(self, dataset: Dataset, key: list[int]) -> np.ndarray:
        return np.random.default_rng(key).permutation(len(dataset))

    def fixed_epoch_size(self, dataset: Dataset, first_epoch: EpochUnits) -> int | None:
        return len(dataset)

    def tokens_per_unit(self, dataset: Dataset, first_epoch: EpochUnits) -> float:
        assert isinstance(dataset, PackedSequences)
        return float(dataset.seq_len)

    def batch(self, picks: Sequence[tuple[Dataset, Any]]) -> tuple[Batch, list[int]]:
        windows, documents = [], []
        for dataset, window in picks:
            assert isinstance(dataset, PackedSequences)
            windows.append(dataset[int(window)])
            documents.append(dataset.document_ids(int(window)))
        rows, ids = torch.from_numpy(np.stack(windows)), torch.from_numpy(np.stack(documents))
        return Batch(rows[:, :-1], rows[:, 1:], ids[:, :-1]), list(range(len(picks)))

    def too_few(self, units: int, world_size: int) -> str:
        return f"{units} sequences cannot fill one batch of {self.batch_size} on each of {world_size} ranks"

    def identity(self) -> dict[str, Any]:
        # batch_size is not here: the position counts windows, so a new batch size continues correctly.
        return {}

    def recorded(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size}


class TokenBudget:
    """Variable-shape batches of whole documents (dynamic batching) under a padded-token budget:
    ``Batch.inputs.numel() <= max_tokens`` always."""

    kind = "token_budget"
    units_per_rank = 1

    def __init__(self, max_tokens: int, pad_id: int, pool_size: int = 16_384) -> None:
        if pool_size < 1:
            raise ValueError(f"pool_size must be positive, got {pool_size}")
        self.max_tokens = max_tokens
        self.pad_id = pad_id
        self.pool_size = pool_size

    def dataset(self, folders: Sequence[Path], seq_len: int) -> DocumentSequences:
        return DocumentSequences(folders, seq_len)

    def check(self, datasets: Sequence[Dataset], where: Sequence[str]) -> None:
        for dataset, name in zip(datasets, where, strict=True):
            if not isinstance(dataset, DocumentSequences):
                raise TypeError(
                    f"token_budget batching reads DocumentSequences, {name} is a {type(dataset).__name__}"
                )
            if self.max_tokens < dataset.max_len:
                raise ValueError(
                    f"max_tokens {self.max_tokens} is below max_len {dataset.max_len} ({name}): one long "
                    "sample would not fit"
                )

    def epoch_units(self, dataset: Dataset, key: list[int]) -> list[np.ndarray]:
        assert isinstance(dataset, DocumentSequences)
        return shuffled_budget_batches(dataset, key, self.max_tokens, self.pool_size)

    def fixed_epoch_size(self, dataset: Dataset, first_epoch: EpochUnits) -> int | None:
        # All samples in one length-sorting pool: every epoch cuts the same lengths into the same number of
        # batches. Otherwise epoch sizes differ.
        return len(first_epoch) if len(dataset) <= self.pool_size else None

    def tokens_per_unit(self, dataset: Dataset, first_epoch: EpochUnits) -> float:
        assert isinstance(dataset, DocumentSequences)
        return float(dataset.lengths.sum()) / len(first_epoch)

    def batch(self, picks: Sequence[tuple[Dataset, Any]]) -> tuple[Batch, list[int]]:
        ((dataset, indices),) = picks
        assert isinstance(dataset, DocumentSequences)
        batch = padded_batch(dataset, indices, self.pad_id)
        return batch, [0] * batch.inputs.shape[0]

    def too_few(self, units: int, world_size: int) -> str:
        return (
            f"the data makes {units} batches of {self.max_tokens} tokens, fewer than one for each of "
            f"{world_size} ranks"
        )

    def identity(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens, "pool_size": self.pool_size}

    def recorded(self) -> dict[str, Any]:
        return {}


def batching_for(config, pad_id: int | None) -> Packed | TokenBudget:
    """The strategy ``config.data.batching`` asks for, sized by ``config.train`` (seq_len, batch_size)."""
    train, data = config.train, config.data
    if data.batching == "packed":
        return Packed(train.batch_size)
    if pad_id is None:
        raise ValueError(
            "token_budget batching needs the tokenizer's pad id (the tokenize manifest's pad_id)"
        )
    return TokenBudget(data.max_tokens_per_batch or train.batch_size * train.seq_len, pad_id)


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
