"""`python -m pipeline.train` / `pretrain train`: train the model on a snapshot's token shards, or on the
weighted mixture of corpora and snapshots ``data.mixture`` declares (then --snapshot names the run's folder).

Run directly, it launches torchrun with train.nproc_per_node processes per node (train.nnodes nodes,
train.max_restarts restarts after a failure), so `pretrain train --snapshot demo` is all a user types.
Under torchrun (RANK in the environment), or with distributed.rank set, it is the per-rank trainer.

Exit status 143: stopped by SIGTERM after writing a checkpoint; the same command resumes the run. Exit
status 2: a failure no restart can fix (a bad setting, a read-only checkpoint folder...), stated in one line;
a rank that meets one stops its torchrun agent rather than have it restart the group. The
launcher passes SIGTERM and SIGINT on to torchrun and waits for the ranks' checkpoint; a rank dies with its
torchrun agent and torchrun with the launcher, so nothing outlives a killed `pretrain train`.
Details: docs/training.md.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys

from pipeline.core.cli import run_cli
from pipeline.core.proc import die_with_parent, exit_now
from pipeline.entrypoint import add_input_stage_argument, resolve, stage_main, stage_parser, start_logging
from pipeline.train.launcher.failures import TORCHRUN_WORKER

log = logging.getLogger("pipeline.train")


def _parser():
    parser = stage_parser("pretrain train", __doc__)
    add_input_stage_argument(parser, "train")
    return parser


def main(argv: list[str] | None = None) -> int:
    if TORCHRUN_WORKER in os.environ:
        # A rank dies with its torchrun agent: killed, it cannot stop its ranks, which would otherwise train
        # on as orphans (and publish). Read first thing, before the agent has much time to die unnoticed.
        die_with_parent(os.getppid())
    args = _parser().parse_args(argv)
    config, snapshot = resolve(args)
    is_worker = "RANK" in os.environ or "LOCAL_RANK" in os.environ or config.distributed.rank is not None
    if not is_worker:
        from pipeline.train.launcher.failures import EXIT_STOPPED, TrainingStopped
        from pipeline.train.launcher.launch import name_run, training_inputs

        try:
            return stage_main(
                argv,
                stage="train",
                description=__doc__,
                component="train-launcher",
                name_run=name_run,
                resolve_inputs=training_inputs,
            )
        except TrainingStopped as stopped:
            log.warning("%s", stopped)
            if not config.logging.console:
                print(f"train {snapshot}: {stopped}", file=sys.stderr, flush=True)
            return EXIT_STOPPED
    rank = int(os.environ.get("RANK", config.distributed.rank or 0))
    # `kill -USR1 <pid>` prints every thread's Python stack: the first look at a rank stuck in a collective.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    start_logging(config, "train", rank=rank)
    from pipeline.train import fault_injection
    from pipeline.train.launcher.failures import rank_failed
    from pipeline.train.trainer import EXIT_STOPPED, Trainer, TrainingStopped

    trainer = None
    try:
        trainer = Trainer(config, snapshot, args.input_stage)
        fault_injection.arm(trainer)  # the chaos tests' signal at a chosen step, when they ask for one
        trainer.run()
    except TrainingStopped as stopped:
        log.warning("%s", stopped)
        return EXIT_STOPPED
    except Exception as exc:
        # Recorded for the launcher; a failure no restart can fix stops the job here, once.
        return rank_failed(exc, rank, stopping=trainer is not None and trainer.stopping)
    return 0


if __name__ == "__main__":
    # Without the interpreter's teardown (pipeline.core.proc.exit_now): each rank, torchrun and the launcher
    # spent 1 to 2.5 s in it on the sample, one after the other, after the run was published.
    exit_now(run_cli(main))
