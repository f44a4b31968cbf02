"""Mixed precision: autocast for bf16/fp16, dynamic loss scaling for fp16, and skipped-step accounting.

A step whose gradients hold inf or NaN is skipped in every precision: with fp16 the GradScaler finds it (and
lowers its scale), otherwise the global gradient norm is not finite. Skipped steps are counted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class MixedPrecision:
    def __init__(self, precision: str, device: torch.device) -> None:
        if precision not in ("fp32", *DTYPES):
            raise ValueError(f"unknown precision {precision!r}")
        self.precision = precision
        self.device_type = device.type
        self.dtype = DTYPES.get(precision)
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
        self.skipped_steps = 0

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(
        self, optimizer: torch.optim.Optimizer, parameters: Iterable[torch.Tensor], max_norm: float
    ) -> tuple[torch.Tensor, bool]:
        """Unscale, clip to ``max_norm`` (0: no clipping) and step unless a gradient is not finite.

        Returns (the global gradient norm before clipping, whether the optimizer stepped).
        """
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        parameters = [p for p in parameters if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
        if max_norm > 0:
            torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            self.scaler.step(optimizer)
            self.scaler.update()
            stepped = self.scaler.get_scale() >= scale  # the scaler backs off exactly when it skipped
        else:
            stepped = bool(torch.isfinite(norm))
            if stepped:
                optimizer.step()
        if not stepped:
            self.skipped_steps += 1
        return norm, stepped

    @property
    def loss_scale(self) -> float | None:
        return self.scaler.get_scale() if self.scaler is not None else None

    def state_dict(self) -> dict[str, Any]:
        return {
            "skipped_steps": self.skipped_steps,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skipped_steps = int(state.get("skipped_steps", 0))
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
