"""What the Airflow OpenLineage provider asks an operator that runs one stage: its input and output datasets.

The provider calls ``get_openlineage_facets_on_start`` as the task starts and ``..._on_complete`` /
``..._on_failure`` as it ends, and sends the task's START/COMPLETE/FAIL events with them (adding the error
itself on failure). The datasets are built by ``pipeline.core.lineage_events`` from the manifests, as the
command line's are, so a catalogue sees the same dataset whether a stage ran from Airflow or by hand.
Before the run: the outputs the stage reads (by the registry) and its output, bare; after: the published
output with its counts and schema, and the inputs its manifest records it was made from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.config import PipelineConfig
from pipeline.core.lineage_events import (
    input_dataset,
    output_dataset,
    read_inputs,
    ref_manifests,
    run_facets,
)
from pipeline.core.storage import DatasetRef
from pipeline.stages import stage as registered_stage


class StageLineageMixin:
    """For an operator of one registered stage (``lineage_stage``) with a config and a snapshot."""

    snapshot: Any
    task_id: str
    if TYPE_CHECKING:  # PipelineOperator's; declared, not defined, so the mixin overrides nothing

        def resolved_config(self) -> PipelineConfig: ...

    @property
    def lineage_stage(self) -> str:
        stage: str = getattr(self, "stage", None) or self.task_id
        return stage

    def _lineage_snapshot(self) -> str:
        """The task's snapshot; before ``pre_execute`` settles it, the run's (param, else logical date)."""
        if isinstance(self.snapshot, str):
            return self.snapshot
        from airflow.sdk import get_current_context

        from operators.defaults import run_snapshot

        context = get_current_context()
        return run_snapshot(context["params"], context.get("ds"))

    def lineage_output(self, config: PipelineConfig, snapshot: str) -> DatasetRef:
        """The output the task publishes (a per-run stage's: the run the config names, else the latest)."""
        return DatasetRef.of(config, self.lineage_stage, snapshot)

    def _lineage_inputs(self, config: PipelineConfig, snapshot: str) -> list[DatasetRef]:
        reads = list(registered_stage(self.lineage_stage).reads)
        chosen = getattr(self, "input_stage", None)
        if reads and chosen:
            reads[0] = chosen
        return [DatasetRef.of(config, name, snapshot) for name in reads]

    def _lineage(self, published: bool, error: BaseException | None = None) -> Any:
        from airflow.providers.openlineage.extractors import OperatorLineage

        config = self.resolved_config()
        snapshot = self._lineage_snapshot()
        root = str(config.project.data_root)
        output = self.lineage_output(config, snapshot)
        manifest = output.manifest() if published and output.is_complete() else None
        inputs = read_inputs(manifest) if manifest else ref_manifests(self._lineage_inputs(config, snapshot))
        return OperatorLineage(
            inputs=[input_dataset(root, upstream) for upstream in inputs],
            outputs=[output_dataset(root, output.corpus, output.stage, manifest)],
            run_facets=run_facets(config, self.lineage_stage, snapshot, output.run, error),
        )

    def get_openlineage_facets_on_start(self) -> Any:
        return self._lineage(published=False)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        return self._lineage(published=True)

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        # The provider adds the errorMessage facet from the task's exception itself.
        return self._lineage(published=False)
