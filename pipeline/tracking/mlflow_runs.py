"""MLflow runs: one experiment per corpus and model family, one run per stage execution.

Every stage run is nested under a parent run for its Airflow DAG run (found or created by a tag that
keys dag_id + run_id); outside Airflow, under a parent for the snapshot. Stage runs log the full config
as params, their input manifests and their output manifest as `mlflow.data` datasets whose digest is
the manifest's digest, and the manifest's counts as metrics.

The trainer composes ``TrackedRun`` (``TrackedRun.for_training``): batched per-step metrics,
artifacts, and model registration. ``stage_main`` wraps every stage in ``track_stage``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pipeline.config import PipelineConfig
from pipeline.core.config import redact_url
from pipeline.core.lineage import Lineage, code_version
from pipeline.core.manifest import (
    ENV_TRACKING_ERROR,
    ENV_TRACKING_RUN,
    MANIFEST_NAME,
    Manifest,
    pending_tracking,
)
from pipeline.core.storage import DatasetRef, local_path, path_under
from pipeline.stages import BY_NAME

log = logging.getLogger(__name__)

# Tag names. The airflow.* ones and config_hash / git_commit are what users filter on in the UI.
TAG_KIND = "pretrain.kind"  # "dag_run", "snapshot" (a parent) or "stage"
TAG_PARENT_KEY = "pretrain.parent_key"
TAG_STAGE = "pretrain.stage"
TAG_SNAPSHOT = "pretrain.snapshot"
TAG_CORPUS = "pretrain.corpus"
TAG_TRAIN_RUN = "pretrain.train_run"  # the training run (train.run_id) of a train or report stage run
TAG_OUTPUT_DIGEST = "pretrain.output_digest"
TAG_OUTPUT_PATH = "pretrain.output_path"
PARENT_TAG = "mlflow.parentRunId"
# A stage that launches children (the train launcher -> torchrun ranks) hands them its run through this;
# the stage's manifest records it (or ENV_TRACKING_ERROR: why there is none).
ENV_RUN_ID = ENV_TRACKING_RUN
DATASET_CONTEXT = "mlflow.data.context"

_MAX_METRICS_PER_BATCH = 1000  # MLflow's log_batch limits
_MAX_PARAMS_PER_BATCH = 100
_METRIC_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-/ :]")


class TrackingError(RuntimeError):
    """Recording in MLflow failed; raised only where tracking is required."""


def tracking_uri(config: PipelineConfig) -> str:
    """config tracking.mlflow_tracking_uri, else $MLFLOW_TRACKING_URI, else SQLite under the data root."""
    if config.tracking.mlflow_tracking_uri:
        return config.tracking.mlflow_tracking_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{local_path(config.project.data_root) / 'mlflow.db'}"


def experiment_name(config: PipelineConfig) -> str:
    return config.tracking.experiment or f"pretrain-{config.project.corpus}-{config.model.preset}"


def registered_model_name(config: PipelineConfig) -> str | None:
    """The Model Registry name, or None when tracking.register_model is false."""
    if not config.tracking.register_model:
        return None
    return config.tracking.registered_model or f"pretrain-{config.project.corpus}-{config.model.preset}"


def mlflow_client(config: PipelineConfig):
    # A stage's stdout is its output path; MLflow would also print run URLs there. We log them instead.
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    from mlflow.tracking import MlflowClient

    uri = tracking_uri(config)
    with _store_initialisation(uri):
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        if uri not in _INITIALISED:
            client.search_experiments(max_results=1)  # the tracking tables
            client.search_registered_models(max_results=1)  # the registry's, in the same file
            _INITIALISED.add(uri)
    return client


_INITIALISED: set[str] = set()


@contextlib.contextmanager
def _store_initialisation(uri: str) -> Iterator[None]:
    """Held while a process first opens a SQLite store, which creates (migrates) its tables: two first
    runs at once otherwise both migrate the empty database and one loses its run ("Online migration
    expected to match one row", "duplicate column name"). A file lock beside the database; a server
    store migrates itself, and a store this process opened before needs nothing."""
    if uri in _INITIALISED or not uri.startswith("sqlite:///"):
        yield
        return
    database = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    database.parent.mkdir(parents=True, exist_ok=True)
    with open(database.with_name(f".{database.name}.init-lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_experiment(client, config: PipelineConfig) -> str:
    """Get or create the experiment; a concurrent creator winning the race is fine."""
    from mlflow.exceptions import MlflowException

    name = experiment_name(config)
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    artifact_root = None
    if tracking_uri(config).startswith("sqlite:"):
        # Without a server, keep artifacts beside the SQLite store rather than in ./mlruns of whatever cwd.
        # tracking.experiment is free text: it names a folder here only once it is one plain name.
        folder = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).lstrip(".") or "_"
        artifact_root = path_under(local_path(config.project.data_root), "mlartifacts", folder).as_uri()
    try:
        return client.create_experiment(name, artifact_location=artifact_root)
    except MlflowException:
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def lineage_tags(lineage: Lineage) -> dict[str, str]:
    return {f"airflow.{key}": str(value) for key, value in lineage.to_dict().items() if value is not None}


def stage_tags(config: PipelineConfig, stage: str, snapshot: str, lineage: Lineage) -> dict[str, str]:
    run = config.named_run(stage)
    return {
        TAG_KIND: "stage",
        TAG_STAGE: stage,
        TAG_SNAPSHOT: snapshot,
        TAG_CORPUS: config.project.corpus,
        **({TAG_TRAIN_RUN: run} if run else {}),
        "config_hash": config.hash,
        "git_commit": code_version(),
        **lineage_tags(lineage),
    }


def _filter_value(value: str) -> str:
    if "'" in value:
        raise ValueError(f"tag value {value!r} cannot be used in an MLflow filter")
    return value


def search_runs(
    client,
    experiment_id: str,
    tags: Mapping[str, str],
    order_newest_first: bool = True,
    deleted: bool = False,
):
    """Runs of the experiment carrying all these tags (keys quoted: they hold dots); ``deleted`` adds those."""
    from mlflow.entities import ViewType

    clauses = [f"tags.`{key}` = '{_filter_value(value)}'" for key, value in tags.items()]
    order = ["attributes.start_time DESC"] if order_newest_first else ["attributes.start_time ASC"]
    view = ViewType.ALL if deleted else ViewType.ACTIVE_ONLY
    return client.search_runs(
        [experiment_id], " and ".join(clauses), run_view_type=view, max_results=1000, order_by=order
    )


def parent_spec(config: PipelineConfig, snapshot: str, lineage: Lineage) -> tuple[str, str, dict[str, str]]:
    """(key, run name, tags) of the parent a stage run nests under.

    Under Airflow: the DAG run (dag_id + run_id). By hand: the snapshot, so the stages of one snapshot
    run from the CLI still group together.
    """
    if lineage.dag_id and lineage.run_id:
        raw = f"dag_run\0{lineage.dag_id}\0{lineage.run_id}"
        name = f"{lineage.dag_id}/{lineage.run_id}"
        tags = {TAG_KIND: "dag_run", "airflow.dag_id": lineage.dag_id, "airflow.run_id": lineage.run_id}
    else:
        raw = f"snapshot\0{config.project.corpus}\0{snapshot}"
        name = f"snapshot {snapshot} (outside Airflow)"
        tags = {TAG_KIND: "snapshot", TAG_SNAPSHOT: snapshot, TAG_CORPUS: config.project.corpus}
    # Hash the key: Airflow run ids hold characters an MLflow filter string cannot quote.
    key = hashlib.sha1(raw.encode()).hexdigest()[:24]
    return key, name, tags


def find_or_create_parent(client, experiment_id: str, key: str, name: str, tags: Mapping[str, str]) -> str:
    """The parent run with this key, created when absent.

    Concurrent stages of one DAG run (mapped tasks) may each create one; ``reconcile_parents`` keeps the
    oldest and moves the others' children to it. Each stage reconciles again when it finishes, and the
    last to finish sees every parent that was created, so they converge on one.
    """
    found = search_runs(client, experiment_id, {TAG_PARENT_KEY: key}, order_newest_first=False)
    if found:
        return found[0].info.run_id
    client.create_run(experiment_id, run_name=name, tags={**tags, TAG_PARENT_KEY: key})
    parent = reconcile_parents(client, experiment_id, key)
    assert parent is not None  # the run created above is one of them
    return parent


def reconcile_parents(client, experiment_id: str, key: str) -> str | None:
    """Keep the oldest parent ever created with this key (restoring it if a reconciler with a partial view
    deleted it); move every other parent's children to it and delete the others."""
    from mlflow.exceptions import MlflowException

    found = search_runs(client, experiment_id, {TAG_PARENT_KEY: key}, deleted=True)
    if not found:
        return None
    winner, *losers = sorted(found, key=lambda run: (run.info.start_time, run.info.run_id))
    if winner.info.lifecycle_stage == "deleted":
        with contextlib.suppress(MlflowException):
            client.restore_run(winner.info.run_id)
    for loser in losers:
        for child in search_runs(client, experiment_id, {PARENT_TAG: loser.info.run_id}):
            client.set_tag(child.info.run_id, PARENT_TAG, winner.info.run_id)
        if loser.info.lifecycle_stage != "deleted":
            with contextlib.suppress(MlflowException):  # another stage deleted it first
                client.delete_run(loser.info.run_id)
    return winner.info.run_id


# --- datasets ----------------------------------------------------------------------------------------


def dataset_name(manifest: Manifest) -> str:
    return f"{manifest.corpus}/{manifest.stage}/{manifest.snapshot}"


def manifest_dataset(manifest: Manifest, location: str | Path | None = None):
    """An `mlflow.data` dataset for a stage output: digest = the manifest's digest, source = its folder."""
    from mlflow.data.meta_dataset import MetaDataset

    # Defined when mlflow.data registers its artifact sources, so no type checker can see it.
    from mlflow.data.sources import LocalArtifactDatasetSource  # type: ignore[attr-defined]

    profile = json.dumps(
        {
            "stage": manifest.stage,
            "snapshot": manifest.snapshot,
            "rows": manifest.rows,
            "bytes": manifest.bytes,
            "config_hash": manifest.config_hash,
            "code_version": manifest.code_version,
        },
        sort_keys=True,
    )

    class ManifestDataset(MetaDataset):
        @property
        def profile(self) -> str:
            return profile

        def to_dict(self) -> dict[str, str]:
            return {**super().to_dict(), "profile": profile}

    source = LocalArtifactDatasetSource(str(location or manifest.path))
    return ManifestDataset(source, name=dataset_name(manifest), digest=manifest.digest)


def manifest_metrics(manifest: Manifest) -> dict[str, float]:
    """Numeric rows, counters and ``extra["metrics"]`` (flattened), bytes and duration of a manifest, as
    metric key -> value."""
    metrics: dict[str, float] = {"bytes": float(manifest.bytes), "duration_s": float(manifest.duration_s)}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            metrics[_METRIC_KEY_UNSAFE.sub("_", prefix)] = float(value)

    walk("rows", manifest.rows)
    walk("counters", manifest.counters)
    walk("metrics", manifest.extra.get("metrics", {}))
    return metrics


# --- a run ------------------------------------------------------------------------------------------


class TrackedRun:
    """One MLflow run: params, batched metrics, datasets, artifacts, model registration.

    Metrics are buffered and sent with ``log_batch`` every ``flush_every`` values or ``flush_interval_s``
    seconds. When ``required`` is false a failed flush keeps the values buffered (and warns) so the next
    flush sends them; nothing is dropped silently.
    """

    def __init__(
        self,
        client,
        run_id: str,
        experiment_id: str,
        *,
        required: bool = True,
        flush_every: int = 200,
        flush_interval_s: float = 10.0,
    ) -> None:
        self.client = client
        self.run_id = run_id
        self.experiment_id = experiment_id
        self.required = required
        self.flush_every = flush_every
        self.flush_interval_s = flush_interval_s
        self._pending: list = []
        self._last_flush = time.monotonic()
        self._warned = False
        self.parent_id: str | None = None
        self.parent_key: str | None = None

    # construction

    @classmethod
    def start_stage_run(
        cls,
        config: PipelineConfig,
        stage: str,
        snapshot: str,
        inputs: Iterable[DatasetRef] = (),
        lineage: Lineage | None = None,
        *,
        nested: bool = True,
        log_config: bool = True,
    ) -> TrackedRun:
        """Create a run for one execution of ``stage``, nested under its DAG run (or snapshot) parent."""
        from mlflow.exceptions import MlflowException

        lineage = lineage or Lineage.from_env()
        client = mlflow_client(config)
        experiment_id = ensure_experiment(client, config)
        tags = stage_tags(config, stage, snapshot, lineage)
        parent_id = parent_key = None
        if nested:
            parent_key, parent_name, parent_tags = parent_spec(config, snapshot, lineage)
            parent_id = find_or_create_parent(client, experiment_id, parent_key, parent_name, parent_tags)
            tags[PARENT_TAG] = parent_id
            with contextlib.suppress(MlflowException):  # a concurrent stage may be reconciling it away
                client.update_run(parent_id, status="RUNNING")
        try_suffix = f" (try {lineage.try_number})" if lineage.try_number and lineage.try_number > 1 else ""
        where = f"{snapshot}/{tags[TAG_TRAIN_RUN]}" if TAG_TRAIN_RUN in tags else snapshot
        run = client.create_run(experiment_id, run_name=f"{stage} {where}{try_suffix}", tags=tags)
        tracked = cls(client, run.info.run_id, experiment_id, required=config.tracking.required)
        tracked.parent_id, tracked.parent_key = parent_id, parent_key
        if log_config:
            tracked.log_config(config)
        manifests = []
        for ref in inputs:
            if ref.is_complete():
                manifests.append((ref.manifest(), ref.path))
        if manifests:
            tracked.log_datasets(manifests, context="training" if stage == "train" else "input")
        return tracked

    @classmethod
    def attach(cls, config: PipelineConfig, run_id: str) -> TrackedRun:
        """An existing run (its status is left as it is)."""
        client = mlflow_client(config)
        run = client.get_run(run_id)
        tracked = cls(client, run_id, run.info.experiment_id, required=config.tracking.required)
        tracked.parent_id = run.data.tags.get(PARENT_TAG)
        return tracked

    @classmethod
    def for_training(
        cls, config: PipelineConfig, snapshot: str, inputs: Iterable[DatasetRef] = ()
    ) -> TrackedRun:
        """The training run for rank 0: the launcher's run when it handed one down ($PRETRAIN_MLFLOW_RUN_ID),
        else a new nested ``train`` stage run (e.g. torchrun started by an Airflow operator)."""
        run_id = os.environ.get(ENV_RUN_ID)
        if run_id:
            return cls.attach(config, run_id)
        return cls.start_stage_run(config, "train", snapshot, inputs)

    # params and tags

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Non-string values are JSON-encoded; params already logged with the same value are fine."""
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        entries = []
        for key, value in params.items():
            text = value if isinstance(value, str) else json.dumps(value)
            if existing.get(key) == text:
                continue
            entries.append(Param(key, text))
        for start in range(0, len(entries), _MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=entries[start : start + _MAX_PARAMS_PER_BATCH])

    def log_config(self, config: PipelineConfig) -> None:
        """The full config flattened as params, and the resolved YAML as ``config.yaml``."""
        self.log_params(config.flat())
        self.log_text(config.to_yaml(), "config.yaml")

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        entries = [RunTag(key, str(value)) for key, value in tags.items()]
        for start in range(0, len(entries), _MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, tags=entries[start : start + _MAX_PARAMS_PER_BATCH])

    # metrics

    def log_metrics(self, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None) -> None:
        from mlflow.entities import Metric

        now = timestamp_ms if timestamp_ms is not None else int(time.time() * 1000)
        for key, value in metrics.items():
            if value is None:
                continue
            self._pending.append(Metric(_METRIC_KEY_UNSAFE.sub("_", key), float(value), now, int(step)))
        if (
            len(self._pending) >= self.flush_every
            or time.monotonic() - self._last_flush >= self.flush_interval_s
        ):
            self.flush()

    def flush(self) -> bool:
        """Send buffered metrics; returns False (and keeps them) when MLflow is unreachable and not required."""
        try:
            while self._pending:
                batch = self._pending[:_MAX_METRICS_PER_BATCH]
                self.client.log_batch(self.run_id, metrics=batch)
                del self._pending[: len(batch)]
        except Exception as exc:
            if self.required:
                raise
            if not self._warned:
                log.error("MLflow metrics for run %s are buffered, not sent: %s", self.run_id, exc)
                self._warned = True
            return False
        finally:
            self._last_flush = time.monotonic()
        if self._warned:
            log.warning("MLflow reachable again; buffered metrics for run %s sent", self.run_id)
            self._warned = False
        return True

    # datasets and artifacts

    def log_datasets(self, manifests: Iterable[tuple[Manifest, str | Path | None]], context: str) -> None:
        from mlflow.entities import DatasetInput, InputTag

        inputs = [
            DatasetInput(
                manifest_dataset(manifest, location)._to_mlflow_entity(),
                tags=[InputTag(DATASET_CONTEXT, context), InputTag(TAG_STAGE, manifest.stage)],
            )
            for manifest, location in manifests
        ]
        if inputs:
            self.client.log_inputs(self.run_id, datasets=inputs)

    def log_output(self, manifest: Manifest, artifacts: Iterable[str] = ()) -> None:
        """A stage's published output: dataset (context ``output``), counts as metrics, manifest.json, and
        the output's ``artifacts`` (paths inside it, under ``<stage>/``)."""
        self.log_datasets([(manifest, manifest.path)], context="output")
        self.set_tags({TAG_OUTPUT_DIGEST: manifest.digest, TAG_OUTPUT_PATH: manifest.path})
        self.log_metrics(manifest_metrics(manifest), step=0)
        self.flush()
        self.log_artifact(Path(manifest.path) / MANIFEST_NAME, f"manifests/{manifest.stage}")
        for name in artifacts:
            path = Path(manifest.path) / name
            if path.exists():
                folder = (
                    str(Path(manifest.stage, name).parent) if path.is_file() else f"{manifest.stage}/{name}"
                )
                self.log_artifact(path, folder)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def register_model(
        self,
        name: str,
        artifact_path: str = "model",
        tags: Mapping[str, Any] | None = None,
        description: str | None = None,
        model_id: str | None = None,
    ):
        """Register ``runs:/<run>/<artifact_path>`` (or, given ``model_id``, the LoggedModel
        ``models:/<model_id>``) as a new version of ``name``; reuses this run's version of the same source."""
        import mlflow
        from mlflow.exceptions import MlflowException

        try:
            self.client.create_registered_model(name, description="pretrain-pipeline GPT checkpoints")
        except MlflowException as exc:
            if "RESOURCE_ALREADY_EXISTS" not in str(exc.error_code) and "already exists" not in str(exc):
                raise
        source = f"models:/{model_id}" if model_id else f"runs:/{self.run_id}/{artifact_path}"
        for version in self.client.search_model_versions(f"name = '{_filter_value(name)}'"):
            if version.run_id == self.run_id and version.source == source:
                return version
        # A database registry looks the LoggedModel up through MLflow's global tracking URI, not this client's.
        previous = mlflow.get_tracking_uri() if mlflow.tracking.is_tracking_uri_set() else None
        mlflow.set_tracking_uri(self.client.tracking_uri)
        try:
            return self.client.create_model_version(
                name,
                source,
                run_id=self.run_id,
                tags={key: str(value) for key, value in (tags or {}).items()},
                description=description,
                await_creation_for=0,
                model_id=model_id,
            )
        finally:
            # None unsets it again (MLflow's own reset; its annotation leaves None out).
            mlflow.set_tracking_uri(previous)  # type: ignore[arg-type]

    def log_logged_model(
        self,
        name: str,
        metrics: Mapping[str, tuple[float, int, int]],
        *,
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, Any] | None = None,
        model_type: str,
    ) -> str:
        """An MLflow 3 LoggedModel of this run (one checkpoint), READY, with ``metrics``; returns its id."""
        model_id = self.create_logged_model(name, params=params, tags=tags, model_type=model_type)
        self.finish_logged_model(model_id, metrics)
        return model_id

    def create_logged_model(
        self,
        name: str,
        *,
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, Any] | None = None,
        model_type: str,
    ) -> str:
        """A new LoggedModel of this run, PENDING until ``finish_logged_model``; returns its id."""
        model = self.client.create_logged_model(
            self.experiment_id,
            name=name,
            source_run_id=self.run_id,
            tags={key: str(value) for key, value in (tags or {}).items()},
            params={
                key: value if isinstance(value, str) else json.dumps(value)
                for key, value in (params or {}).items()
            },
            model_type=model_type,
        )
        return str(model.model_id)

    def finish_logged_model(self, model_id: str, metrics: Mapping[str, tuple[float, int, int]]) -> None:
        """``metrics`` (name -> (value, step, timestamp in ms)) logged to the run with ``model_id``, then the
        model READY. A figure the run already has (the same key, value, step and timestamp) is not stored twice
        in the run's history: the tracking store keeps one row per (key, timestamp, step, value)."""
        from mlflow.entities import Metric

        entries = [
            Metric(_METRIC_KEY_UNSAFE.sub("_", key), float(value), at, int(step), model_id=model_id)
            for key, (value, step, at) in metrics.items()
        ]
        for start in range(0, len(entries), _MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=entries[start : start + _MAX_METRICS_PER_BATCH])
        self.client.finalize_logged_model(model_id, "READY")

    # end

    def finish(self, status: str = "FINISHED") -> None:
        """Flush metrics and end the run; the parent shows the status of its latest finished stage."""
        from mlflow.exceptions import MlflowException

        self.flush()
        self.client.set_terminated(self.run_id, status)
        if self.parent_key:
            self.parent_id = (
                reconcile_parents(self.client, self.experiment_id, self.parent_key) or self.parent_id
            )
        if self.parent_id:
            with contextlib.suppress(MlflowException):
                self.client.set_terminated(self.parent_id, status)


# --- the stage_main hook ----------------------------------------------------------------------------


class StageTracking:
    """Records one stage execution; used by ``stage_main`` for every stage.

    Policy: the stage's data output is the product, so by default a tracking failure does not fail the
    stage. It is logged at ERROR level (in the ECS logs, hence in Elasticsearch) and printed to stderr,
    naming the stage and output. With ``tracking.required=true`` it raises ``TrackingError`` instead.
    A failing stage is always re-raised unchanged, with its run marked FAILED.

    ``background``: the run starts in a thread beside the stage's work (importing MLflow and opening its
    store take seconds, as long as a small stage's whole work); what the manifest records, ``record`` and the
    end wait for it. Not when tracking is required (a run that cannot start then fails the stage before any
    work), nor for a stage whose child processes log into the run.
    """

    def __init__(
        self,
        config: PipelineConfig,
        stage: str,
        snapshot: str,
        inputs: list[DatasetRef],
        *,
        background: bool = False,
    ) -> None:
        self.config = config
        self.stage = stage
        self.snapshot = snapshot
        self.inputs = inputs
        # Start the run in a thread beside the stage's work; settled (joined) before anything reads it.
        self.background = background and not config.tracking.required
        self.run: TrackedRun | None = None
        self.error: Exception | None = None
        self._previous_env: str | None = None
        self._previous_error: str | None = None
        self._starting: threading.Thread | None = None
        self._started: TrackedRun | BaseException | None = None
        self._pending: contextlib.ExitStack | None = None

    @property
    def enabled(self) -> bool:
        return self.config.tracking.stage_runs

    def _failed(self, what: str, exc: Exception) -> None:
        if self.error is None:
            self._previous_error = os.environ.get(ENV_TRACKING_ERROR)
        self.error = exc
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        message = (
            f"MLflow tracking of stage {self.stage!r} (snapshot {self.snapshot!r}) failed while {what}: "
            f"{reason}. Tracking URI: {redact_url(tracking_uri(self.config))}. "
        )
        if self.config.tracking.required:
            raise TrackingError(message + "Failing the stage because tracking.required=true.") from exc
        # Part of the stage's result: the manifest it publishes records it (tracking.error), and so do
        # the torchrun ranks' manifests, which inherit the environment. Until the stage ends.
        os.environ[ENV_TRACKING_ERROR] = f"failed while {what}: {reason}"[:1000]
        log.error(message + "The stage goes on; set tracking.required=true to fail it instead.", exc_info=exc)
        if not self.config.logging.console:
            print(f"warning: {message}", file=sys.stderr)

    def __enter__(self) -> StageTracking:
        if not self.enabled:
            return self
        if self.background:
            # Set here, not in the thread: the environment is changed only while no other thread starts a process.
            os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
            self._starting = threading.Thread(target=self._start, name="mlflow-start", daemon=True)
            self._starting.start()
            self._pending = contextlib.ExitStack()
            self._pending.enter_context(pending_tracking(self.settle))
            return self
        self._start()
        self.settle()
        return self

    def _start(self) -> None:
        try:
            self._started = TrackedRun.start_stage_run(self.config, self.stage, self.snapshot, self.inputs)
        except BaseException as exc:  # settled (reported, or raised when required) in the stage's thread
            self._started = exc

    def settle(self) -> None:
        """Wait for the run's start, then record it (or why it failed) where the stage's manifest and its child
        processes read it. Idempotent; called from the stage's thread."""
        if self._starting is not None:
            self._starting.join()
            self._starting = None
        if self._pending is not None:
            self._pending.close()
            self._pending = None
        started, self._started = self._started, None
        if started is None:
            return
        if isinstance(started, BaseException):
            if not isinstance(started, Exception):
                raise started
            self._failed("starting the run", started)
            return
        self.run = started
        log.info(
            "MLflow run %s for stage %s (%s)",
            self.run.run_id,
            self.stage,
            redact_url(tracking_uri(self.config)),
        )
        # Child processes (torchrun ranks) log into this same run.
        self._previous_env = os.environ.get(ENV_RUN_ID)
        os.environ[ENV_RUN_ID] = self.run.run_id

    def record(self, manifest: Manifest) -> None:
        """Log the stage's published output."""
        self.settle()
        if self.run is None:
            return
        try:
            self.run.log_output(manifest, BY_NAME[self.stage].artifacts if self.stage in BY_NAME else ())
        except Exception as exc:
            self._failed("logging the output manifest", exc)

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.settle()
            self._end(exc_type)
        finally:
            if self.error is not None:
                _restore_env(ENV_TRACKING_ERROR, self._previous_error)

    def _end(self, exc_type) -> None:
        if self.run is None:
            return
        if self._previous_env is None:
            os.environ.pop(ENV_RUN_ID, None)
        else:
            os.environ[ENV_RUN_ID] = self._previous_env
        status = "FINISHED" if exc_type is None and self.error is None else "FAILED"
        if exc_type is KeyboardInterrupt:
            status = "KILLED"
        try:
            self.run.finish(status)
        except Exception as finish_exc:
            if exc_type is None:
                self._failed("ending the run", finish_exc)
            else:
                log.error("could not mark MLflow run %s %s: %s", self.run.run_id, status, finish_exc)


def _restore_env(name: str, previous: str | None) -> None:
    if previous is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = previous


def track_stage(
    config: PipelineConfig, stage: str, snapshot: str, inputs: list[DatasetRef], *, background: bool = False
) -> StageTracking:
    """``background``: start the run beside the stage's work (see ``StageTracking``)."""
    return StageTracking(config, stage, snapshot, inputs, background=background)
