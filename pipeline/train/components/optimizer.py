"""AdamW with weight decay on matrices only, replicated (DDP) or sharded over the ranks (ZeRO-1)."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.optim import ZeroRedundancyOptimizer

from pipeline.train.config import TrainConfig


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay on matrices (linear and embedding weights); norms and biases are left alone."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def build_optimizer(
    model: torch.nn.Module, train: TrainConfig, device: torch.device, process_group: Any = None
) -> torch.optim.Optimizer:
    """``process_group``: the ranks ZeRO-1 shards over (a pipeline stage's "dp" group); None: all."""
    options: dict[str, Any] = {"lr": train.lr, "betas": tuple(train.betas)}
    # The fused CUDA kernel is the fastest AdamW there; on CPU the default (foreach) is.
    if device.type == "cuda":
        options["fused"] = True
    groups = parameter_groups(model, train.weight_decay)
    if train.data_parallel == "zero1":
        return ZeroRedundancyOptimizer(
            groups, optimizer_class=torch.optim.AdamW, process_group=process_group, **options
        )
    return torch.optim.AdamW(groups, **options)


class OptimizerState(Stateful):
    """The optimizer as a checkpoint part.

    ``state_dict()`` is the full state on rank 0 (empty elsewhere: only rank 0 writes the checkpoint). Collective under ZeRO-1: every rank must call
    it, since each holds only its shard; the consolidated state has the same layout as a plain AdamW's.
    ``load_state_dict()`` takes that full state on every rank (ZeRO-1 keeps its own shard of it).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, rank: int) -> None:
        self.optimizer = optimizer
        self.rank = rank

    def state_dict(self) -> dict[str, Any]:
        if isinstance(self.optimizer, ZeroRedundancyOptimizer):
            self.optimizer.consolidate_state_dict(to=0)
        return self.optimizer.state_dict() if self.rank == 0 else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)
