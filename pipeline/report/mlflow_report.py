"""The report stage: complete a training run's MLflow run and register its model.

One report per training run (``report/<snapshot>/<run>/`` for ``train/<snapshot>/<run>/``, by default the
latest complete run; ``train.run_id`` names another), so a registered version points at a checkpoint in a
run folder that no later training replaces.

It finds the training run (the id the trainer put in its manifest, else the ``train`` stage run whose
output digest matches, else it creates one nested under the training's DAG run) and makes sure it
holds per-step metrics (from ``metrics.jsonl`` when the trainer did not log them live), the training
plots, the manifests of the whole chain, the tokenizer, sample generations from the final checkpoint,
and the model, registered in the Model Registry: an MLflow pyfunc text generator over the export stage's
Hugging Face folder (``mlflow.pyfunc.load_model(uri).predict(["prompt"])`` needs only mlflow, torch and
transformers), which also holds this project's weights or a pointer to the checkpoint (``load_model`` below).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from pipeline.config import PipelineConfig
from pipeline.core.config import redact_url
from pipeline.core.lineage import Lineage
from pipeline.core.manifest import MANIFEST_NAME, Manifest, sha256_file, upstream_manifests
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
                redact_url(tracking_uri(config)),
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
    from pipeline.model.checkpoint import save_weights, whole_model_checkpoint

    state = whole_model_checkpoint(checkpoint)
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
        pointer["weights"] = "model.pt"
        pointer["weights_sha256"] = save_weights(state, folder / "model.pt")
    (folder / "checkpoint.json").write_text(json.dumps(pointer, indent=2) + "\n")
    (folder / "model_config.json").write_text(json.dumps(state["model_config"], indent=2) + "\n")
    if tokenizer_file is not None and tokenizer_file.is_file():
        (folder / "tokenizer.json").write_bytes(tokenizer_file.read_bytes())
    return pointer


HF_FILES = ("*.json", "*.safetensors", "README.md")  # the exported model, without the stage's own files
CHECKPOINT_ARTIFACT = "checkpoint"  # this project's own weights (or pointer) inside the registered model


def save_registered_model(export_folder: Path, checkpoint_folder: Path, destination: Path) -> None:
    """The registered model as an MLflow pyfunc (``hf_generator.py``, logged as code): a text generator over
    the exported folder (artifact ``hf_model``), plus this project's checkpoint files (``checkpoint``)."""
    import shutil
    from importlib.metadata import version

    import mlflow.pyfunc
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    from pipeline.report import hf_generator

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per file in the task log
    hf_folder = destination.parent / hf_generator.ARTIFACT
    hf_folder.mkdir()
    for pattern in HF_FILES:
        for path in export_folder.glob(pattern):
            if path.name != MANIFEST_NAME:
                shutil.copy2(path, hf_folder / path.name)
    kinds = {int: "long", float: "double"}
    signature = ModelSignature(
        inputs=Schema([ColSpec("string")]),
        outputs=Schema([ColSpec("string")]),
        params=ParamSchema(
            [ParamSpec(name, kinds[type(value)], value) for name, value in hf_generator.DEFAULTS.items()]
        ),
    )
    mlflow.pyfunc.save_model(
        destination,
        python_model=hf_generator.__file__,
        artifacts={hf_generator.ARTIFACT: str(hf_folder), CHECKPOINT_ARTIFACT: str(checkpoint_folder)},
        signature=signature,
        # Pinned by hand: inferring them imports every optional transformers backend.
        pip_requirements=[
            f"{name}=={version(name)}" for name in ("mlflow", "torch", "transformers", "safetensors")
        ],
    )


def load_model(model_uri: str, tracking: str | None = None):
    """A registered model (``models:/<name>/<version>``) or a run artifact URI as a GPT in eval mode.

    ``tracking``: the MLflow tracking URI (default: $MLFLOW_TRACKING_URI); it also serves as the registry.
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    from pipeline.model.inference import load_model as read_model

    if model_uri.startswith("models:/"):
        name, _, version = model_uri.removeprefix("models:/").partition("/")
        client = MlflowClient(tracking, registry_uri=tracking or mlflow.get_tracking_uri())
        model_uri = client.get_model_version_download_uri(name, version)
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, tracking_uri=tracking))
    if (local / "artifacts" / CHECKPOINT_ARTIFACT).is_dir():
        local = local / "artifacts" / CHECKPOINT_ARTIFACT
    pointer = json.loads((local / "checkpoint.json").read_text())
    if pointer.get("weights"):
        return read_model(local / pointer["weights"], sha256=pointer["weights_sha256"])
    checkpoint = Path(pointer["checkpoint"])
    if sha256_file(checkpoint) != pointer["sha256"]:
        raise ValueError(f"{checkpoint} does not match the registered sha256 {pointer['sha256']}")
    return read_model(checkpoint)


def log_model_files(
    config: PipelineConfig,
    tracked: TrackedRun,
    history: list[dict],
    checkpoint: Path,
    tokenizer_file: Path | None,
    export_folder: Path,
    model_id: str | None = None,
) -> tuple[list[dict], dict[str, Any]]:
    """(samples, model pointer): the training plot, sample generations from the checkpoint (when there is a
    tokenizer and ``tracking.sample_tokens``) and the model (``save_registered_model``), each logged to the
    run; the model also into the LoggedModel ``model_id``, the registered version's source."""
    samples = []
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        if history:
            plot_training(history, scratch / "training.png")
            tracked.log_artifact(scratch / "training.png", "plots")
        if config.tracking.sample_tokens and tokenizer_file and tokenizer_file.is_file():
            from pipeline.model.inference import checkpoint_generations, format_samples

            samples = checkpoint_generations(
                checkpoint,
                tokenizer_file,
                config.tracking.sample_prompts,
                config.tracking.sample_tokens,
                config.bpe.eos_token,
            )
            tracked.log_text(json.dumps(samples, indent=2, ensure_ascii=False), "samples/generations.json")
            tracked.log_text(format_samples(samples), "samples/generations.txt")
        pointer = write_model_artifact(config, checkpoint, tokenizer_file, scratch / CHECKPOINT_ARTIFACT)
        save_registered_model(export_folder, scratch / CHECKPOINT_ARTIFACT, scratch / MODEL_ARTIFACT)
        tracked.log_artifact(scratch / MODEL_ARTIFACT, MODEL_ARTIFACT)
        if model_id is not None:
            tracked.client.log_model_artifacts(model_id, str(scratch / MODEL_ARTIFACT))
    return samples, pointer


def log_evaluation(tracked: TrackedRun, evaluation: Path, step: int) -> dict[str, tuple[float, int, int]]:
    """The evaluate stage's figures as metrics (overall and per language) and its files as artifacts; returns
    the figures as (value, step, timestamp), for the exported model's LoggedModel."""
    metrics = json.loads((evaluation / "metrics.json").read_text())
    values = {}
    if metrics.get("overall"):
        values = {
            "eval_loss": metrics["overall"]["loss"],
            "eval_perplexity": metrics["overall"]["perplexity"],
        }
    if metrics.get("lm_eval"):
        values |= {
            "lm_eval_acc": metrics["lm_eval"]["acc"],
            "lm_eval_acc_norm": metrics["lm_eval"]["acc_norm"],
        }
    for language, group in metrics.get("by_language", {}).items():
        values[f"eval_loss.{language}"] = group["loss"]
    for name, group in (metrics.get("by_source") or {}).items():
        values[f"eval_loss.source.{name}"] = group["loss"]
    now = int(time.time() * 1000)
    tracked.log_metrics(values, step=step, timestamp_ms=now)
    tracked.flush()
    for name in ("metrics.json", "generations.json"):
        tracked.log_artifact(evaluation / name, "evaluation")
    tracked.log_artifact(evaluation / "plots", "evaluation/plots")
    if (evaluation / "lm_eval").is_dir():
        tracked.log_artifact(evaluation / "lm_eval", "evaluation/lm_eval")
    return {key: (float(value), step, now) for key, value in values.items() if value is not None}


EXPORTED_MODEL = "exported"  # the LoggedModel of the report's model, one per training run


def exported_model(
    tracked: TrackedRun, train_ref: DatasetRef, train_manifest: Manifest, dataset_digest: str
) -> str:
    """The LoggedModel the registered version is made from: this run's, when a report of the same training
    output made one already (a re-run registers the same version), else a new one linked to its corpora."""
    from mlflow.tracking import MlflowClient

    client: MlflowClient = tracked.client
    for model in client.search_logged_models(
        [tracked.experiment_id], filter_string=f"source_run_id = '{tracked.run_id}'"
    ):
        if model.name == EXPORTED_MODEL and model.tags.get("pretrain.train_digest") == train_manifest.digest:
            return str(model.model_id)
    inputs = train_manifest.extra.get("inputs") or []
    snapshots = sorted({f"{entry['corpus']}/{entry['snapshot']}" for entry in inputs}) or [
        f"{train_ref.corpus}/{train_ref.snapshot}"
    ]
    return tracked.create_logged_model(
        EXPORTED_MODEL,
        params={
            "snapshots": ",".join(snapshots)[:5000],
            "inputs": ",".join(f"{e['corpus']}/{e['snapshot']}@{e['digest']}" for e in inputs)[:5000],
            "train_run": train_ref.run or "",
            "config_hash": train_manifest.config_hash,
            "checkpoint": str(train_ref.path / train_manifest.extra["checkpoint"]),
        },
        tags={
            "pretrain.snapshots": ",".join(snapshots)[:5000],
            "pretrain.tokenizer_digest": train_manifest.extra.get("tokenizer_digest") or "",
            "pretrain.train_digest": train_manifest.digest,
            "pretrain.dataset_digest": dataset_digest,
        },
        model_type="export",
    )


def log_lineage(tracked: TrackedRun, manifests: list[Manifest], tokenizer_file: Path | None) -> None:
    """Every manifest of the chain (train first) and the tokenizer, as artifacts of the run."""
    stages = [manifest.stage for manifest in manifests]
    for manifest in manifests:
        # A mixture reads a stage's output of several snapshots: each under its corpus and snapshot.
        folder = f"manifests/{manifest.stage}"
        if stages.count(manifest.stage) > 1:
            folder += f"/{manifest.corpus}/{manifest.snapshot}"
        tracked.log_artifact(Path(manifest.path) / MANIFEST_NAME, folder)
    if tokenizer_file is not None and tokenizer_file.is_file():
        tracked.log_artifact(tokenizer_file, "tokenizer")


def register(
    config: PipelineConfig,
    tracked: TrackedRun,
    train_ref: DatasetRef,
    train_manifest: Manifest,
    dataset_digest: str,
    checkpoint_sha256: str,
    model_id: str | None = None,
):
    """The model version registered under ``registered_model_name(config)`` (from the LoggedModel
    ``model_id`` when given); None when no name is set."""
    name = registered_model_name(config)
    if not name:
        return None
    inputs = train_manifest.extra.get("inputs") or []
    listed = [f"{entry['corpus']}/{entry['snapshot']}" for entry in inputs]
    description = (
        "Trained on "
        + (
            "; ".join(
                f"{entry['corpus']}/{entry['snapshot']} (source {entry['source']}, weight {entry['weight']:.4g}, "
                f"manifest {entry['digest']})"
                for entry in inputs
            )
            or f"{train_ref.corpus}/{train_ref.snapshot}"
        )
        + f"; tokenizer {train_manifest.extra.get('tokenizer_digest') or '-'}."
    )
    return tracked.register_model(
        name,
        MODEL_ARTIFACT,
        description=description,
        tags={
            "inputs": ",".join(listed)[:5000],
            "tokenizer_digest": train_manifest.extra.get("tokenizer_digest") or "",
            "snapshot": train_ref.snapshot,
            "train_run": train_ref.run or "",
            "corpus": train_ref.corpus,
            "config_hash": train_manifest.config_hash,
            "train_digest": train_manifest.digest,
            "dataset_digest": dataset_digest,
            "checkpoint_sha256": checkpoint_sha256,
        },
        model_id=model_id,
    )


def run(config: PipelineConfig, inputs: list[DatasetRef], output: DatasetRef) -> Manifest:
    from pipeline.model.checkpoint import step_files

    train_ref, export_ref, evaluate_ref = inputs
    train_manifest = train_ref.manifest()
    chain = upstream_manifests(train_manifest)
    history = read_history(train_ref.path)
    checkpoint = train_ref.path / train_manifest.extra["checkpoint"]
    # What gets registered is what export and train published, byte for byte.
    export_ref.verify()
    train_ref.verify(*(file.relative_to(train_ref.path).as_posix() for file in step_files(checkpoint)))
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
            model_id = exported_model(tracked, train_ref, train_manifest, dataset_digest)
            samples, pointer = log_model_files(
                config, tracked, history, checkpoint, tokenizer_file, export_ref.path, model_id
            )
            steps = train_manifest.rows.get("steps", 0)
            scores = log_evaluation(tracked, evaluate_ref.path, steps)
            log_lineage(tracked, [train_manifest, *chain], tokenizer_file)
            tracked.set_tags(
                {
                    "checkpoint": str(checkpoint),
                    "checkpoint_sha256": pointer["sha256"],
                    "pretrain.train_digest": train_manifest.digest,
                    "pretrain.dataset_digest": dataset_digest,
                }
            )
            tracked.finish_logged_model(model_id, scores)
            version = register(
                config, tracked, train_ref, train_manifest, dataset_digest, pointer["sha256"], model_id
            )
            if created:
                tracked.finish("FINISHED")
        except BaseException:
            if created:
                tracked.finish("FAILED")
            raise

        record = {
            "run_id": tracked.run_id,
            "experiment_id": tracked.experiment_id,
            # Without userinfo: credentials from $MLFLOW_TRACKING_URI must not land in the output.
            "tracking_uri": redact_url(tracking_uri(config)),
            "registered_model": version.name if version else None,
            "model_version": version.version if version else None,
            "logged_model_id": model_id,
        }
        (out.path / "mlflow_run.json").write_text(json.dumps(record, indent=2) + "\n")
        log.info(
            "MLflow training run %s%s (%s)",
            tracked.run_id,
            f", model {version.name} v{version.version}" if version else "",
            redact_url(tracking_uri(config)),
        )
        return out.commit(
            rows={"metrics": metric_count, "samples": len(samples)},
            extra={
                "mlflow_run_id": tracked.run_id,
                "mlflow_experiment_id": tracked.experiment_id,
                "tracking_uri": record["tracking_uri"],
                "registered_model": record["registered_model"],
                "model_version": record["model_version"],
                "logged_model_id": model_id,
                "final_loss": train_manifest.extra.get("final_loss"),
                "checkpoint": str(checkpoint),
                "train_run": train_ref.run,
            },
        )
