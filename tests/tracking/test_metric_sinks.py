"""The trainer's metrics fan-out: every sink receives the same steps, read back through its own reader."""

from __future__ import annotations

import json
import logging
import random
import urllib.request

import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from pipeline.tracking.metric_sinks import JsonlMetrics, LogLineMetrics, MetricsLogger, build_metrics_logger
from pipeline.tracking.mlflow_runs import ENV_RUN_ID, TrackedRun
from tests.conftest import make_config


def steps(seed: int, count: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "loss": rng.uniform(0.5, 9),
            "lr": rng.uniform(0, 1e-2),
            "tokens_per_s": rng.uniform(1, 1e5),
            "step_time_s": rng.uniform(0.01, 2),
            "tokens": rng.randint(1, 4096),
        }
        for _ in range(count)
    ]


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv(ENV_RUN_ID, raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_rank0_writes_jsonl_mlflow_tensorboard_log_lines_and_prometheus(tmp_path, clean_env, caplog):
    config = make_config(tmp_path / "data", "tracking.prometheus_port=0")
    output = tmp_path / "train-output"
    logger = build_metrics_logger(config, rank=0, local_rank=0, output_dir=output, snapshot="s1")
    kinds = [type(sink).__name__ for sink in logger.sinks]
    assert kinds == [
        "JsonlMetrics",
        "MlflowMetrics",
        "TensorBoardMetrics",
        "LogLineMetrics",
        "PrometheusMetrics",
    ]
    history = steps(3, 30)
    exporter = logger.sinks[-1].exporter
    with caplog.at_level(logging.INFO, logger="pipeline.train.progress"):
        for step, metrics in enumerate(history, start=1):
            logger.log(metrics, step)
        scraped = urllib.request.urlopen(exporter.url, timeout=30).read().decode()
    run_id = logger.mlflow_run_id
    logger.close()

    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": step, **metrics} for step, metrics in enumerate(history, start=1)]

    client = MlflowClient(f"sqlite:///{tmp_path / 'data' / 'mlflow.db'}")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["pretrain.stage"] == "train"
    losses = client.get_metric_history(run_id, "loss")
    assert [(m.step, m.value) for m in losses] == [(i, m["loss"]) for i, m in enumerate(history, start=1)]

    events = EventAccumulator(str(output / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.value for e in events.Scalars("train/tokens_per_s")] == pytest.approx(
        [m["tokens_per_s"] for m in history], rel=1e-6
    )

    progress = [r for r in caplog.records if r.name == "pipeline.train.progress"]
    assert [getattr(r, "pretrain.step") for r in progress] == list(range(1, 31))
    assert getattr(progress[-1], "pretrain.loss") == history[-1]["loss"]

    assert f'pretrain_tokens_total{{rank="0"}} {float(sum(m["tokens"] for m in history))}' in scraped


def test_other_ranks_only_serve_prometheus_on_port_plus_local_rank(tmp_path, clean_env):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        base = sock.getsockname()[1]
    config = make_config(
        tmp_path / "data", f"tracking.prometheus_port={base - 1}", "tracking.prometheus_addr=127.0.0.1"
    )
    logger = build_metrics_logger(config, rank=5, local_rank=1, output_dir=tmp_path / "out", snapshot="s1")
    try:
        assert [type(s).__name__ for s in logger.sinks] == ["PrometheusMetrics"]
        assert logger.sinks[0].exporter.port == base
        assert logger.mlflow_run_id is None
    finally:
        logger.close()
    assert not (tmp_path / "out").exists() and not (tmp_path / "data" / "mlflow.db").exists()


def test_a_run_handed_down_by_the_launcher_is_used_and_left_open(tmp_path, clean_env, monkeypatch):
    config = make_config(tmp_path / "data", "tracking.tensorboard=false")
    launcher_run = TrackedRun.start_stage_run(config, "train", "s1")
    monkeypatch.setenv(ENV_RUN_ID, launcher_run.run_id)
    logger = build_metrics_logger(config, rank=0, local_rank=0, output_dir=tmp_path / "out", snapshot="s1")
    logger.log({"loss": 2.0}, 1)
    logger.close()
    assert logger.mlflow_run_id == launcher_run.run_id
    run = launcher_run.client.get_run(launcher_run.run_id)
    assert run.info.status == "RUNNING" and run.data.metrics["loss"] == 2.0


def test_unreachable_mlflow_is_reported_and_training_metrics_still_flow(
    tmp_path, clean_env, monkeypatch, caplog
):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    config = make_config(
        tmp_path / "data", "tracking.mlflow_tracking_uri=http://127.0.0.1:9", "tracking.tensorboard=false"
    )
    with caplog.at_level(logging.ERROR):
        logger = build_metrics_logger(
            config, rank=0, local_rank=0, output_dir=tmp_path / "out", snapshot="s1"
        )
    assert [type(s).__name__ for s in logger.sinks] == ["JsonlMetrics", "LogLineMetrics"]
    assert any("MLflow metrics is off for this run" in r.getMessage() for r in caplog.records)
    logger.log({"loss": 1.0}, 1)
    logger.close()
    assert (tmp_path / "out" / "metrics.jsonl").read_text() == '{"step": 1, "loss": 1.0}\n'


def test_a_failing_sink_is_reported_and_dropped_unless_required(tmp_path, caplog):
    class Broken:
        def log(self, metrics, step):
            raise OSError("disk full")

        def close(self, status="FINISHED"):
            pass

    jsonl = JsonlMetrics(tmp_path / "m.jsonl")
    logger = MetricsLogger([Broken(), jsonl, LogLineMetrics()])
    with caplog.at_level(logging.ERROR):
        logger.log({"loss": 1.0}, 1)
        logger.log({"loss": 0.5}, 2)
    logger.close()
    assert len(logger.sinks) == 2
    assert sum("Broken failed and is dropped" in r.getMessage() for r in caplog.records) == 1
    assert len((tmp_path / "m.jsonl").read_text().splitlines()) == 2
    with pytest.raises(OSError, match="disk full"):
        MetricsLogger([Broken()], required=True).log({"loss": 1.0}, 1)
