"""The report stage: complete a training run's MLflow run and register its model.

One report per training run (``report/<snapshot>/<run>/`` for ``train/<snapshot>/<run>/``, by default the
latest complete run; ``train.run_id`` names another), so a registered version points at a checkpoint in a
run folder that no later training replaces.

It finds the training run (the id the trainer put in its manifest, else the ``train`` stage run whose
output digest matches, else it creates one nested under the training's DAG run) and makes sure it
holds per-step metrics (from ``metrics.jsonl`` when the trainer did not log them live), the training
plots, the manifests of the whole chain, the tokenizer, sample generations from the final checkpoint,
and the model (weights or a pointer), registered in the Model Registry.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from pipeline.config import PipelineConfig
from pipeline.core.lineage import Lineage
from pipeline.core.manifest import MANIFEST_NAME, Manifest, sha256_file
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.tracking.mlflow_runs import (
    TAG_OUTPUT_DIGEST,
    TAG_STAGE,
    TrackedRun,
    ensure_experiment,
    mlflow_client,
    registered_model_name,
    search_runs,
    tracking_uri,
)

log = logging.getLogger(__name__)
STAGE = "report"
METRIC_KEYS = ("loss", "lr", "grad_norm", "tokens_per_s", "step_time_s")
MODEL_ARTIFACT = "model"


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


def read_history(train_path: Path) -> list[dict[str, Any]]:
    path = train_path / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_training(history: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [row["step"] for row in history]
    figure, (loss_axis, speed_axis) = plt.subplots(1, 2, figsize=(10, 3.5))
    loss_axis.plot(steps, [row.get("loss") for row in history], color="tab:blue")
    loss_axis.set(title="training loss", xlabel="step", ylabel="cross-entropy")
    speed_axis.plot(steps, [row.get("tokens_per_s") for row in history], color="tab:green")
    speed_axis.set(title="throughput", xlabel="step", ylabel="tokens/s")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def find_training_run(config: PipelineConfig, train_manifest: Manifest) -> str | None:
    """The MLflow run that recorded this training output, if any."""
    client = mlflow_client(config)
    run_id = train_manifest.extra.get("mlflow_run_id")
    if run_id:
        try:
            client.get_run(run_id)
            return run_id
        except Exception as exc:
            log.warning(
                "train manifest names MLflow run %s, which is not in %s: %s",
                run_id,
                tracking_uri(config),
                exc,
            )
    experiment_id = ensure_experiment(client, config)
    found = search_runs(client, experiment_id, {TAG_STAGE: "train", TAG_OUTPUT_DIGEST: train_manifest.digest})
    return found[0].info.run_id if found else None


def training_run(
    config: PipelineConfig, train_ref: DatasetRef, train_manifest: Manifest
) -> tuple[TrackedRun, bool]:
    """(run, created): the existing training run, or a new ``train`` stage run made from the manifest."""
    run_id = find_training_run(config, train_manifest)
    if run_id is not None:
        return TrackedRun.attach(config, run_id), False
    lineage = Lineage(**train_manifest.lineage) if train_manifest.lineage else Lineage()
    tracked = TrackedRun.start_stage_run(config, "train", train_ref.snapshot, lineage=lineage)
    # What the training itself ran with, even if this report was started with another config.
    tracked.set_tags({"config_hash": train_manifest.config_hash, "git_commit": train_manifest.code_version})
    direct_inputs = [
        (Manifest.read(Path(ref["path"]) / MANIFEST_NAME), ref["path"])
        for ref in train_manifest.inputs
        if (Path(ref["path"]) / MANIFEST_NAME).is_file()
    ]
    tracked.log_datasets(direct_inputs, context="training")
    tracked.log_output(train_manifest)
    return tracked, True


def log_history(tracked: TrackedRun, history: list[dict], train_manifest: Manifest) -> int:
    """Per-step metrics from metrics.jsonl, unless the trainer already logged them live."""
    if tracked.client.get_metric_history(tracked.run_id, "loss"):
        return 0
    count = 0
    for row in history:
        values = {key: row[key] for key in METRIC_KEYS if row.get(key) is not None}
        tracked.log_metrics(values, step=int(row["step"]))
        count += len(values)
    if train_manifest.extra.get("val_loss") is not None:
        tracked.log_metrics(
            {"val_loss": train_manifest.extra["val_loss"]}, step=train_manifest.rows.get("steps", 0)
        )
        count += 1
    tracked.flush()
    return count


def write_model_artifact(
    config: PipelineConfig, checkpoint: Path, tokenizer_file: Path | None, folder: Path
) -> dict[str, Any]:
    """The registered model's files: weights (or a pointer to the checkpoint), config, tokenizer."""
    import torch

    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    folder.mkdir(parents=True, exist_ok=True)
    pointer = {
        "checkpoint": str(checkpoint),
        "sha256": sha256_file(checkpoint),
        "bytes": checkpoint.stat().st_size,
        "step": state["train_state"]["step"],
        "config_hash": state.get("config_hash"),
        "format": config.tracking.checkpoint_artifact,
    }
    if config.tracking.checkpoint_artifact == "weights":
        torch.save({"model_config": state["model_config"], "model": state["model"]}, folder / "model.pt")
        pointer["weights"] = "model.pt"
    (folder / "checkpoint.json").write_text(json.dumps(pointer, indent=2) + "\n")
    (folder / "model_config.json").write_text(json.dumps(state["model_config"], indent=2) + "\n")
    if tokenizer_file is not None and tokenizer_file.is_file():
        (folder / "tokenizer.json").write_bytes(tokenizer_file.read_bytes())
    (folder / "README.md").write_text(
        "pretrain-pipeline GPT. Load it with `pipeline.tracking.mlflow_report.load_model(model_uri)`,\n"
        "or by hand: `GPT(GPTConfig(**json.load(open('model_config.json'))))` and\n"
        "`load_state_dict(torch.load('model.pt', weights_only=True)['model'])`. When `checkpoint.json` has\n"
        "no `weights`, the weights are in the checkpoint file it points to (check its sha256).\n"
    )
    return pointer


def load_model(model_uri: str, tracking: str | None = None):
    """A registered model (``models:/<name>/<version>``) or a run artifact URI as a GPT in eval mode.

    ``tracking``: the MLflow tracking URI (default: $MLFLOW_TRACKING_URI); it also serves as the registry.
    """
    import mlflow
    import torch
    from mlflow.tracking import MlflowClient

    from pipeline.tracking.samples import load_model as build

    if model_uri.startswith("models:/"):
        name, _, version = model_uri.removeprefix("models:/").partition("/")
        client = MlflowClient(tracking, registry_uri=tracking or mlflow.get_tracking_uri())
        model_uri = client.get_model_version_download_uri(name, version)
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, tracking_uri=tracking))
    pointer = json.loads((local / "checkpoint.json").read_text())
    if pointer.get("weights"):
        return build(torch.load(local / pointer["weights"], map_location="cpu", weights_only=True))
    checkpoint = Path(pointer["checkpoint"])
    if sha256_file(checkpoint) != pointer["sha256"]:
        raise ValueError(f"{checkpoint} does not match the registered sha256 {pointer['sha256']}")
    return build(torch.load(checkpoint, map_location="cpu", weights_only=True))


def log_model_files(
    config: PipelineConfig,
    tracked: TrackedRun,
    history: list[dict],
    checkpoint: Path,
    tokenizer_file: Path | None,
) -> tuple[list[dict], dict[str, Any]]:
    """(samples, model pointer): the training plot, sample generations from the checkpoint (when there is a
    tokenizer and ``tracking.sample_tokens``) and the model artifact, each logged to the run."""
    samples = []
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        if history:
            plot_training(history, scratch / "training.png")
            tracked.log_artifact(scratch / "training.png", "plots")
        if config.tracking.sample_tokens and tokenizer_file and tokenizer_file.is_file():
            from pipeline.tracking.samples import format_samples, sample_generations

            samples = sample_generations(
                checkpoint,
                tokenizer_file,
                config.tracking.sample_prompts,
                config.tracking.sample_tokens,
                config.tokenizer.eos_token,
            )
            tracked.log_text(json.dumps(samples, indent=2, ensure_ascii=False), "samples/generations.json")
            tracked.log_text(format_samples(samples), "samples/generations.txt")
        pointer = write_model_artifact(config, checkpoint, tokenizer_file, scratch / MODEL_ARTIFACT)
        tracked.log_artifact(scratch / MODEL_ARTIFACT, MODEL_ARTIFACT)
    return samples, pointer


def log_lineage(tracked: TrackedRun, manifests: list[Manifest], tokenizer_file: Path | None) -> None:
    """Every manifest of the chain (train first) and the tokenizer, as artifacts of the run."""
    for manifest in manifests:
        tracked.log_artifact(Path(manifest.path) / MANIFEST_NAME, f"manifests/{manifest.stage}")
    if tokenizer_file is not None and tokenizer_file.is_file():
        tracked.log_artifact(tokenizer_file, "tokenizer")


def register(
    config: PipelineConfig,
    tracked: TrackedRun,
    train_ref: DatasetRef,
    train_manifest: Manifest,
    dataset_digest: str,
    checkpoint_sha256: str,
):
    """The model version registered under ``registered_model_name(config)``; None when no name is set."""
    name = registered_model_name(config)
    if not name:
        return None
    return tracked.register_model(
        name,
        MODEL_ARTIFACT,
        tags={
            "snapshot": train_ref.snapshot,
            "train_run": train_ref.run or "",
            "corpus": train_ref.corpus,
            "config_hash": train_manifest.config_hash,
            "train_digest": train_manifest.digest,
            "dataset_digest": dataset_digest,
            "checkpoint_sha256": checkpoint_sha256,
        },
    )


def run(config: PipelineConfig, inputs: list[DatasetRef], output: DatasetRef) -> Manifest:
    (train_ref,) = inputs
    train_manifest = train_ref.manifest()
    chain = upstream_manifests(train_manifest)
    history = read_history(train_ref.path)
    checkpoint = train_ref.path / train_manifest.extra["checkpoint"]
    tokenize = next((m for m in chain if m.stage == "tokenize"), None)
    tokenizer_file = Path(tokenize.path) / "tokenizer.json" if tokenize else None
    dataset_digest = tokenize.digest if tokenize else ""
    if config.hash != train_manifest.config_hash:
        log.warning(
            "report config %s differs from the training config %s; the training run's params stay as logged",
            config.hash,
            train_manifest.config_hash,
        )

    with StageOutput(output, config, inputs) as out:
        tracked, created = training_run(config, train_ref, train_manifest)
        try:
            metric_count = log_history(tracked, history, train_manifest)
            samples, pointer = log_model_files(config, tracked, history, checkpoint, tokenizer_file)
            log_lineage(tracked, [train_manifest, *chain], tokenizer_file)
            tracked.set_tags(
                {
                    "checkpoint": str(checkpoint),
                    "checkpoint_sha256": pointer["sha256"],
                    "pretrain.train_digest": train_manifest.digest,
                    "pretrain.dataset_digest": dataset_digest,
                }
            )
            version = register(config, tracked, train_ref, train_manifest, dataset_digest, pointer["sha256"])
            if created:
                tracked.finish("FINISHED")
        except BaseException:
            if created:
                tracked.finish("FAILED")
            raise

        record = {
            "run_id": tracked.run_id,
            "experiment_id": tracked.experiment_id,
            "tracking_uri": tracking_uri(config),
            "registered_model": version.name if version else None,
            "model_version": version.version if version else None,
        }
        (out.path / "mlflow_run.json").write_text(json.dumps(record, indent=2) + "\n")
        log.info(
            "MLflow training run %s%s (%s)",
            tracked.run_id,
            f", model {version.name} v{version.version}" if version else "",
            tracking_uri(config),
        )
        return out.commit(
            rows={"metrics": metric_count, "samples": len(samples)},
            extra={
                "mlflow_run_id": tracked.run_id,
                "mlflow_experiment_id": tracked.experiment_id,
                "tracking_uri": tracking_uri(config),
                "registered_model": record["registered_model"],
                "model_version": record["model_version"],
                "final_loss": train_manifest.extra.get("final_loss"),
                "checkpoint": str(checkpoint),
                "train_run": train_ref.run,
            },
        )
