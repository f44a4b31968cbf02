"""The trainer's Prometheus endpoint: a real HTTP server scraped and parsed like Prometheus does."""

from __future__ import annotations

import random
import urllib.request

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.tracking.prometheus import SERIES, TrainingExporter, _NvmlGpu, default_gpu_index

GPU_SERIES = {
    "pretrain_gpu_utilization_percent",
    "pretrain_gpu_memory_used_bytes",
    "pretrain_gpu_memory_total_bytes",
}


def scrape(exporter: TrainingExporter) -> dict[str, list]:
    text = urllib.request.urlopen(exporter.url, timeout=30).read().decode()
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def value(samples, name, **labels):
    (match,) = [s.value for s in samples[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    return match


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_endpoint_exposes_the_training_series(seed):
    rng = random.Random(seed)
    rank = rng.randint(0, 7)
    exporter = TrainingExporter(port=0, rank=rank).start()
    try:
        updates = [
            {
                "step": step,
                "loss": rng.uniform(0, 10),
                "tokens_per_s": rng.uniform(1, 1e6),
                "step_time_s": rng.choice([rng.uniform(0.001, 100), None]),
                "tokens": rng.randint(0, 10_000),
                "lr": rng.uniform(0, 1e-2),
                "grad_norm": rng.uniform(0, 5),
            }
            for step in range(1, rng.randint(2, 40))
        ]
        for update in updates:
            exporter.update(**update)
        samples = scrape(exporter)
    finally:
        exporter.close()

    label = {"rank": str(rank)}
    last = updates[-1]
    assert value(samples, "pretrain_step", **label) == last["step"]
    assert value(samples, "pretrain_loss", **label) == pytest.approx(last["loss"])
    assert value(samples, "pretrain_tokens_per_second", **label) == pytest.approx(last["tokens_per_s"])
    assert value(samples, "pretrain_learning_rate", **label) == pytest.approx(last["lr"])
    assert value(samples, "pretrain_grad_norm", **label) == pytest.approx(last["grad_norm"])
    assert value(samples, "pretrain_tokens_total", **label) == sum(u["tokens"] for u in updates)
    step_times = [u["step_time_s"] for u in updates if u["step_time_s"] is not None]
    if step_times:
        assert value(samples, "pretrain_step_time_seconds", **label) == pytest.approx(step_times[-1])
        assert value(samples, "pretrain_step_duration_seconds_count", **label) == len(step_times)
        assert value(samples, "pretrain_step_duration_seconds_sum", **label) == pytest.approx(sum(step_times))
        within_1s = sum(1 for t in step_times if t <= 1)
        assert value(samples, "pretrain_step_duration_seconds_bucket", le="1.0", **label) == within_1s
    rss = value(samples, "pretrain_process_resident_memory_bytes", **label)
    assert 0 < rss < psutil.virtual_memory().total

    gpu = _NvmlGpu(default_gpu_index())
    assert value(samples, "pretrain_gpu_available", **label) == (1.0 if gpu.available else 0.0)
    exposed = {name.removesuffix("_created") for name in samples}
    expected = set(SERIES) - (set() if gpu.available else GPU_SERIES)
    assert expected <= {
        n.removesuffix("_count").removesuffix("_sum").removesuffix("_bucket") for n in exposed
    }
    if not gpu.available:
        assert not GPU_SERIES & set(samples)


@pytest.mark.skipif(not _NvmlGpu(0).available, reason="needs a GPU that NVML can see")
def test_gpu_series_when_a_gpu_is_present():
    exporter = TrainingExporter(port=0, rank=0, gpu_index=0).start()
    try:
        samples = scrape(exporter)
    finally:
        exporter.close()
    total = value(samples, "pretrain_gpu_memory_total_bytes", rank="0", gpu="0")
    assert total > 0 and 0 <= value(samples, "pretrain_gpu_memory_used_bytes", rank="0", gpu="0") <= total
    assert 0 <= value(samples, "pretrain_gpu_utilization_percent", rank="0", gpu="0") <= 100


def test_a_missing_device_index_exposes_no_gpu_series():
    exporter = TrainingExporter(port=0, rank=3, gpu_index=10_000).start()
    try:
        samples = scrape(exporter)
    finally:
        exporter.close()
    assert value(samples, "pretrain_gpu_available", rank="3") == 0
    assert not GPU_SERIES & set(samples)


def test_gpu_index_follows_local_rank_through_cuda_visible_devices():
    assert default_gpu_index({}) == 0
    assert default_gpu_index({"LOCAL_RANK": "3"}) == 3
    assert default_gpu_index({"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "4,6"}) == 6
    assert default_gpu_index({"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "GPU-ab12,GPU-cd34"}) == 1


def test_two_ranks_in_one_process_keep_their_own_registries():
    first, second = TrainingExporter(port=0, rank=0).start(), TrainingExporter(port=0, rank=1).start()
    try:
        first.update(step=5, loss=1.5)
        second.update(step=7, loss=2.5)
        assert value(scrape(first), "pretrain_loss", rank="0") == 1.5
        assert "1" not in {s.labels["rank"] for s in scrape(first)["pretrain_loss"]}
        assert value(scrape(second), "pretrain_step", rank="1") == 7
    finally:
        first.close()
        second.close()
