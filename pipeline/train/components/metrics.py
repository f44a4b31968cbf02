"""The trainer's figures beyond loss: throughput, MFU, memory and MoE routing.

They go out through ``pipeline.tracking.metric_sinks`` (metrics.jsonl, MLflow, TensorBoard, Prometheus, ECS lines).
Nothing here synchronises with the device except where a logged value needs a number.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import psutil
import torch

from pipeline.train.config import TrainConfig

# Dense bf16/fp16 tensor-core peaks (no sparsity) by device name, for MFU when train.peak_flops is unset.
PEAK_FLOPS_16BIT = (
    ("H200", 989.4e12),
    ("H100", 989.4e12),
    ("A100", 312e12),
    ("L40S", 362.1e12),
    ("A10G", 125e12),
    ("L4", 121e12),
)


def peak_flops_per_device(train: TrainConfig, device: torch.device) -> float | None:
    """train.peak_flops, else the table above for a known GPU in bf16/fp16, else None (no MFU)."""
    if train.peak_flops is not None:
        return train.peak_flops
    if device.type == "cuda" and train.precision in ("bf16", "fp16"):
        name = torch.cuda.get_device_name(device)
        for marker, flops in PEAK_FLOPS_16BIT:
            if marker in name:
                return flops
    return None


class Throughput:
    """Tokens and wall time between two log points (all ranks together).

    Evaluation and checkpoint time is held out (``excluded()``) and reported on its own, so tokens/s and
    MFU describe training steps.
    """

    def __init__(self, flops_per_token: float, peak_flops_total: float | None) -> None:
        self.flops_per_token = flops_per_token
        self.peak_flops_total = peak_flops_total
        self._reset()

    def _reset(self) -> None:
        self._since = time.perf_counter()
        self._excluded = 0.0
        self._tokens = 0
        self._steps = 0

    def add_step(self, tokens: int) -> None:
        self._tokens += tokens
        self._steps += 1

    @contextlib.contextmanager
    def excluded(self):
        started = time.perf_counter()
        try:
            yield
        finally:
            self._excluded += time.perf_counter() - started

    def collect(self) -> dict[str, float]:
        """Figures since the previous collect(); call after a device sync (a logged .item() is one)."""
        elapsed = max(time.perf_counter() - self._since - self._excluded, 1e-9)
        tokens_per_s = self._tokens / elapsed
        figures = {
            "tokens_per_s": round(tokens_per_s, 1),
            "step_time_s": round(elapsed / max(self._steps, 1), 5),
            "tokens": self._tokens,
        }
        if self.peak_flops_total:
            figures["mfu"] = round(self.flops_per_token * tokens_per_s / self.peak_flops_total, 5)
        self._reset()
        return figures


def memory_metrics(device: torch.device) -> dict[str, float]:
    """CUDA: the peak allocated by tensors since the start; CPU: this process' resident set size."""
    if device.type == "cuda":
        return {"memory_gb": round(torch.cuda.max_memory_allocated(device) / 1e9, 4)}
    return {"memory_gb": round(psutil.Process().memory_info().rss / 1e9, 4)}


def router_metrics(model: Any) -> dict[str, float]:
    """MoE routing of the latest training forward on this rank: load per expert and drops, per layer and overall.

    ``moe/layer<l>/expert<e>_load`` is the share of layer l's kept assignments that went to expert e
    (1/E when balanced); ``moe/load_imbalance`` the largest max/mean load over layers (1 when balanced).
    """
    stats = model.router_stats()
    if not stats:
        return {}
    metrics: dict[str, float] = {}
    imbalance = 0.0
    for layer in stats:
        counts = layer["tokens_per_expert"]
        kept = sum(counts)
        for expert, count in enumerate(counts):
            metrics[f"moe/layer{layer['layer']}/expert{expert}_load"] = (
                round(count / kept, 5) if kept else 0.0
            )
        metrics[f"moe/layer{layer['layer']}/drop_rate"] = round(layer["drop_rate"], 5)
        if kept:
            imbalance = max(imbalance, max(counts) / (kept / len(counts)))
    metrics["moe/drop_rate"] = round(sum(layer["drop_rate"] for layer in stats) / len(stats), 5)
    metrics["moe/load_imbalance"] = round(imbalance, 5)
    metrics["moe/aux_loss"] = round(sum(layer["aux_loss"] for layer in stats), 6)
    metrics["moe/z_loss"] = round(sum(layer["z_loss"] for layer in stats), 6)
    return metrics
