"""Launch the training entrypoint under torchrun and wait for it, from the CLI or an Airflow task.

One node: ``torchrun --standalone --nproc-per-node=N --max-restarts=R -m pipeline.train ...``.
Several nodes: every node runs the same command with ``--nnodes=[min:]max --rdzv-backend=c10d
--rdzv-endpoint=<host:port> --rdzv-id=<id>``; the agents meet at the endpoint (node 0's address).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from pipeline.config import PipelineConfig
from pipeline.core.config import ENV_PREFIX
from pipeline.core.locks import OutputLock
from pipeline.core.logs import run_folder
from pipeline.core.manifest import Manifest
from pipeline.core.proc import ChildFailedError, run_streaming
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.train.config import TrainConfig
from pipeline.train.threads import OMP_NUM_THREADS, threads_per_rank

log = logging.getLogger(__name__)
DEFAULT_RDZV_ENDPOINT = "127.0.0.1:29400"


def torchrun_command(config: PipelineConfig, config_path: Path, snapshot: str, input_stage: str) -> list[str]:
    train, settings = config.train, config.distributed
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={train.nproc_per_node}",
        f"--max-restarts={train.max_restarts}",
    ]
    if train.nnodes == 1 and train.min_nnodes is None and settings.rdzv_endpoint is None:
        command.append("--standalone")
    else:
        nodes = f"{train.min_nnodes}:{train.nnodes}" if train.min_nnodes is not None else str(train.nnodes)
        command += [
            f"--nnodes={nodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={settings.rdzv_endpoint or DEFAULT_RDZV_ENDPOINT}",
            f"--rdzv-id={settings.rdzv_id or f'{config.project.corpus}-{snapshot}'}",
        ]
    return [
        *command,
        "-m",
        "pipeline.train",
        "--config",
        str(config_path),
        "--snapshot",
        snapshot,
        "--input-stage",
        input_stage,
    ]


def child_environment(train: TrainConfig | None = None) -> dict[str, str]:
    """The environment torchrun and its ranks get.

    The resolved config file already holds every override; drop the env ones so nothing applies twice.
    With ``train``, OMP_NUM_THREADS is set by ``threads_per_rank`` unless it was set already: explicitly,
    because torchrun would otherwise set 1 for several ranks per node. Without ``train`` torchrun's default
    stands, and each rank sizes torch's threads by the same rule from what it finds.
    """
    env = {key: value for key, value in os.environ.items() if not key.startswith(ENV_PREFIX)}
    if train is not None:
        choice = threads_per_rank(train, environ=env)
        if choice.source != "environment":
            env[OMP_NUM_THREADS] = str(choice.threads)
        log.info("CPU threads: %s", choice)
    # Each restart gets its own worker store (see pipeline.train.parallel._attempt_store for why).
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return env


def prepare_torchrun(config: PipelineConfig, tokens: DatasetRef, snapshot: str) -> list[str]:
    """Write the resolved config where every rank can read it, and return the torchrun command."""
    tokens.require()
    folder = run_folder(config)
    folder.mkdir(parents=True, exist_ok=True)
    config_path = folder / f"train-{snapshot}-config.yaml"
    config_path.write_text(config.to_yaml())
    return torchrun_command(config, config_path, snapshot, tokens.stage)


def run(config: PipelineConfig, inputs: list[DatasetRef], output: DatasetRef) -> Manifest:
    (tokens,) = inputs
    command = prepare_torchrun(config, tokens, output.snapshot)
    log.info("launching: %s", " ".join(command))
    # Ranks format their own console lines; pass them through untouched. The output's lock is held from
    # here for the whole run: torchrun inherits it, and rank 0 publishes under it.
    try:
        with OutputLock(output.path, what=f"train {output.corpus}/{output.snapshot}"):
            run_streaming(
                command,
                env=child_environment(config.train),
                on_line=lambda line: print(line, file=sys.stderr, flush=True),
            )
    except ChildFailedError:
        from pipeline.train.components.checkpoint import Checkpointer

        staging = StageOutput(output, config, inputs, resumable=True).path
        steps = Checkpointer(staging / "checkpoints").steps()
        if steps:
            log.error(
                "training did not finish; its newest checkpoint is step %d in %s: run the same command again "
                "to resume from there",
                steps[-1],
                staging / "checkpoints",
            )
        raise
    return output.manifest()
