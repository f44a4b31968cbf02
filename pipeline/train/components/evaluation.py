"""Validation loss over a fixed set of windows, split over the ranks and summed with one all-reduce.

The set is the first ``eval_sequences`` packed windows of the validation split, whatever the number of ranks,
so the figure is comparable across runs of different sizes. It is the token-weighted mean of ``lm_loss``
(the cross-entropy, without MoE router losses).

Under a pipeline the windows are split over the data-parallel ranks only: every pipeline rank of a
data-parallel group reads the same windows, and ``Pipeline.validation_loss`` passes each batch stage to
stage (forward only), so the loss is known on the last stage, which alone counts the windows.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from pipeline.data.sequences import PackedSequences

log = logging.getLogger(__name__)


class Validator:
    def __init__(
        self,
        folder: Path | Sequence[Path],
        *,
        seq_len: int,
        batch_size: int,
        sequences: int,
        rank: int,
        world_size: int,
        device: torch.device,
        document_masking: bool,
        lockstep: bool = False,
    ) -> None:
        """``lockstep``: every rank runs as many forwards as the rank with the most windows (FSDP's forward
        gathers parameters, a collective), the extra ones on a throw-away batch whose loss is not counted."""
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
        most = -(-total // world_size)  # the first rank's windows, the most any rank has
        self.filler_batches = -(-most // batch_size) - -(-len(self.indices) // batch_size) if lockstep else 0

    @property
    def available(self) -> bool:
        return self.dataset is not None

    @torch.no_grad()
    def evaluate_with(
        self,
        lm_loss: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor | None],
        all_reduce_sum: Callable[[torch.Tensor], object],
    ) -> float | None:
        """Mean validation loss over all ranks' windows, every rank calling it (one collective), with
        ``lm_loss(inputs, targets, document_ids)`` (the parallelism's ``validation_loss``, in eval mode) giving
        each batch's mean loss, or None on a rank that does not compute it (a pipeline rank without the last stage: its windows are
        counted where the loss is)."""
        if self.dataset is None:
            return None
        totals = torch.zeros(2, dtype=torch.float64, device=self.device)
        for start in range(0, len(self.indices), self.batch_size):
            chosen = self.indices[start : start + self.batch_size]
            rows = torch.from_numpy(np.stack([self.dataset[i] for i in chosen])).to(self.device)
            documents = None
            if self.document_masking:
                documents = torch.from_numpy(np.stack([self.dataset.document_ids(i)[:-1] for i in chosen]))
                documents = documents.to(self.device)
            loss = lm_loss(rows[:, :-1], rows[:, 1:], documents)
            if loss is None:
                continue
            count = rows[:, 1:].numel()
            totals[0] += loss.double() * count
            totals[1] += count
        for _ in range(self.filler_batches):
            rows = torch.from_numpy(self.dataset[0][None]).to(self.device)
            lm_loss(rows[:, :-1], rows[:, 1:], None)
        all_reduce_sum(totals)
        loss_sum, count = totals.tolist()
        return loss_sum / count if count else None


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else math.inf
