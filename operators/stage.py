"""Run one pipeline stage (`python -m pipeline.cli <stage> ...`) as a child process of the task."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from operators.base import PipelineOperator
from operators.lineage import StageLineageMixin
from pipeline.config import PipelineConfig
from pipeline.core.proc import run_streaming
from pipeline.core.storage import DatasetRef


class PipelineStageOperator(PipelineOperator, StageLineageMixin):
    """Runs a stage entrypoint in its own process group and returns its output path (XCom: a path, never data).

    Each stage runs in a fresh process, so a Spark JVM or a Scrapy reactor never outlives its task,
    and a task kill takes the whole group down.
    """

    def __init__(self, *, stage: str, extra_args: Sequence[str] = (), **kwargs: Any) -> None:
        kwargs.setdefault("task_id", stage)
        super().__init__(**kwargs)
        self.stage = stage
        self.extra_args = list(extra_args)

    def stage_arguments(self, config: PipelineConfig) -> list[str]:
        """Arguments of this stage's own, after --snapshot/--config/--set."""
        return list(self.extra_args)

    def output_ref(self, config: PipelineConfig) -> DatasetRef:
        """The output this task publishes, whose path it returns."""
        return DatasetRef.of(config, self.stage, self.task_snapshot)

    def lineage_output(self, config: PipelineConfig, snapshot: str) -> DatasetRef:
        if isinstance(self.snapshot, str):
            return self.output_ref(config)  # a crawl shard's, say
        return super().lineage_output(config, snapshot)

    def execute(self, context) -> str:
        config = self.resolved_config()
        command = [
            sys.executable,
            "-m",
            "pipeline.cli",
            self.stage,
            *self.cli_arguments(),
            *self.stage_arguments(config),
        ]
        self.log.info("running %s", " ".join(command))
        run_streaming(command, env=self.child_environment(), logger=self.log, on_start=self.remember_process)
        return str(self.output_ref(config).require().path)
