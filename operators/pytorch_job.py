"""Launch distributed training through torchrun on this worker (the Kubernetes launcher arrives separately)."""

from __future__ import annotations

from typing import Any

from operators.base import PipelineOperator
from pipeline.core.proc import run_streaming
from pipeline.core.storage import DatasetRef
from pipeline.train.launch import child_environment, prepare_torchrun

LAUNCHERS = ("local",)


class PyTorchJobOperator(PipelineOperator):
    """Runs `torchrun ... -m pipeline.train`, streams every rank's output into the task log,
    and kills the whole process group (agent and workers) when the task is killed."""

    template_fields = (*PipelineOperator.template_fields, "nproc_per_node", "nnodes")

    def __init__(
        self,
        *,
        launcher: str = "local",
        nproc_per_node: int | str | None = None,
        nnodes: int | str | None = None,
        input_stage: str = "tokenize",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("task_id", "train")
        super().__init__(**kwargs)
        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher {launcher!r} is not supported; choose one of {LAUNCHERS}")
        self.launcher = launcher
        self.nproc_per_node = nproc_per_node
        self.nnodes = nnodes
        self.input_stage = input_stage

    def execute(self, context) -> str:
        sizes = []
        if self.nproc_per_node not in (None, ""):
            sizes.append(f"train.nproc_per_node={int(self.nproc_per_node)}")
        if self.nnodes not in (None, ""):
            sizes.append(f"train.nnodes={int(self.nnodes)}")
        config = self.resolved_config(sizes)
        tokens = DatasetRef.of(config, self.input_stage, self.snapshot)
        command = prepare_torchrun(config, tokens, self.snapshot)
        self.log.info("launching %s", " ".join(command))
        run_streaming(
            command,
            env=child_environment(),
            on_line=lambda line: self.log.info("%s", line),
            on_start=self.remember_process,
        )
        return str(DatasetRef.of(config, "train", self.snapshot).require().path)
