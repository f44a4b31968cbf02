"""Validation loss over a fixed set of windows, split over the ranks and summed with one all-reduce.

The set is the first ``eval_sequences`` packed windows of the validation split, whatever the number of ranks,
so the figure is comparable across runs of different sizes. It is the token-weighted mean of ``lm_loss``
(the cross-entropy, without MoE router losses).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from pipeline.data.loader import PackedSequences

log = logging.getLogger(__name__)


class Validator:
    def __init__(
        self,
        folder: Path,
        *,
        seq_len: int,
        batch_size: int,
        sequences: int,
        rank: int,
        world_size: int,
        device: torch.device,
        document_masking: bool,
    ) -> None:
        self.batch_size = batch_size
        self.device = device
        self.document_masking = document_masking
        try:
            self.dataset: PackedSequences | None = PackedSequences(folder, seq_len)
        except (FileNotFoundError, ValueError) as exc:
            log.warning("no validation loss for this run: %s", exc)
            self.dataset, self.indices = None, []
            return
        total = min(len(self.dataset), sequences)
        self.indices = list(range(rank, total, world_size))

    @property
    def available(self) -> bool:
        return self.dataset is not None

    @torch.no_grad()
    def evaluate(
        self, model: torch.nn.Module, autocast: Callable, all_reduce_sum: Callable[[torch.Tensor], None]
    ) -> float | None:
        """Mean validation loss over all ranks' windows; every rank must call it (one collective)."""
        if self.dataset is None:
            return None
        was_training = model.training
        model.eval()
        totals = torch.zeros(2, dtype=torch.float64, device=self.device)
        for start in range(0, len(self.indices), self.batch_size):
            chosen = self.indices[start : start + self.batch_size]
            rows = torch.from_numpy(np.stack([self.dataset[i] for i in chosen])).to(self.device)
            documents = None
            if self.document_masking:
                documents = torch.from_numpy(np.stack([self.dataset.document_ids(i)[:-1] for i in chosen]))
                documents = documents.to(self.device)
            with autocast():
                out = model(rows[:, :-1], rows[:, 1:], documents)
            count = rows[:, 1:].numel()
            totals[0] += out.lm_loss.double() * count
            totals[1] += count
        model.train(was_training)
        all_reduce_sum(totals)
        loss_sum, count = totals.tolist()
        return loss_sum / count if count else None


def perplexity(loss: float | None) -> float | None:
    if loss is None:
        return None
    return math.exp(loss) if loss < 700 else math.inf
