"""Launch the training entrypoint under torchrun and wait for it, from the CLI or an Airflow task."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from pipeline.core.config import ENV_PREFIX, PipelineConfig
from pipeline.core.logs import run_folder
from pipeline.core.manifest import Manifest
from pipeline.core.proc import run_streaming
from pipeline.core.storage import DatasetRef

log = logging.getLogger(__name__)


def torchrun_command(config: PipelineConfig, config_path: Path, snapshot: str, input_stage: str) -> list[str]:
    train = config.train
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={train.nproc_per_node}"]
    if train.nnodes == 1:
        command.append("--standalone")
    else:
        command += [f"--nnodes={train.nnodes}", "--rdzv_backend=c10d"]
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


def child_environment() -> dict[str, str]:
    """The resolved config file already holds every override; drop the env ones so nothing applies twice."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(ENV_PREFIX)}
    env.setdefault("OMP_NUM_THREADS", "1")
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
    # Ranks format their own console lines; pass them through untouched.
    run_streaming(
        command, env=child_environment(), on_line=lambda line: print(line, file=sys.stderr, flush=True)
    )
    return output.manifest()
