"""Launch the training entrypoint under torchrun and wait for it, from the CLI or an Airflow task.

One node: ``torchrun --standalone --nproc-per-node=N --max-restarts=R -m pipeline.train ...``.
Several nodes: every node runs the same command with ``--nnodes=[min:]max --rdzv-backend=c10d
--rdzv-endpoint=<host:port> --rdzv-id=<id>``; the agents meet at the endpoint (node 0's address).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pipeline.config import PipelineConfig, freeze_config
from pipeline.core.config import ConfigError, without_config_environment
from pipeline.core.locks import OutputLock
from pipeline.core.logs import run_folder
from pipeline.core.manifest import Manifest
from pipeline.core.proc import ChildFailedError, run_streaming
from pipeline.core.storage import DatasetRef
from pipeline.train.config import TrainConfig
from pipeline.train.fault_injection import ENV_LAUNCHER_PID
from pipeline.train.launcher.failures import ENV_FAILURES, TrainingStopped, failure_summary, read_failures
from pipeline.train.launcher.runs import decide_run, record_run
from pipeline.train.threads import CHOSEN_BY_LAUNCHER, OMP_NUM_THREADS, threads_per_rank

log = logging.getLogger(__name__)
DEFAULT_RDZV_ENDPOINT = "127.0.0.1:29400"


def name_run(
    config: PipelineConfig, snapshot: str, inputs: Sequence[DatasetRef] = (), default: str | None = None
) -> str:
    """The run this launcher trains, decided here once (``pipeline.train.launcher.runs.decide_run``) and handed to the
    ranks as ``train.run_id``. Every node of a multi-node training runs its own launcher, and they must all
    train one run, so there the config must name it."""
    if config.train.nnodes > 1 and config.train.run_id is None and default is None:
        raise ConfigError(
            f"train.nnodes={config.train.nnodes}: every node's launcher must train the same run; name it with "
            "train.run_id=<name>, the same on every node"
        )
    return decide_run(config, snapshot, default)


def training_inputs(config: PipelineConfig, snapshot: str, input_stage: str) -> list[DatasetRef]:
    """The tokenize outputs a training reads, checked before anything starts: every snapshot of the mixture
    (``pipeline.data.mixture.training_mixture``: the one frozen into the run's config, else ``data.mixture``
    resolved now; a MixtureError names the source at fault), else ``snapshot`` of ``input_stage`` alone."""
    if not config.data.mixture:
        return [DatasetRef.of(config, input_stage, snapshot).require()]
    from pipeline.data.mixture import training_mixture

    return training_mixture(config, snapshot, input_stage).refs


def freeze_inputs(config: PipelineConfig, snapshot: str, input_stage: str) -> PipelineConfig:
    """``config`` with its ``data.mixture`` resolved once, for the file a run's later processes read
    (``pipeline.data.mixture.freeze_mixture``: ``data.resolved_mixture``; a MixtureError names the source);
    itself when it declares no mixture."""
    from pipeline.data.mixture import freeze_mixture

    return freeze_mixture(config, snapshot, input_stage)


def torchrun_command(config: PipelineConfig, config_path: Path, snapshot: str, input_stage: str) -> list[str]:
    train, settings = config.train, config.distributed
    command = [
        sys.executable,
        "-m",
        "pipeline.train.launcher.agent",  # torchrun (torch.distributed.run), one line instead of a traceback when stopped
        f"--nproc-per-node={train.nproc_per_node}",
        f"--max-restarts={train.max_restarts}",
    ]
    if train.nnodes == 1 and train.min_nnodes is None and settings.rdzv_endpoint is None:
        command.append("--standalone")
    else:
        nodes = f"{train.min_nnodes}:{train.nnodes}" if train.min_nnodes is not None else str(train.nnodes)
        run = f"-{train.run_id}" if train.run_id else ""
        command += [
            f"--nnodes={nodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={settings.rdzv_endpoint or DEFAULT_RDZV_ENDPOINT}",
            f"--rdzv-id={settings.rdzv_id or f'{config.project.corpus}-{snapshot}{run}'}",
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
    env = without_config_environment(os.environ)
    env.pop(CHOSEN_BY_LAUNCHER, None)  # a value this launcher did not choose is the environment's
    if train is not None:
        choice = threads_per_rank(train, environ=env)
        if choice.source != "environment":
            env[OMP_NUM_THREADS] = str(choice.threads)
            env[CHOSEN_BY_LAUNCHER] = choice.reason
        log.info("CPU threads: %s", choice)
    # Each restart gets its own worker store (see pipeline.train.distributed.process_groups._attempt_store for why).
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return env


def prepare_torchrun(
    config: PipelineConfig, inputs: Sequence[DatasetRef], snapshot: str, config_path: Path | None = None
) -> list[str]:
    """The torchrun command; its ranks read ``config_path``, the frozen file holding ``config``, else one
    written here, where every rank can read it, with ``data.mixture`` resolved into it once unless it was
    already (``freeze_inputs``), so the ranks train what it resolved."""
    for ref in inputs:
        ref.require()
    if config_path is None:
        if config.data.resolved_mixture is None:
            config = freeze_inputs(config, snapshot, inputs[0].stage)
        folder = run_folder(config)
        folder.mkdir(parents=True, exist_ok=True)
        run = f"-{config.train.run_id}" if config.train.run_id else ""  # runs launched together stay apart
        config_path = freeze_config(config, folder / f"train-{snapshot}{run}-config.yaml")
    return torchrun_command(config, config_path, snapshot, inputs[0].stage)


def train(
    config: PipelineConfig,
    inputs: Sequence[DatasetRef],
    snapshot: str,
    *,
    on_line: Callable[[str], None],
    on_start: Callable[[subprocess.Popen], None] | None = None,
    forward_signals: bool = False,
    config_path: Path | None = None,
) -> Manifest:
    """Train the run ``train.run_id`` of ``snapshot`` (its caller decided it with ``name_run``) with torchrun on
    this machine; returns its manifest. ``config_path``: a frozen file holding ``config`` exactly (an Airflow
    run's), which the ranks then read; by default the config is frozen here.

    The run's lock is held from here for the whole training: torchrun inherits it, and rank 0 publishes
    under it. The run's staging folder and ``run.json`` are written first, so a second launcher with the
    same settings finds this run (and its holder) at once instead of starting one of its own.

    No orphans: torchrun gets SIGTERM from the kernel should this process die, even by SIGKILL (it then
    stops its ranks, which checkpoint), and each rank gets SIGKILL should torchrun die (``__main__``). With
    ``forward_signals`` (the CLI) SIGTERM or SIGINT to this process is passed on to torchrun and the wait
    goes on, so the ranks checkpoint and stop, then ``TrainingStopped`` says where; a second one kills
    the group. An Airflow task leaves it off: Airflow's own handler kills the group (``on_kill``).
    """
    run_id = config.train.run_id
    if run_id is None:
        raise ValueError("launch.train trains the run its caller decided: name it with name_run() first")
    output = DatasetRef.of(config, "train", snapshot, run_id)
    command = prepare_torchrun(config, inputs, snapshot, config_path)
    log.info("run %s: launching %s", output.run, " ".join(command))
    staging = output.staging_path(resumable=True)
    failures = prepare_failures_folder(config, snapshot, run_id)
    env = {**child_environment(config.train), ENV_LAUNCHER_PID: str(os.getpid()), ENV_FAILURES: str(failures)}
    try:
        with OutputLock(output.path, what=output.what):
            record_run(staging, config, run_id)
            run_streaming(
                command,
                env=env,
                on_line=on_line,
                on_start=on_start,
                die_with_parent=signal.SIGTERM,
                forward_signals=forward_signals,
            )
    except ChildFailedError as failed:
        from pipeline.model.checkpoint import Checkpointer

        checkpoints = Checkpointer(staging / "checkpoints")
        steps = checkpoints.steps()
        if failed.stopped_by is not None:
            newest = steps[-1] if steps else None
            raise TrainingStopped(
                newest,
                checkpoints.path_for(newest) if newest is not None else None,
                signal.Signals(failed.stopped_by).name,
            ) from None
        resume = f"resumes from step {steps[-1]}" if steps else "starts over (no checkpoint yet)"
        raise failure_summary(failed, read_failures(failures), f"run {output.run} {resume}") from None
    return output.manifest()


def prepare_failures_folder(config: PipelineConfig, snapshot: str, run: str) -> Path:
    """Where this launch's ranks record their failures (``pipeline.train.launcher.failures``); emptied first."""
    folder = run_folder(config) / f"train-{snapshot}-{run}-failures"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def run(config: PipelineConfig, inputs: list[DatasetRef], output: DatasetRef) -> Manifest:
    """The train stage's launcher (`pretrain train`): ranks format their own console lines, passed through.

    ``stage_main`` decided the run (``name_run``) and the output names it; called directly, it is decided here."""
    run_id = output.run or name_run(config, output.snapshot)
    return train(
        config.with_run(run_id),
        inputs,
        output.snapshot,
        on_line=lambda line: print(line, file=sys.stderr, flush=True),
        forward_signals=True,
    )
