"""Linear warm-up, then cosine decay to ``lr x min_lr_ratio`` at the last step."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from pipeline.train.config import TrainConfig


def warmup_cosine(train: TrainConfig) -> Callable[[int], float]:
    """The LR multiplier for the optimizer step with 0-based index ``step``."""

    def factor(step: int) -> float:
        if step < train.warmup_steps:
            return (step + 1) / train.warmup_steps
        progress = min(1.0, (step - train.warmup_steps) / max(1, train.steps - train.warmup_steps))
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return train.min_lr_ratio + (1 - train.min_lr_ratio) * cosine

    return factor


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, train: TrainConfig
) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(train))
