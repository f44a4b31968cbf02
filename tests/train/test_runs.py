"""One output per training run: train/<snapshot>/<run>/ with a `latest` pointer, resume finds the run it
continues, and a sweep's reports register checkpoints that stay (issue 17, item 3)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlflow
import pytest
import torch

from pipeline.core.config import ConfigError
from pipeline.core.storage import LATEST, DatasetRef
from pipeline.train.fault_injection import ENV_FAULT
from pipeline.train.launcher.runs import RunRecord, decide_run
from pipeline.train.trainer import Trainer, TrainingStopped, train
from tests.train.support import (
    finish,
    pretrain_train,
    single_process,
    start,
    train_config,
    unfinished_run,
    write_config,
    write_token_corpus,
)

SNAPSHOT = "runs"


def complete_runs(config) -> list[str]:
    folder = DatasetRef.of(config, "train", SNAPSHOT).snapshot_path
    return sorted(p.name for p in folder.iterdir() if not p.is_symlink() and (p / "_SUCCESS").is_file())


def test_three_trainings_of_a_snapshot_keep_three_runs_and_latest_names_the_newest(tmp_path):
    config = single_process(train_config(tmp_path / "data"), tmp_path)
    write_token_corpus(config, SNAPSHOT)

    manifests = [train(config, SNAPSHOT) for _ in range(3)]

    runs = [manifest.extra["run_id"] for manifest in manifests]
    assert len(set(runs)) == 3 and complete_runs(config) == sorted(runs)
    for run, manifest in zip(runs, manifests, strict=True):
        ref = DatasetRef.of(config, "train", SNAPSHOT, run=run)
        assert manifest.path == str(ref.path) == str(ref.snapshot_path / run)
        assert (ref.path / manifest.extra["checkpoint"]).is_file()  # nobody's checkpoints were replaced
        assert RunRecord.read(ref.path).run_id == run
    # Readers that name no run read the newest; naming one (train.run_id) reads that one.
    assert os.readlink(DatasetRef.of(config, "train", SNAPSHOT).snapshot_path / LATEST) == runs[-1]
    assert DatasetRef.of(config, "train", SNAPSHOT).manifest().extra["run_id"] == runs[-1]
    assert DatasetRef.of(config.with_run(runs[0]), "train", SNAPSHOT).manifest().extra["run_id"] == runs[0]
    # A complete run is never trained again.
    with pytest.raises(ConfigError, match=f"train.run_id={runs[0]}: that run .* is complete"):
        train(config.with_run(runs[0]), SNAPSHOT)


def test_resume_finds_the_unfinished_run_of_its_settings_past_another_run(tmp_path, monkeypatch):
    config = single_process(train_config(tmp_path / "data"), tmp_path)
    write_token_corpus(config, SNAPSHOT)
    monkeypatch.setenv(ENV_FAULT, "SIGTERM@4")
    with pytest.raises(TrainingStopped):
        train(config, SNAPSHOT)
    monkeypatch.delenv(ENV_FAULT)
    stopped = RunRecord.read(unfinished_run(config, SNAPSHOT)).run_id

    other = train(single_process(train_config(tmp_path / "data", "train.lr=0.001"), tmp_path), SNAPSHOT)
    assert other.extra["run_id"] != stopped  # started after, but with another learning rate

    config = single_process(config, tmp_path)
    trainer = Trainer(config.with_run(decide_run(config, SNAPSHOT)), SNAPSHOT)
    assert (trainer.run_id, trainer.step) == (stopped, 4)
    resumed = trainer.run()
    assert resumed.extra["run_id"] == stopped and resumed.rows["steps"] == 8
    assert complete_runs(config) == sorted([stopped, other.extra["run_id"]])
    assert DatasetRef.of(config, "train", SNAPSHOT).run == stopped  # the one published last


@pytest.mark.slow
def test_a_sweep_of_concurrent_trainings_and_their_reports_keep_every_registered_checkpoint(tmp_path):
    """The issue's case: trainings of one snapshot and their reports, the registry pointing at checkpoints
    (tracking.checkpoint_artifact=pointer). Two `pretrain train` launchers at once, as a sweep started in the
    background, then `pretrain report` for each run."""
    from mlflow.tracking import MlflowClient

    from pipeline.evaluate.__main__ import main as evaluate_main
    from pipeline.export.__main__ import main as export_main
    from pipeline.report.__main__ import main as report_main
    from pipeline.report.mlflow_report import load_model

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = train_config(
        tmp_path / "data",
        "train.nproc_per_node=1",
        "train.max_restarts=0",
        "tracking.checkpoint_artifact=pointer",
        f"tracking.mlflow_tracking_uri={store}",
    )
    write_token_corpus(config, SNAPSHOT)
    path = write_config(config, tmp_path / "config.yaml")
    rates = {"0.003": None, "0.001": None}
    launchers = {lr: start(pretrain_train(path, SNAPSHOT, f"train.lr={lr}")) for lr in rates}
    for lr, launcher in launchers.items():
        output = finish(launcher)
        rates[lr] = Path(output.strip().splitlines()[-1]).name  # the launcher prints the run's folder
    assert complete_runs(config) == sorted(rates.values())

    for run in rates.values():
        for main in (export_main, evaluate_main, report_main):
            assert main(["--config", str(path), "--snapshot", SNAPSHOT, "--set", f"train.run_id={run}"]) == 0
    client = MlflowClient(store, registry_uri=store)
    versions = client.search_model_versions("name = 'pretrain-sample-tiny'")
    assert sorted(v.tags["train_run"] for v in versions) == sorted(rates.values())
    for version in versions:
        run = version.tags["train_run"]
        report = DatasetRef.of(config, "report", SNAPSHOT, run=run).manifest()
        assert report.extra["model_version"] == version.version
        train_ref = DatasetRef.of(config, "train", SNAPSHOT, run=run)
        assert str(train_ref.path) in report.extra["checkpoint"]
        # The version's checkpoint is still there, unchanged (load_model checks its sha256).
        model = load_model(f"models:/pretrain-sample-tiny/{version.version}", tracking=store)
        final = torch.load(train_ref.path / train_ref.manifest().extra["checkpoint"], weights_only=True)
        for key, tensor in final["model"].items():
            assert torch.equal(model.state_dict()[key], tensor), (run, key)
        # The version is made from the report's LoggedModel, which names the corpora the run trained on and
        # holds the evaluation figures (the checkpoints' own are tests/train/test_train_metrics.py's).
        model_id = report.extra["logged_model_id"]
        assert version.source == f"models:/{model_id}"
        logged = client.get_logged_model(model_id)
        assert logged.source_run_id == report.extra["mlflow_run_id"] and str(logged.status) == "READY"
        assert logged.tags["pretrain.snapshots"] == logged.params["snapshots"] == f"sample/{SNAPSHOT}"
        assert logged.tags["pretrain.train_digest"] == train_ref.manifest().digest
        evaluation = json.loads(
            (DatasetRef.of(config, "evaluate", SNAPSHOT, run=run).path / "metrics.json").read_text()
        )
        scores = {metric.key: metric.value for metric in logged.metrics}
        assert scores["eval_loss"] == pytest.approx(evaluation["overall"]["loss"])
        mlflow.set_tracking_uri(store)
        try:
            models = mlflow.search_logged_models(
                experiment_ids=[logged.experiment_id],
                filter_string=f"source_run_id = '{logged.source_run_id}'",
                output_format="list",
            )
        finally:
            mlflow.set_tracking_uri(None)
        assert [m.model_id for m in models] == [model_id]  # tracking.stage_runs=false: no checkpoint ones
    # A second report of a run registers nothing new: the same LoggedModel, the same version.
    first = next(iter(rates.values()))
    before = DatasetRef.of(config, "report", SNAPSHOT, run=first).manifest().extra
    assert report_main(["--config", str(path), "--snapshot", SNAPSHOT, "--set", f"train.run_id={first}"]) == 0
    again = DatasetRef.of(config, "report", SNAPSHOT, run=first).manifest().extra
    assert (again["model_version"], again["logged_model_id"]) == (
        before["model_version"],
        before["logged_model_id"],
    )
    assert len(client.search_model_versions("name = 'pretrain-sample-tiny'")) == len(versions)
