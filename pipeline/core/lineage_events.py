"""OpenLineage events for a stage run, built from the manifests the stage reads and writes.

One dataset per stage output, named as OpenLineage names files: namespace ``file`` and the absolute folder
``<data_root>/<corpus>/<stage>`` for a local data root, ``scheme://authority`` and the path for a URI. The
snapshot (and training run) is not in the name, so the name stays the same across runs and snapshots, as a
table's does across partitions; which snapshot a run read or wrote is in the ``version`` facet (the manifest's
content digest) and the ``pretrain_snapshot`` facet. Schema (from the Parquet footers of the files the manifest
lists) and row counts come with every dataset whose manifest is published.

The command line emits through ``StageLineage`` (``pipeline.entrypoint.stage_main``) only when the client is
configured (``OPENLINEAGE_URL``, or ``OPENLINEAGE_CONFIG`` naming its file), and not under an Airflow task,
where the OpenLineage provider emits the task's events from the operators' ``get_openlineage_facets_on_*``
(which build their datasets here too). The client is imported only then: nothing here opens a connection
otherwise.
"""

from __future__ import annotations

import contextlib
import logging
import os
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pipeline.core.lineage import Lineage
from pipeline.core.manifest import MANIFEST_NAME, Manifest

if TYPE_CHECKING:
    from openlineage.client import OpenLineageClient
    from openlineage.client.event_v2 import InputDataset, OutputDataset, RunEvent
    from openlineage.client.generated.base import DatasetFacet, RunFacet

    from pipeline.core.config import CoreConfig
    from pipeline.core.storage import DatasetRef

log = logging.getLogger(__name__)

ENV_URL = "OPENLINEAGE_URL"
ENV_CONFIG = "OPENLINEAGE_CONFIG"
ENV_NAMESPACE = "OPENLINEAGE_NAMESPACE"  # the jobs' namespace, as the Airflow provider reads it
DEFAULT_JOB_NAMESPACE = "pretrain"
PRODUCER = "https://pypi.org/project/pretrain-pipeline/"
# Custom facets: prefixed, with a schema URL under the producer, as the spec asks.
FACET_SCHEMA = PRODUCER + "#openlineage-facets"
PRIMARY_ROWS = "documents"  # the rows a stage's output is about, where it has several datasets


def configured(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the user configured an OpenLineage client for the command line."""
    env = os.environ if environ is None else environ
    return bool(env.get(ENV_URL) or env.get(ENV_CONFIG))


def job_namespace(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return env.get(ENV_NAMESPACE) or DEFAULT_JOB_NAMESPACE


def dataset_identity(data_root: str, corpus: str, stage: str) -> tuple[str, str]:
    """(namespace, name) of a stage's output: the same for every snapshot and run of it."""
    parts = urlsplit(data_root)
    if parts.scheme and parts.scheme != "file" and len(parts.scheme) > 1:  # not a Windows drive letter
        path = "/".join(p for p in (parts.path.strip("/"), corpus, stage) if p)
        return f"{parts.scheme}://{parts.netloc}", path
    folder = Path(parts.path if parts.scheme == "file" else data_root).absolute()
    return "file", (folder / corpus / stage).as_posix()


def _facet_classes() -> dict[str, type]:
    """The custom facets, defined on first use so the client is imported only when lineage is emitted."""
    global _FACETS
    if _FACETS is None:
        import attr
        from openlineage.client.generated.base import DatasetFacet, RunFacet

        @attr.define
        class PretrainRunFacet(RunFacet):
            """What made this run's output: the stage, the code and the resolved config."""

            stage: str
            corpus: str
            snapshot: str
            code_version: str
            config_hash: str
            run: str | None = None
            airflow: dict[str, Any] = attr.field(factory=dict)

            @staticmethod
            def _get_schema() -> str:
                return FACET_SCHEMA + "/PretrainRunFacet"

        @attr.define
        class PretrainSnapshotFacet(DatasetFacet):
            """Which snapshot of the dataset, with every row count and drop counter of its manifest."""

            snapshot: str
            path: str
            run: str | None = None
            digest: str | None = None
            config_hash: str | None = None
            code_version: str | None = None
            rows: dict[str, int] = attr.field(factory=dict)
            counters: dict[str, Any] = attr.field(factory=dict)

            @staticmethod
            def _get_schema() -> str:
                return FACET_SCHEMA + "/PretrainSnapshotFacet"

        _FACETS = {"run": PretrainRunFacet, "snapshot": PretrainSnapshotFacet}
    return _FACETS


_FACETS: dict[str, type] | None = None


def primary_rows(manifest: Manifest) -> tuple[str | None, int | None]:
    """The dataset of an output that its row count is about: ``documents`` when it has one, else the first."""
    if not manifest.rows:
        return None, None
    name = PRIMARY_ROWS if PRIMARY_ROWS in manifest.rows else next(iter(manifest.rows))
    return name, int(manifest.rows[name])


def parquet_schema(folder: Path, manifest: Manifest) -> list[tuple[str, str]] | None:
    """(column, type) of the output's primary Parquet files, read from one footer; None without Parquet."""
    parquet = sorted(name for name in manifest.files if name.endswith(".parquet"))
    if not parquet:
        return None
    primary, _ = primary_rows(manifest)
    preferred = [name for name in parquet if primary and name.split("/", 1)[0] == primary]
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(folder / (preferred or parquet)[0])
    except (OSError, ValueError):
        return None  # lineage describes what it can read; it never fails the stage
    return [(field.name, str(field.type)) for field in schema]


def dataset_facets(manifest: Manifest) -> dict[str, DatasetFacet]:
    """The facets every dataset of a published output carries: version, schema, the snapshot's counts."""
    from openlineage.client.generated.dataset_version_dataset import DatasetVersionDatasetFacet
    from openlineage.client.generated.schema_dataset import SchemaDatasetFacet, SchemaDatasetFacetFields

    facets: dict[str, DatasetFacet] = {
        "version": DatasetVersionDatasetFacet(datasetVersion=manifest.digest),
        "pretrain_snapshot": _facet_classes()["snapshot"](
            snapshot=manifest.snapshot,
            path=manifest.path,
            run=_run_of(manifest),
            digest=manifest.digest,
            config_hash=manifest.config_hash,
            code_version=manifest.code_version,
            rows=dict(manifest.rows),
            counters=dict(manifest.counters),
        ),
    }
    schema = parquet_schema(Path(manifest.path), manifest)
    if schema is not None:
        facets["schema"] = SchemaDatasetFacet(
            fields=[SchemaDatasetFacetFields(name=name, type=kind) for name, kind in schema]
        )
    return facets


def _run_of(manifest: Manifest) -> str | None:
    """The training run of a per-run output: its folder under the snapshot."""
    path = Path(manifest.path)
    return path.name if path.parent.name == manifest.snapshot and path.name != manifest.snapshot else None


def _statistics(manifest: Manifest) -> dict[str, Any]:
    _, rows = primary_rows(manifest)
    return {"rowCount": rows, "size": manifest.bytes, "fileCount": len(manifest.files)}


def input_dataset(data_root: str, manifest: Manifest) -> InputDataset:
    from openlineage.client.event_v2 import InputDataset
    from openlineage.client.generated.input_statistics_input_dataset import (
        InputStatisticsInputDatasetFacet,
    )

    namespace, name = dataset_identity(data_root, manifest.corpus, manifest.stage)
    return InputDataset(
        namespace=namespace,
        name=name,
        facets=dataset_facets(manifest),
        inputFacets={"inputStatistics": InputStatisticsInputDatasetFacet(**_statistics(manifest))},
    )


def output_dataset(
    data_root: str, corpus: str, stage: str, manifest: Manifest | None = None
) -> OutputDataset:
    """A stage's output; with its manifest once published (COMPLETE), bare before (START)."""
    from openlineage.client.event_v2 import OutputDataset
    from openlineage.client.generated.output_statistics_output_dataset import (
        OutputStatisticsOutputDatasetFacet,
    )

    namespace, name = dataset_identity(data_root, corpus, stage)
    if manifest is None:
        return OutputDataset(namespace=namespace, name=name)
    return OutputDataset(
        namespace=namespace,
        name=name,
        facets=dataset_facets(manifest),
        outputFacets={"outputStatistics": OutputStatisticsOutputDatasetFacet(**_statistics(manifest))},
    )


def read_inputs(manifest: Manifest) -> list[Manifest]:
    """The manifests of the inputs a published output records it was made from, as they are now."""
    found = []
    for ref in manifest.inputs:
        path = Path(ref["path"]) / MANIFEST_NAME
        if path.is_file():
            found.append(Manifest.read(path))
    return found


def ref_manifests(refs: Iterable[DatasetRef]) -> list[Manifest]:
    """The published manifests of ``refs`` that exist (a stage checks its inputs itself)."""
    return [ref.manifest() for ref in refs if ref.is_complete()]


def run_facets(
    config: CoreConfig, stage: str, snapshot: str, run: str | None = None, error: BaseException | None = None
) -> dict[str, RunFacet]:
    """A stage run's facets: ``pretrain_run`` (the code version and config hash that made its output, and the
    Airflow task when there is one), with ``errorMessage`` for a failed run."""
    from pipeline.core.lineage import code_version

    facets: dict[str, RunFacet] = {
        "pretrain_run": _facet_classes()["run"](
            stage=stage,
            corpus=config.project.corpus,
            snapshot=snapshot,
            code_version=code_version(),
            config_hash=config.hash,
            run=run,
            airflow={k: v for k, v in Lineage.from_env().to_dict().items() if v is not None},
        )
    }
    if error is not None:
        from openlineage.client.generated.error_message_run import ErrorMessageRunFacet

        facets["errorMessage"] = ErrorMessageRunFacet(
            message=f"{type(error).__name__}: {error}",
            programmingLanguage="python",
            stackTrace="".join(traceback.format_exception(error)),
        )
    return facets


class StageLineage:
    """The OpenLineage events of one stage run: START before it, then COMPLETE or FAIL."""

    def __init__(
        self,
        config: CoreConfig,
        stage: str,
        snapshot: str,
        inputs: list[DatasetRef],
        output: DatasetRef,
        client: OpenLineageClient | None = None,
    ) -> None:
        from openlineage.client import OpenLineageClient
        from openlineage.client.uuid import generate_new_uuid

        self.config = config
        self.stage = stage
        self.snapshot = snapshot
        self.inputs = inputs
        self.output = output
        self.client = client or OpenLineageClient()
        self.run_id = str(generate_new_uuid())

    @property
    def data_root(self) -> str:
        return str(self.config.project.data_root)

    def _run_facets(self, error: BaseException | None = None) -> dict[str, RunFacet]:
        return run_facets(self.config, self.stage, self.snapshot, self.output.run, error)

    def event(
        self,
        state: str,
        inputs: list[Manifest],
        output: Manifest | None = None,
        error: BaseException | None = None,
    ) -> RunEvent:
        from openlineage.client.event_v2 import Job, Run, RunEvent, RunState
        from openlineage.client.generated.job_type_job import JobTypeJobFacet

        return RunEvent(
            eventType=RunState(state),
            eventTime=datetime.now(UTC).isoformat(),
            run=Run(runId=self.run_id, facets=self._run_facets(error)),
            job=Job(
                namespace=job_namespace(),
                name=f"{self.config.project.corpus}.{self.stage}",
                facets={
                    "jobType": JobTypeJobFacet(
                        processingType="BATCH", integration="PRETRAIN", jobType="STAGE"
                    )
                },
            ),
            inputs=[input_dataset(self.data_root, manifest) for manifest in inputs],
            outputs=[output_dataset(self.data_root, self.output.corpus, self.output.stage, output)],
            producer=PRODUCER,
        )

    def start(self) -> None:
        self._emit(self.event("START", ref_manifests(self.inputs)))

    def complete(self, manifest: Manifest) -> None:
        # The inputs the output records it read: for training, every snapshot of its mixture.
        self._emit(self.event("COMPLETE", read_inputs(manifest), manifest))

    def fail(self, error: BaseException) -> None:
        self._emit(self.event("FAIL", ref_manifests(self.inputs), error=error))

    def _emit(self, event: RunEvent) -> None:
        # An unreachable catalogue is the catalogue's problem: the stage's own result stands.
        try:
            self.client.emit(event)
        except Exception as exc:  # any transport's error
            log.warning("OpenLineage %s event for %s not sent: %s", event.eventType, self.stage, exc)

    def close(self) -> None:
        try:
            self.client.close(timeout=30)
        except Exception as exc:
            log.warning("OpenLineage client did not close cleanly: %s", exc)


def stage_lineage(
    config: CoreConfig, stage: str, snapshot: str, inputs: list[DatasetRef], output: DatasetRef
) -> StageLineage | None:
    """The command line's events for this run, or None (no client made at all) when OpenLineage is not
    configured, or under an Airflow task, whose events the provider sends from the operator."""
    if not configured() or Lineage.from_env().dag_id is not None:
        return None
    return StageLineage(config, stage, snapshot, inputs, output)


@contextlib.contextmanager
def stage_run_events(
    config: CoreConfig, stage: str, snapshot: str, inputs: list[DatasetRef], output: DatasetRef
) -> Iterator[Callable[[Manifest], None]]:
    """Around one command-line stage run: START, then COMPLETE with the manifest the body passes to the
    callable this yields, or FAIL with the error the body raises. Nothing at all when ``stage_lineage``
    gives no lineage."""
    lineage = stage_lineage(config, stage, snapshot, inputs, output)
    if lineage is None:
        yield lambda manifest: None
        return
    published: list[Manifest] = []
    lineage.start()
    try:
        yield published.append
    except BaseException as exc:
        lineage.fail(exc)
        lineage.close()
        raise
    if published:
        lineage.complete(published[-1])
    lineage.close()
