"""What a training run reports, read back through each sink's own reader: an MLflow store (SQLite, the
project's default; MLflow 3 refuses the old file store), TensorBoard event files and the Prometheus endpoint,
for a small MoE model (so the routing figures are there too)."""

from __future__ import annotations

import json
import math
import urllib.request

import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from pipeline.core.storage import DatasetRef
from pipeline.tracking.metric_sinks import PrometheusMetrics
from pipeline.tracking.mlflow_runs import ENV_RUN_ID
from pipeline.train.trainer import Trainer
from tests.train.support import single_process, train_config, write_token_corpus

SNAPSHOT = "metrics"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.delenv(ENV_RUN_ID, raising=False)
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        return _train(tmp_path_factory.mktemp("metrics"))


def _train(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = single_process(
        train_config(
            tmp_path / "data",
            "model.preset=tiny-moe",
            "train.eval_every=4",
            "train.histogram_every=4",
            "train.peak_flops=1e12",
            "tracking.stage_runs=true",
            f"tracking.mlflow_tracking_uri={store}",
            "tracking.required=true",
            "tracking.tensorboard=true",
            "tracking.sample_tokens=4",
            "tracking.prometheus_port=0",
            "tracking.prometheus_addr=127.0.0.1",
        ),
        tmp_path,
    )
    write_token_corpus(config, SNAPSHOT)
    trainer = Trainer(config.with_run("metrics"), SNAPSHOT)
    # One step by hand, so the endpoint can be scraped while the run is alive; run() does the rest.
    trainer.train_step()
    trainer.metrics.log(trainer._train_metrics(), trainer.step)
    exporter = next(s.exporter for s in trainer.metrics.sinks if isinstance(s, PrometheusMetrics))
    scraped = urllib.request.urlopen(exporter.url, timeout=30).read().decode()
    manifest = trainer.run()
    output = DatasetRef.of(config, "train", SNAPSHOT).path
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    return manifest, rows, output, MlflowClient(store), scraped


def test_mlflow_run_holds_every_training_series(run):
    manifest, rows, _, client, _ = run
    mlflow_run = client.get_run(manifest.extra["mlflow_run_id"])
    assert mlflow_run.info.status == "FINISHED"
    losses = client.get_metric_history(mlflow_run.info.run_id, "loss")
    assert [(m.step, m.value) for m in losses] == [(row["step"], row["loss"]) for row in rows]
    assert [m.step for m in client.get_metric_history(mlflow_run.info.run_id, "val_loss")] == [4, 8]
    val = client.get_metric_history(mlflow_run.info.run_id, "val_perplexity")[-1].value
    assert val == pytest.approx(math.exp(rows[-1]["val_loss"]), rel=1e-4)
    logged = set(mlflow_run.data.metrics)
    for key in (
        "lr",
        "grad_norm",
        "tokens_per_s",
        "mfu",
        "memory_gb",
        "skipped_steps",
        "moe/drop_rate",
        "moe/load_imbalance",
        "moe/layer0/expert0_load",
    ):
        assert key in logged, key
    assert mlflow_run.data.params["train.steps"] == "8"


def test_figures_are_consistent(run):
    manifest, rows, _, _, _ = run
    assert [row["step"] for row in rows] == list(range(1, 9))
    for row in rows:
        # MFU is model FLOPs per token x tokens/s over the configured peak (both rounded when logged).
        expected = manifest.extra["flops_per_token"] * row["tokens_per_s"] / 1e12
        assert row["mfu"] == pytest.approx(expected, rel=1e-3, abs=1e-5)
        loads = [value for key, value in row.items() if key.startswith("moe/layer0/expert")]
        assert len(loads) == 4 and sum(loads) == pytest.approx(1.0, abs=1e-3)
        assert 0 <= row["moe/drop_rate"] < 1
    assert rows[-1]["tokens_seen"] == 8 * 4 * 64


def test_tensorboard_has_scalars_gradient_histograms_and_samples(run):
    _, rows, output, _, _ = run
    events = EventAccumulator(
        str(output / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0}
    )
    events.Reload()
    tags = events.Tags()
    assert [e.value for e in events.Scalars("train/loss")] == pytest.approx([row["loss"] for row in rows])
    assert [e.step for e in events.Scalars("train/val_loss")] == [4, 8]
    grads = [tag for tag in tags["histograms"] if tag.startswith("grads/")]
    weights = [tag for tag in tags["histograms"] if tag.startswith("weights/")]
    # A gradient histogram beside every parameter's, for every layer.
    assert sorted(tag.removeprefix("grads/") for tag in grads) == sorted(
        t.removeprefix("weights/") for t in weights
    )
    assert any(".0." in tag for tag in grads) and any(".1." in tag for tag in grads)
    assert [e.step for e in events.Histograms(grads[0])] == [4, 8]
    assert any("samples" in tag for tag in tags["tensors"])


def test_prometheus_endpoint_serves_the_live_step(run):
    _, rows, _, _, scraped = run
    assert 'pretrain_step{rank="0"} 1.0' in scraped
    assert f'pretrain_loss{{rank="0"}} {rows[0]["loss"]}' in scraped


def test_each_checkpoint_is_a_logged_model_with_its_step_losses_and_inputs(run):
    import mlflow

    manifest, rows, output, client, _ = run
    mlflow_run = client.get_run(manifest.extra["mlflow_run_id"])
    mlflow.set_tracking_uri(client.tracking_uri)
    try:
        models = mlflow.search_logged_models(
            experiment_ids=[mlflow_run.info.experiment_id],
            filter_string=f"source_run_id = '{mlflow_run.info.run_id}'",
            output_format="list",
        )
    finally:
        mlflow.set_tracking_uri(None)
    by_step = {int(model.params["step"]): model for model in models}
    assert sorted(by_step) == [3, 6, 8]  # train.checkpoint_every=3, and the last step
    by_step_row = {row["step"]: row for row in rows}
    for step, model in by_step.items():
        assert str(model.status) == "READY"
        checkpoint = output / "checkpoints" / f"step-{step:06d}.pt"  # in the published run, not its staging
        assert model.tags["pretrain.checkpoint"] == model.params["checkpoint"] == str(checkpoint)
        assert checkpoint.is_file()  # train.keep_checkpoints=3 keeps all three
        assert model.model_type == "checkpoint" and model.name == f"step-{step:06d}"
        assert model.tags["pretrain.step"] == str(step)
        assert model.tags["pretrain.inputs"] == mlflow_run.data.tags["pretrain.inputs"] != ""
        metrics = {metric.key: metric for metric in model.metrics}
        assert (
            metrics["loss"].value == pytest.approx(by_step_row[step]["loss"]) and metrics["loss"].step == step
        )
    # The evaluation figures measured by then, at the step they were measured (train.eval_every=4).
    assert "val_loss" not in {metric.key for metric in by_step[3].metrics}
    assert {m.key: m.step for m in by_step[6].metrics}["val_loss"] == 4
    final = {m.key: m for m in by_step[8].metrics}
    assert final["val_loss"].step == 8 and final["val_loss"].value == pytest.approx(rows[-1]["val_loss"])
