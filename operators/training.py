"""The training DAGs (`pretrain`, `pretrain_every_snapshot`), built by one factory; their form, declared once;
and how a run's form and triggering asset event become one frozen config file.

``TRAINING_FORM`` is the form: each field's name, title and section, and the config key it sets. The Params
the DAGs show are built from it (``form_params``): a field's type, bounds, enum and default description come
from the config key's own declaration, so the form offers exactly what the config accepts, and a run's typed
values set those keys as they are (``form_values``). ``training_run`` resolves the config once and freezes it
into one file; the train task and its ranks, and the stages after it, read that file as it is, so they agree
on every value, and the file is the record of what this run trained with. XCom carries only its path and the
snapshot name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import pendulum
from airflow.sdk import DAG, Param, dag, get_current_context, task
from annotated_types import Ge, Gt

from operators.assets import TOKEN_SHARDS, latest_token_shards_extra
from operators.defaults import DEFAULT_ARGS, check_run_conf
from operators.tasks import training_tasks
from pipeline.config import PipelineConfig, config_key, freeze_config, key_choices, load_config
from pipeline.core.config import ConfigError
from pipeline.core.logs import run_folder
from pipeline.core.manifest import MANIFEST_NAME, Manifest
from pipeline.core.storage import MissingInputError, local_path
from pipeline.stages import training_input
from pipeline.train.config import TrainConfig

_JSON_TYPES: dict[Any, str] = {int: "integer", float: "number", str: "string", bool: "boolean"}


def key_schema(key: str) -> dict[str, Any]:
    """A nullable JSON-schema of one config key, from its declaration: type, enum, lower bound."""
    declared = config_key(key)
    choices = key_choices(key)
    if choices is not None:
        kinds = sorted({_JSON_TYPES[type(choice)] for choice in choices})
        return {"type": ["null", *kinds], "enum": [None, *choices]}
    kinds = [arg for arg in (declared.annotation, *getattr(declared.annotation, "__args__", ())) if arg]
    (kind,) = {_JSON_TYPES[arg] for arg in kinds if arg in _JSON_TYPES}
    schema: dict[str, Any] = {"type": ["null", kind]}
    for bound in declared.metadata:
        if isinstance(bound, Gt) and kind == "integer":
            schema["minimum"] = int(bound.gt) + 1  # type: ignore[call-overload]  # an int bound on an int key
        elif isinstance(bound, Ge):
            schema["minimum"] = bound.ge
    return schema


# What the mixture field shows before anyone edits it: a two-corpus example (shown, not submitted: the field
# starts empty, so an asset-triggered run, which takes the defaults, trains on its event's snapshot).
MIXTURE_EXAMPLE: list[dict[str, Any]] = [
    {"corpus": "web", "snapshots": "all", "weight": 3},
    {"corpus": "books", "snapshots": "last:2", "weight": 1},
]


def mixture_param() -> dict[str, Any]:
    """The mixture field's JSON schema: a list of the sources ``data.mixture`` declares (``MixtureSource``), from
    their pydantic declaration, so the form accepts what ``data.mixture`` accepts; the snapshot grammar and the
    sources' existence are checked when the run's config is resolved (``resolve_training_run``)."""
    declared = config_key("data.mixture").annotation  # list[MixtureSource] | None
    (sources,) = [arg for arg in get_args(declared) if arg is not type(None)]
    (source,) = get_args(sources)
    return {
        "default": None,
        "type": ["null", "array"],
        "minItems": 1,
        "items": source.model_json_schema(),
        "examples": [MIXTURE_EXAMPLE],
    }


@dataclass(frozen=True)
class FormField:
    """One field of the `pretrain` form. With a ``key`` it sets that config key to the field's typed value; its
    Param is built from the key's declaration (left empty, the config's value stands) unless ``param`` gives
    the Param's own schema. Without a key it is one of the run's inputs (``RUN_FIELDS``), not a setting."""

    name: str
    title: str
    section: str
    key: str | None = None
    description: str = ""  # default: the config key's own description
    param: dict[str, Any] = field(default_factory=dict)


# The fields that are no config key: which snapshot, which config file, which --set overrides.
RUN_FIELDS = ("snapshot", "config_path", "overrides")

TRAINING_FORM: tuple[FormField, ...] = (
    FormField("preset", "Model preset", "Model", "model.preset", "Named model size."),
    FormField("precision", "Precision", "Model", "train.precision"),
    FormField("steps", "Training steps", "Training", "train.steps", "Optimizer steps."),
    FormField(
        "launcher",
        "Launcher",
        "Training",
        "train.launcher",
        description="local: torchrun on the Airflow worker. kubernetes: a Kubeflow Trainer v2 TrainJob (or a v1 "
        "PyTorchJob, by the pretrain_kubernetes Variable's api).",
        # Never empty: an asset-triggered run takes the form's defaults, and trains here.
        param={"default": "local", "type": "string", "enum": list(key_choices("train.launcher") or ())},
    ),
    FormField("nodes", "Nodes", "Training", "train.nnodes", "Machines (Kubernetes pods)."),
    FormField(
        "processes_per_node",
        "Processes per node",
        "Training",
        "train.nproc_per_node",
        "torchrun processes per node, usually one per GPU.",
    ),
    FormField(
        "data_parallel",
        "Data parallelism",
        "Parallelism",
        "train.data_parallel",
        "ddp: the whole model on every rank; zero1: optimizer state sharded; fsdp: parameters, gradients and "
        "optimizer state sharded (FSDP2), for models whose training state does not fit one device.",
    ),
    FormField(
        "dp_replicate",
        "HSDP replicas",
        "Parallelism",
        "train.dp_replicate",
        "fsdp only: 1 shards over every rank; R > 1 (HSDP) shards within R groups of ranks and replicates "
        "across them, usually one group per node (R = nodes) when the model fits a node but links between "
        "nodes are slow. Must divide the ranks.",
    ),
    FormField(
        "checkpoint_format",
        "Checkpoint format",
        "Parallelism",
        "train.checkpoint_format",
        "torch: one file per step (per pipeline rank), gathered to one rank; dcp: every rank writes its own "
        "shards (torch.distributed.checkpoint), and the run resumes at another number of ranks or pipeline "
        "stages.",
    ),
    FormField(
        "checkpoint_async",
        "Asynchronous checkpoints",
        "Parallelism",
        "train.checkpoint_async",
        "dcp: write checkpoints in the background while training goes on.",
    ),
    FormField(
        "pp_degree",
        "Pipeline-parallel degree",
        "Parallelism",
        "train.pp_degree",
        "Ranks the model is cut into by layers (pp; the other ranks are data parallel).",
    ),
    FormField(
        "pp_microbatches",
        "Pipeline micro-batches",
        "Parallelism",
        "train.pp_microbatches",
        "Micro-batches per step through the pipeline.",
    ),
    FormField("pp_schedule", "Pipeline schedule", "Parallelism", "train.pp_schedule"),
    FormField(
        "pp_virtual_stages",
        "Virtual stages per rank",
        "Parallelism",
        "train.pp_virtual_stages",
        "Virtual pipeline stages per rank (interleaved_1f1b needs 2 or more).",
    ),
    FormField(
        "mlflow_experiment",
        "MLflow experiment",
        "Tracking",
        "tracking.experiment",
        "Experiment to record the run in (default pretrain-<corpus>-<preset>).",
    ),
    FormField(
        "mixture",
        "Mixture",
        "Data and config",
        "data.mixture",
        description="Train on a weighted mixture of corpora and snapshots (JSON: a list of {corpus, snapshots, "
        "weight, name}; snapshots: 'all', names, 'last:N', 'FROM..TO' or a glob), for example "
        + json.dumps([{"corpus": "web", "snapshots": "all", "weight": 3}, {"corpus": "books", "weight": 1}])
        + ". Empty trains on the one snapshot below. Snapshot then only names the run's folder.",
        param=mixture_param(),
    ),
    FormField(
        "snapshot",
        "Snapshot",
        "Data and config",
        description="Token shards to train on; empty means the triggering event's, else the newest.",
        param={"default": None, "type": ["null", "string"]},
    ),
    FormField(
        "config_path",
        "Config file",
        "Data and config",
        description="YAML config file; empty means the corpus's config, else built-in defaults.",
        param={"default": None, "type": ["null", "string"]},
    ),
    FormField(
        "overrides",
        "Config overrides",
        "Data and config",
        description="One key=value per line, e.g. train.lr=0.001.",
        param={"default": [], "type": ["null", "array"], "items": {"type": "string"}},
    ),
)
# `pretrain_every_snapshot`'s field besides the form: no config key, it names the mixture's corpus.
CORPUS_PARAM: dict[str, Any] = {
    "default": None,
    "type": ["null", "string"],
    "title": "Corpus",
    "description": "Corpus whose every complete snapshot to train on; empty means the triggering event's.",
    "section": "Data and config",
}
CONFIG_FILE = "pretrain-config.yaml"


def form_params() -> dict[str, dict[str, Any]]:
    """Each form field's Param arguments (``Param(**arguments)``), in form order."""
    params = {}
    for entry in TRAINING_FORM:
        if entry.param or entry.key is None:
            params[entry.name] = {
                **entry.param,
                "title": entry.title,
                "description": entry.description,
                "section": entry.section,
            }
            continue
        declared = (config_key(entry.key).description or "").rstrip(".")
        description = entry.description or f"{declared[:1].upper()}{declared[1:]}."
        params[entry.name] = {
            "default": None,
            **key_schema(entry.key),
            "title": entry.title,
            "description": f"{description} Empty keeps the config's {entry.key}.",
            "section": entry.section,
        }
    return params


def form_values(params: Mapping[str, Any]) -> dict[str, Any]:
    """The config keys a run's filled-in form fields set, to their typed values; a field left empty keeps the
    config's value."""
    names = {entry.name for entry in TRAINING_FORM}
    for old, new in TrainConfig.renamed_keys.items():
        # The fields are named after their keys; Airflow would pass a run's unknown conf key by unread.
        if old in params and new in names:
            raise ConfigError(f"form field {old!r} is now {new!r} (train.{new}); set that field instead")
    return {
        entry.key: params[entry.name]
        for entry in TRAINING_FORM
        if entry.key is not None and params.get(entry.name) not in (None, "", [])
    }


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
            f"no complete {stage} snapshot under {folder}; run corpus_crawl first or give a snapshot"
        )
    return max(manifests, key=lambda manifest: (manifest.created_at, manifest.snapshot)).snapshot


def training_run_id(dag_run_id: str) -> str:
    """The training run a DAG run trains (``train.run_id``): its run id, made a valid folder name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", dag_run_id).strip("-_.") or "run"


def resolve_training_run(
    params: Mapping[str, Any],
    event_extra: Mapping[str, Any],
    dag_run_id: str | None = None,
    every_snapshot: bool = False,
) -> dict[str, str]:
    """Resolve and validate the run's config once and freeze it into one file in the run folder, which every
    later process of the run reads as it is; returns {"snapshot", "config_path"}.

    Precedence, lowest first: the config the corpus was built with (from the asset event), the form's
    config file and overrides, then the form's typed fields, set as they are (``form_values``). A bad value
    fails here, naming the key, before any training starts; so does a mixture (the form's, or with
    ``every_snapshot`` every complete snapshot of the form's corpus, else the event's) that cannot be read.
    Unless the settings name one, the training run (``train.run_id``) is named after the DAG run: each DAG run
    trains and reports its own run, so a sweep (one DAG run per setting) keeps every run, and a retried train
    task resumes its own.
    """
    config_path = params.get("config_path") or event_extra.get("config_path") or None
    overrides = [*event_extra.get("overrides", []), *(params.get("overrides") or [])]
    values = form_values(params)
    try:
        config = load_config(config_path, overrides, values=values)
        if every_snapshot and not config.data.mixture:
            # The scheduled variant: everything the corpus has, however many snapshots that is now.
            everything = [{"corpus": params.get("corpus") or config.project.corpus, "snapshots": "all"}]
            config = config.with_values({"data.mixture": everything}, source="the form's corpus")
    except ConfigError as exc:
        raise ConfigError(f"the pretrain run's settings are invalid: {exc}") from None
    if dag_run_id and config.train.run_id is None:
        config = config.with_run(training_run_id(dag_run_id))
    snapshot = params.get("snapshot") or event_extra.get("snapshot")
    if config.data.mixture:
        from pipeline.entrypoint import default_snapshot
        from pipeline.train.launcher.launch import freeze_inputs

        # With a mixture the snapshot only names the run's folder: the event's, or today's date. The mixture
        # is resolved here, once (a MixtureError names the source), and frozen with the config: the train
        # task and its ranks read that resolution.
        snapshot = snapshot or default_snapshot()
        config = freeze_inputs(config, snapshot, training_input().name)
    else:
        snapshot = snapshot or latest_snapshot(config, training_input().name)
    folder = run_folder(config)
    folder.mkdir(parents=True, exist_ok=True)
    path = freeze_config(config, Path(folder) / CONFIG_FILE)
    return {"snapshot": snapshot, "config_path": str(path)}


def training_dag(
    dag_id: str, *, doc_md: str | None, tags: list[str], every_snapshot: bool = False, **dag_args: Any
) -> DAG:
    """A training DAG: scheduled on the `token_shards` Asset and triggered by hand with the form; its first task
    resolves and freezes the run's config (``resolve_training_run``), then the training stages read that file.

    ``every_snapshot``: the scheduled variant, `pretrain_every_snapshot`: the form gains a corpus field, and a
    run without a mixture trains on every complete snapshot of that corpus (else the event's). ``dag_args`` go to
    the DAG (``is_paused_upon_creation``).
    """
    form: dict[str, dict[str, Any]] = {"corpus": CORPUS_PARAM} if every_snapshot else {}
    form.update(form_params())

    @dag(
        dag_id=dag_id,
        schedule=[TOKEN_SHARDS],
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        default_args=DEFAULT_ARGS,
        render_template_as_native_obj=True,
        doc_md=doc_md,
        tags=tags,
        params={name: Param(**arguments) for name, arguments in form.items()},
        **dag_args,
    )
    def training():
        @task
        def training_run(params=None, triggering_asset_events=None) -> dict[str, str]:
            """Resolve, validate and freeze this run's config into one file; XCom: its path, the snapshot."""
            context = get_current_context()
            check_run_conf(context)
            return resolve_training_run(
                params,
                latest_token_shards_extra(triggering_asset_events),
                dag_run_id=context["run_id"],
                every_snapshot=every_snapshot,
            )

        training_tasks(training_run())

    return training()
