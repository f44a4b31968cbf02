"""The report stage: one MLflow run per training snapshot, with params, metrics, artifacts and lineage."""

from __future__ import annotations

import json
import logging
import tempfile
import time
from pathlib import Path

from pipeline.core.config import PipelineConfig
from pipeline.core.lineage import Lineage, code_version
from pipeline.core.manifest import MANIFEST_NAME, Manifest
from pipeline.core.storage import DatasetRef, StageOutput, local_path

log = logging.getLogger(__name__)
STAGE = "report"
METRIC_KEYS = ("loss", "lr", "grad_norm", "tokens_per_s", "step_time_s")


def tracking_uri(config: PipelineConfig) -> str:
    import os

    if config.tracking.mlflow_tracking_uri:
        return config.tracking.mlflow_tracking_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{local_path(config.project.data_root) / 'mlflow.db'}"


def experiment_name(config: PipelineConfig) -> str:
    return config.tracking.experiment or f"pretrain-{config.project.corpus}"


def ensure_experiment(client, name: str, config: PipelineConfig) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    artifact_root = None
    if tracking_uri(config).startswith("sqlite:"):
        # Without a server, keep artifacts beside the SQLite store rather than in ./mlruns of whatever cwd.
        artifact_root = (local_path(config.project.data_root) / "mlartifacts" / name).as_uri()
    return client.create_experiment(name, artifact_location=artifact_root)


def upstream_manifests(manifest: Manifest) -> list[Manifest]:
    """Walk input references back to the crawl: train -> tokenize -> clean -> crawl."""
    chain, frontier = [], list(manifest.inputs)
    while frontier:
        ref = frontier.pop(0)
        path = Path(ref["path"]) / MANIFEST_NAME
        if path.is_file():
            upstream = Manifest.read(path)
            chain.append(upstream)
            frontier.extend(upstream.inputs)
    return chain


def plot_training(history: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [row["step"] for row in history]
    figure, (loss_axis, speed_axis) = plt.subplots(1, 2, figsize=(10, 3.5))
    loss_axis.plot(steps, [row["loss"] for row in history], color="tab:blue")
    loss_axis.set(title="training loss", xlabel="step", ylabel="cross-entropy")
    speed_axis.plot(steps, [row["tokens_per_s"] for row in history], color="tab:green")
    speed_axis.set(title="throughput", xlabel="step", ylabel="tokens/s")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def run(config: PipelineConfig, inputs: list[DatasetRef], output: DatasetRef) -> Manifest:
    import mlflow
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    (train_ref,) = inputs
    train_manifest = train_ref.manifest()
    chain = upstream_manifests(train_manifest)
    history = [json.loads(line) for line in (train_ref.path / "metrics.jsonl").read_text().splitlines()]
    lineage = Lineage.from_env()

    uri = tracking_uri(config)
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    experiment_id = ensure_experiment(client, experiment_name(config), config)
    tags = {
        "snapshot": output.snapshot,
        "corpus": output.corpus,
        "config_hash": config.hash,
        "git_commit": code_version(),
        **{f"airflow.{key}": str(value) for key, value in lineage.to_dict().items() if value is not None},
    }
    with StageOutput(output, config, inputs, lineage) as out:
        run = client.create_run(experiment_id, run_name=f"train-{output.snapshot}", tags=tags)
        run_id = run.info.run_id
        try:
            params = {
                key: json.dumps(value) if not isinstance(value, str) else value
                for key, value in config.flat().items()
            }
            for key, value in train_manifest.extra["model_config"].items():
                params[f"model_resolved.{key}"] = str(value)
            mlflow.log_params(params, run_id=run_id)
            now = int(time.time() * 1000)
            metrics = [
                Metric(key, float(row[key]), now, int(row["step"]))
                for row in history
                for key in METRIC_KEYS
                if key in row
            ]
            if train_manifest.extra.get("val_loss") is not None:
                metrics.append(
                    Metric(
                        "val_loss", float(train_manifest.extra["val_loss"]), now, train_manifest.rows["steps"]
                    )
                )
            for start in range(0, len(metrics), 1000):
                client.log_batch(run_id, metrics=metrics[start : start + 1000])

            with tempfile.TemporaryDirectory() as scratch:
                scratch = Path(scratch)
                (scratch / "config.yaml").write_text(config.to_yaml())
                plot_training(history, scratch / "training.png")
                client.log_artifact(run_id, str(scratch / "config.yaml"))
                client.log_artifact(run_id, str(scratch / "training.png"), "plots")
            for manifest in [train_manifest, *chain]:
                client.log_artifact(
                    run_id, str(Path(manifest.path) / MANIFEST_NAME), f"manifests/{manifest.stage}"
                )
                if manifest.stage == "tokenize":
                    client.log_artifact(run_id, str(Path(manifest.path) / "tokenizer.json"), "tokenizer")
            client.set_tag(run_id, "checkpoint", str(train_ref.path / train_manifest.extra["checkpoint"]))
            client.set_terminated(run_id, "FINISHED")
        except BaseException:
            client.set_terminated(run_id, "FAILED")
            raise
        (out.path / "mlflow_run.json").write_text(
            json.dumps({"run_id": run_id, "experiment_id": experiment_id, "tracking_uri": uri}, indent=2)
            + "\n"
        )
        log.info("MLflow run %s in experiment %s (%s)", run_id, experiment_name(config), uri)
        return out.commit(
            rows={"metrics": len(metrics)},
            extra={
                "mlflow_run_id": run_id,
                "mlflow_experiment_id": experiment_id,
                "tracking_uri": uri,
                "final_loss": train_manifest.extra.get("final_loss"),
                "checkpoint": str(train_ref.path / train_manifest.extra["checkpoint"]),
            },
        )
