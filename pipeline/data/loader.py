"""Packed fixed-length training sequences from token shards, sharded by data-parallel rank, resumable."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from pipeline.tokenization.shards import Shard, shard_prefixes


class PackedSequences:
    """All shard tokens as one stream (documents already end in EOS), cut into windows of seq_len + 1."""

    def __init__(self, folder: Path, seq_len: int) -> None:
        prefixes = shard_prefixes(folder)
        if not prefixes:
            raise FileNotFoundError(f"no token shards (*.idx) in {folder}")
        self.seq_len = seq_len
        self.shards = [Shard(prefix) for prefix in prefixes]
        self.stream = np.concatenate([np.asarray(shard.tokens) for shard in self.shards]).astype(np.int64)
        if len(self.stream) < seq_len + 1:
            raise ValueError(f"{folder} holds {len(self.stream)} tokens, fewer than one sequence of {seq_len + 1}")

    def __len__(self) -> int:
        return (len(self.stream) - 1) // self.seq_len

    def __getitem__(self, index: int) -> np.ndarray:
        start = index * self.seq_len
        return self.stream[start : start + self.seq_len + 1]


class DistributedBatchLoader:
    """Endless batches; each epoch is a seeded permutation, split round-robin across ranks.

    ``state_dict()`` captures (epoch, batch) so a resumed run continues with exactly the next batch.
    """

    def __init__(
        self,
        dataset: PackedSequences,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.epoch = 0
        self.batch_in_epoch = 0
        self._cached_epoch, self._cached_indices = -1, np.empty(0, dtype=np.int64)
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"{len(dataset)} sequences cannot fill one batch of {batch_size} on each of {world_size} ranks"
            )

    @property
    def batches_per_epoch(self) -> int:
        return len(self.dataset) // (self.batch_size * self.world_size)

    def _epoch_indices(self, epoch: int) -> np.ndarray:
        if epoch != self._cached_epoch:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.dataset))
            usable = self.batches_per_epoch * self.batch_size * self.world_size
            self._cached_epoch, self._cached_indices = epoch, order[:usable][self.rank :: self.world_size]
        return self._cached_indices

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.batch_in_epoch >= self.batches_per_epoch:
            self.epoch += 1
            self.batch_in_epoch = 0
        indices = self._epoch_indices(self.epoch)
        start = self.batch_in_epoch * self.batch_size
        rows = np.stack([self.dataset[i] for i in indices[start : start + self.batch_size]])
        self.batch_in_epoch += 1
        batch = torch.from_numpy(rows)
        return batch[:, :-1], batch[:, 1:]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "world_size": self.world_size, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["world_size"] != self.world_size:
            raise ValueError(
                f"checkpoint was written with data-parallel size {state['world_size']}, this run has {self.world_size}; "
                "resume with the same number of ranks"
            )
        self.epoch = state["epoch"]
        self.batch_in_epoch = state["batch_in_epoch"]
