"""A Prometheus ``/metrics`` endpoint for one training process.

The trainer calls ``update()`` after each step; process RSS and, when NVML sees a GPU for this rank,
GPU utilisation and memory are read at scrape time, so they are fresh even between steps.
Every series carries a ``rank`` label; Prometheus adds ``job`` and ``instance``.

>>> exporter = TrainingExporter(port=9400, rank=0).start()
>>> exporter.update(step=10, loss=3.2, tokens_per_s=51_000.0, step_time_s=0.21, tokens=10_240)
>>> exporter.close()
"""

from __future__ import annotations

import logging
import os
from typing import Any

import psutil
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)
PREFIX = "pretrain"

# Every series the exporter can expose, with its help text; dashboards are tested against this list.
SERIES: dict[str, str] = {
    "pretrain_step": "last completed optimizer step",
    "pretrain_loss": "training loss at the last logged step",
    "pretrain_learning_rate": "learning rate at the last logged step",
    "pretrain_grad_norm": "gradient norm (before clipping) at the last logged step",
    "pretrain_tokens_per_second": "training throughput over the last step, all ranks",
    "pretrain_step_time_seconds": "wall time of the last step",
    "pretrain_step_duration_seconds": "distribution of step wall times",
    "pretrain_tokens_total": "tokens trained on so far, all ranks",
    "pretrain_process_resident_memory_bytes": "resident set size of this training process",
    "pretrain_gpu_available": "1 when NVML reports a GPU for this rank, else 0",
    "pretrain_gpu_utilization_percent": "GPU utilisation over NVML's last sample period",
    "pretrain_gpu_memory_used_bytes": "GPU memory in use on this rank's device",
    "pretrain_gpu_memory_total_bytes": "GPU memory on this rank's device",
}


def default_gpu_index(environ: dict[str, str] | None = None) -> int:
    """NVML numbers all devices; map this rank's LOCAL_RANK through CUDA_VISIBLE_DEVICES when it lists ids."""
    env = os.environ if environ is None else environ
    local_rank = int(env.get("LOCAL_RANK", 0))
    visible = [item.strip() for item in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if item.strip()]
    if visible and all(item.isdigit() for item in visible) and local_rank < len(visible):
        return int(visible[local_rank])
    return local_rank


class _NvmlGpu:
    """One device through pynvml (nvidia-ml-py); ``available`` is False without a driver or device."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.handle = None
        try:
            import pynvml

            pynvml.nvmlInit()
            if index < pynvml.nvmlDeviceGetCount():
                self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._nvml = pynvml
        except Exception as exc:  # no libnvidia-ml, no driver, or no device: expose no GPU series
            log.debug("NVML unavailable (%s); no GPU metrics", exc)

    @property
    def available(self) -> bool:
        return self.handle is not None

    def sample(self) -> tuple[float, int, int]:
        """(utilisation %, memory used bytes, memory total bytes)."""
        utilization = self._nvml.nvmlDeviceGetUtilizationRates(self.handle)
        memory = self._nvml.nvmlDeviceGetMemoryInfo(self.handle)
        return float(utilization.gpu), int(memory.used), int(memory.total)


class _ScrapeTimeCollector(Collector):
    def __init__(self, rank: str, gpu: _NvmlGpu) -> None:
        self.rank = rank
        self.gpu = gpu
        self.process = psutil.Process()

    def collect(self):
        rss = GaugeMetricFamily(
            "pretrain_process_resident_memory_bytes",
            SERIES["pretrain_process_resident_memory_bytes"],
            labels=["rank"],
        )
        rss.add_metric([self.rank], self.process.memory_info().rss)
        yield rss
        available = GaugeMetricFamily(
            "pretrain_gpu_available", SERIES["pretrain_gpu_available"], labels=["rank"]
        )
        available.add_metric([self.rank], 1.0 if self.gpu.available else 0.0)
        yield available
        if not self.gpu.available:
            return
        try:
            utilization, used, total = self.gpu.sample()
        except Exception as exc:  # a GPU that fell off the bus should not break the scrape
            log.warning("NVML query failed: %s", exc)
            return
        labels, values = ["rank", "gpu"], [self.rank, str(self.gpu.index)]
        for name, value in (
            ("pretrain_gpu_utilization_percent", utilization),
            ("pretrain_gpu_memory_used_bytes", used),
            ("pretrain_gpu_memory_total_bytes", total),
        ):
            family = GaugeMetricFamily(name, SERIES[name], labels=labels)
            family.add_metric(values, value)
            yield family


class TrainingExporter:
    """Training metrics for Prometheus from one process, on its own registry and HTTP server."""

    def __init__(
        self,
        port: int = 0,
        addr: str = "127.0.0.1",
        *,
        rank: int = 0,
        gpu_index: int | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.port = port
        self.addr = addr
        self.rank = str(rank)
        self.registry = registry or CollectorRegistry()
        self.gpu = _NvmlGpu(default_gpu_index() if gpu_index is None else gpu_index)
        labels = ["rank"]
        self._step = Gauge("pretrain_step", SERIES["pretrain_step"], labels, registry=self.registry)
        self._loss = Gauge("pretrain_loss", SERIES["pretrain_loss"], labels, registry=self.registry)
        self._lr = Gauge(
            "pretrain_learning_rate", SERIES["pretrain_learning_rate"], labels, registry=self.registry
        )
        self._grad_norm = Gauge(
            "pretrain_grad_norm", SERIES["pretrain_grad_norm"], labels, registry=self.registry
        )
        self._throughput = Gauge(
            "pretrain_tokens_per_second", SERIES["pretrain_tokens_per_second"], labels, registry=self.registry
        )
        self._step_time = Gauge(
            "pretrain_step_time_seconds", SERIES["pretrain_step_time_seconds"], labels, registry=self.registry
        )
        self._step_hist = Histogram(
            "pretrain_step_duration_seconds",
            SERIES["pretrain_step_duration_seconds"],
            labels,
            registry=self.registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, float("inf")),
        )
        # prometheus_client appends _total to counters.
        self._tokens = Counter(
            "pretrain_tokens", SERIES["pretrain_tokens_total"], labels, registry=self.registry
        )
        self.registry.register(_ScrapeTimeCollector(self.rank, self.gpu))
        self._server: Any = None  # prometheus_client's WSGI server, once started

    def start(self) -> TrainingExporter:
        self._server, _ = start_http_server(self.port, self.addr, registry=self.registry)
        self.port = self._server.server_address[1]
        log.info("Prometheus metrics on http://%s:%d/metrics", self.addr, self.port)
        return self

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.addr in ("0.0.0.0", "") else self.addr
        return f"http://{host}:{self.port}/metrics"

    def update(
        self,
        step: int,
        loss: float | None = None,
        tokens_per_s: float | None = None,
        step_time_s: float | None = None,
        tokens: int | None = None,
        lr: float | None = None,
        grad_norm: float | None = None,
    ) -> None:
        """Record one step; ``tokens`` is the number trained on in this step (added to the total)."""
        rank = self.rank
        self._step.labels(rank).set(step)
        for gauge, value in (
            (self._loss, loss),
            (self._throughput, tokens_per_s),
            (self._lr, lr),
            (self._grad_norm, grad_norm),
        ):
            if value is not None:
                gauge.labels(rank).set(value)
        if step_time_s is not None:
            self._step_time.labels(rank).set(step_time_s)
            self._step_hist.labels(rank).observe(step_time_s)
        if tokens:
            self._tokens.labels(rank).inc(tokens)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
