"""Mixed precision: autocast for bf16/fp16, dynamic loss scaling for fp16, and skipped-step accounting.

A step whose gradients hold inf or NaN is skipped in every precision: with fp16 the GradScaler finds it (and
lowers its scale), otherwise the global gradient norm is not finite. Skipped steps are counted.

With a fused optimizer (AdamW on CUDA) the skip happens on the device: the kernel is handed a ``found_inf``
flag, as GradScaler does, so no step waits for the GPU to tell the host whether the norm was finite.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
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
        self._skipped_on_host = 0
        self._skipped_on_device: torch.Tensor | None = None  # summed flags of the sync-free path

    @property
    def skipped_steps(self) -> int:
        """Steps skipped so far; reading it waits for the device when the sync-free path is in use."""
        on_device = int(self._skipped_on_device.item()) if self._skipped_on_device is not None else 0
        return self._skipped_on_host + on_device

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def backward(self, loss: torch.Tensor) -> None:
        self.scale(loss).backward()

    def step(
        self,
        optimizer: torch.optim.Optimizer,
        parameters: Iterable[torch.Tensor],
        max_norm: float,
        *,
        total_norm: Callable[[list[torch.Tensor]], torch.Tensor] | None = None,
        agree_found_inf: Callable[[torch.Tensor], None] | None = None,
    ) -> torch.Tensor:
        """Unscale, clip to ``max_norm`` (0: no clipping) and step unless a gradient is not finite.

        Returns the global gradient norm before clipping; ``skipped_steps`` counts the steps not taken.
        A pipeline holds a part of the model per rank: ``total_norm(parameters)`` is then the norm over all
        stages, and ``agree_found_inf(flag)`` (in place, max over the stages) makes every stage's scaler skip
        and back off together, so one loss scale is shared by all stages.
        """
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
            if agree_found_inf is not None:
                # GradScaler keeps unscale_'s verdict per device here; step() and update() read it.
                for found_inf in self.scaler._per_optimizer_states[id(optimizer)][
                    "found_inf_per_device"
                ].values():
                    agree_found_inf(found_inf)
        parameters = [p for p in parameters if p.grad is not None]
        if total_norm is None:
            norm = torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None])
        else:
            norm = total_norm(parameters)
        if max_norm > 0:
            torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            self.scaler.step(optimizer)
            self.scaler.update()
            if self.scaler.get_scale() < scale:  # the scaler backs off exactly when it skipped
                self._skipped_on_host += 1
        elif _is_fused(optimizer):
            found_inf = (~torch.isfinite(norm)).float()
            _step_unless(optimizer, found_inf)
            if self._skipped_on_device is None:
                self._skipped_on_device = torch.zeros((), device=found_inf.device)
            self._skipped_on_device += found_inf
        elif bool(torch.isfinite(norm)):
            optimizer.step()
        else:
            self._skipped_on_host += 1
        return norm

    @property
    def loss_scale(self) -> float | None:
        return self.scaler.get_scale() if self.scaler is not None else None

    def state_dict(self) -> dict[str, Any]:
        return {
            "skipped_steps": self.skipped_steps,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._skipped_on_host = int(state.get("skipped_steps", 0))
        self._skipped_on_device = None
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def _is_fused(optimizer: torch.optim.Optimizer) -> bool:
    return bool(optimizer.defaults.get("fused")) and getattr(optimizer, "_step_supports_amp_scaling", False)


def _step_unless(optimizer: torch.optim.Optimizer, found_inf: torch.Tensor) -> None:
    """Fused Adam(W) reads these attributes, as GradScaler sets them: a non-zero flag leaves parameters,
    moments and step counts as they were, decided on the device."""
    fused: Any = optimizer  # the attributes are a protocol of torch's fused kernels, not of Optimizer
    fused.grad_scale, fused.found_inf = None, found_inf
    try:
        optimizer.step()
    finally:
        del fused.grad_scale, fused.found_inf
