"""Run one pipeline stage (`python -m pipeline.cli <stage> ...`) as a child process of the task."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from operators.base import PipelineOperator
from pipeline.core.proc import run_streaming
from pipeline.core.storage import DatasetRef


class PipelineStageOperator(PipelineOperator):
    """Runs a stage entrypoint in its own process group and returns its output path (XCom: a path, never data).

    Each stage runs in a fresh process, so a Spark JVM or a Scrapy reactor never outlives its task,
    and a task kill takes the whole group down.
    """

    def __init__(self, *, stage: str, extra_args: Sequence[str] = (), **kwargs: Any) -> None:
        kwargs.setdefault("task_id", stage)
        super().__init__(**kwargs)
        self.stage = stage
        self.extra_args = list(extra_args)

    def execute(self, context) -> str:
        command = [sys.executable, "-m", "pipeline.cli", self.stage, *self.cli_arguments(), *self.extra_args]
        self.log.info("running %s", " ".join(command))
        run_streaming(command, logger=self.log, on_start=self.remember_process)
        return str(DatasetRef.of(self.resolved_config(), self.stage, self.snapshot).require().path)
