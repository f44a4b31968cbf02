"""Turn a `pretrain` DAG run's form (Params) and triggering asset event into one resolved config file.

The train and report tasks then both read that file, so they agree on every value, and the file is the
record of what this run trained with. XCom carries only its path and the snapshot name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.config import PipelineConfig, load_config
from pipeline.core.config import ConfigError
from pipeline.core.logs import run_folder
from pipeline.core.manifest import MANIFEST_NAME, Manifest
from pipeline.core.storage import MissingInputError, local_path
from pipeline.stages import training_input

# form field -> config key; a field left empty (None) keeps the config's value
PARAM_KEYS = {
    "preset": "model.preset",
    "steps": "train.steps",
    "nodes": "train.nnodes",
    "processes_per_node": "train.nproc_per_node",
    "precision": "train.precision",
    "pipeline_stages": "train.pipeline_stages",
    "microbatches": "train.microbatches",
    "pipeline_schedule": "train.pipeline_schedule",
    "stages_per_rank": "train.stages_per_rank",
    "mlflow_experiment": "tracking.experiment",
}
CONFIG_FILE = "pretrain-config.yaml"


def param_overrides(params: Mapping[str, Any]) -> list[str]:
    return [
        f"{key}={params[name]}"
        for name, key in PARAM_KEYS.items()
        if params.get(name) is not None and params.get(name) != ""
    ]


def latest_snapshot(config: PipelineConfig, stage: str) -> str:
    """The most recently published complete snapshot of a stage."""
    folder = local_path(config.project.data_root) / config.project.corpus / stage
    manifests = [
        Manifest.read(path)
        for path in folder.glob(f"*/{MANIFEST_NAME}")
        if (path.parent / "_SUCCESS").is_file()
    ]
    if not manifests:
        raise MissingInputError(
            f"no complete {stage} snapshot under {folder}; run corpus_ingest first or give a snapshot"
        )
    return max(manifests, key=lambda manifest: (manifest.created_at, manifest.snapshot)).snapshot


def training_run_id(dag_run_id: str) -> str:
    """The training run a DAG run trains (``train.run_id``): its run id, made a valid folder name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", dag_run_id).strip("-_.") or "run"


def resolve_training_run(
    params: Mapping[str, Any], event_extra: Mapping[str, Any], dag_run_id: str | None = None
) -> dict[str, str]:
    """Validate the run's config and write it to the run folder; returns {"snapshot", "config_path"}.

    Precedence, lowest first: the config the corpus was built with (from the asset event), the form's
    config file and overrides, then the form's typed fields. A bad value fails here, naming the key,
    before any training starts. Unless the settings name one, the training run (``train.run_id``) is
    named after the DAG run: each DAG run trains and reports its own run, so a sweep (one DAG run per
    setting) keeps every run, and a retried train task resumes its own.
    """
    config_path = params.get("config_path") or event_extra.get("config_path") or None
    overrides = [
        *event_extra.get("overrides", []),
        *(params.get("overrides") or []),
        *param_overrides(params),
    ]
    try:
        config = load_config(config_path, overrides)
    except ConfigError as exc:
        raise ConfigError(f"the pretrain run's settings are invalid: {exc}") from None
    if dag_run_id and config.train.run_id is None:
        config = config.with_run(training_run_id(dag_run_id))
    snapshot = (
        params.get("snapshot")
        or event_extra.get("snapshot")
        or latest_snapshot(config, training_input().name)
    )
    folder = run_folder(config)
    folder.mkdir(parents=True, exist_ok=True)
    path = Path(folder) / CONFIG_FILE
    path.write_text(config.to_yaml())
    return {"snapshot": snapshot, "config_path": str(path), "config_hash": config.hash}
