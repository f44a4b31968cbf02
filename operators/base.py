"""What every pipeline operator shares: which snapshot, which config file, which overrides."""

from __future__ import annotations

import ast
import contextlib
import os
import subprocess
from collections.abc import Sequence
from typing import Any

import psutil
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from operators.defaults import check_run_conf, run_snapshot
from pipeline.config import PipelineConfig, load_config, read_frozen_config
from pipeline.core.config import without_config_environment
from pipeline.core.proc import kill_group


class PipelineOperator(BaseOperator):
    """Base for operators that start a pipeline child process and must not orphan it.

    The config is ``config_path`` with ``overrides`` (and the worker's ``PRETRAIN__`` environment) on top, or,
    with ``frozen_config``, the file a DAG's first task resolved and froze (``pipeline.config.freeze_config``),
    read as it is by this task and its child processes.
    """

    template_fields: Sequence[str] = ("snapshot", "config_path", "overrides")

    def __init__(
        self,
        *,
        snapshot: str | None = None,
        config_path: str | None = "{{ params.config_path }}",
        overrides: list[str] | str = "{{ params.overrides }}",
        frozen_config: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.snapshot = snapshot
        self.config_path = config_path
        self.overrides = overrides
        self.frozen_config = frozen_config
        self._process: subprocess.Popen | None = None

    def pre_execute(self, context) -> None:
        """Before any work: reject misspelt conf keys, and settle the snapshot (default: the run's)."""
        check_run_conf(context)
        if self.snapshot is None:
            self.snapshot = run_snapshot(context["params"], context.get("ds"))
        elif not isinstance(self.snapshot, str):
            raise AirflowFailException(
                f"snapshot {self.snapshot!r} must be a string; a template rendered as a native object "
                "turns names such as 20261201 into numbers: pass it through XCom or leave it unset"
            )

    @property
    def task_snapshot(self) -> str:
        """The snapshot this task works on, as ``pre_execute`` settled it."""
        if not isinstance(self.snapshot, str):
            raise AirflowFailException(f"no snapshot settled for this task (got {self.snapshot!r})")
        return self.snapshot

    def override_list(self) -> list[str]:
        """Rendered templates are strings unless the DAG renders native objects; accept both."""
        if isinstance(self.overrides, str):
            return list(ast.literal_eval(self.overrides)) if self.overrides.strip() else []
        return list(self.overrides or [])

    def resolved_config(self) -> PipelineConfig:
        if not self.frozen_config:
            return load_config(self.config_path or None, self.override_list())
        if not self.config_path or self.override_list():
            raise AirflowFailException(
                f"a frozen config is read as it is: give its file, and no overrides (got {self.config_path!r} "
                f"and {self.override_list()!r})"
            )
        return read_frozen_config(self.config_path)

    def child_environment(self) -> dict[str, str] | None:
        """The child process's environment: this one's (None), but without the ``PRETRAIN__`` settings when the
        config is frozen, which were applied once, when it was resolved."""
        return without_config_environment(os.environ) if self.frozen_config else None

    def cli_arguments(self) -> list[str]:
        args = ["--snapshot", self.task_snapshot]
        if self.config_path:
            args += ["--config", self.config_path]
        for override in self.override_list():
            args += ["--set", override]
        return args

    def remember_process(self, process: subprocess.Popen) -> None:
        self._process = process

    def on_kill(self) -> None:
        """Stop the child's process group, then any descendant that left it.

        torchrun starts each worker in a session of its own and stops them itself on SIGTERM; should the
        agent die first (SIGKILL after the grace period), its workers would outlive the task.
        """
        if self._process is None:
            return
        try:
            descendants = psutil.Process(self._process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            descendants = []
        kill_group(self._process)
        for process in descendants:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
