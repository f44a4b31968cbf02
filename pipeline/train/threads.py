"""CPU threads per training rank: one rule, for the launcher (OMP_NUM_THREADS) and every rank (torch).

torchrun sets OMP_NUM_THREADS=1 for its workers when it starts more than one per node and the variable is
unset; with one worker it sets nothing. A fixed 1 nearly halves a lone CPU rank on two cores (0.56x
its 2-thread tokens/s, benchmarks/RESULTS.md), while ranks that share cores with too many threads each
spin-wait on the others' intra-op pools. So the default follows the layout: the cores this process may
run on (its CPU affinity, which ``taskset``, a cpuset or a container's ``--cpuset-cpus`` narrows; not the
host's count) divided by the ranks on the node, at least 1. An OMP_NUM_THREADS already in the environment
is kept, and ``train.threads_per_rank`` overrides both. A CPU *quota* (a Kubernetes CPU limit, ``docker
--cpus``) does not change the affinity, so set one of the two there.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pipeline.core.config import ConfigError
from pipeline.train.config import TrainConfig

OMP_NUM_THREADS = "OMP_NUM_THREADS"
# Set by the launcher beside the OMP_NUM_THREADS it chose, with its reason: a rank then says where the value
# came from rather than calling the launcher's own choice a preset.
CHOSEN_BY_LAUNCHER = "PRETRAIN_THREADS_CHOSEN_BY"


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    source: Literal["config", "environment", "launcher", "cores"]
    reason: str  # for the start-up log line

    def __str__(self) -> str:
        return f"{self.threads} thread(s) per rank ({self.reason})"


def usable_cores() -> int:
    """The CPUs this process may be scheduled on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def _preset_threads(environ: Mapping[str, str]) -> int | None:
    value = environ.get(OMP_NUM_THREADS, "").strip()
    if not value:
        return None
    # OpenMP also accepts a list, one count per nesting level; the first is the one torch's pool uses.
    first = value.split(",")[0].strip()
    if not first.isdigit() or int(first) < 1:
        raise ConfigError(
            f"{OMP_NUM_THREADS}={value!r} is not a positive whole number: fix or unset it, or set "
            "train.threads_per_rank"
        )
    return int(first)


def threads_per_rank(
    train: TrainConfig, ranks_on_node: int | None = None, environ: Mapping[str, str] | None = None
) -> ThreadChoice:
    """How many intra-op threads each rank uses; ``ranks_on_node`` defaults to ``train.nproc_per_node``."""
    if train.threads_per_rank is not None:
        return ThreadChoice(train.threads_per_rank, "config", "train.threads_per_rank")
    environ = os.environ if environ is None else environ
    preset = _preset_threads(environ)
    if preset is not None and environ.get(CHOSEN_BY_LAUNCHER):
        return ThreadChoice(preset, "launcher", f"chosen by the launcher: {environ[CHOSEN_BY_LAUNCHER]}")
    if preset is not None:
        return ThreadChoice(preset, "environment", f"{OMP_NUM_THREADS} was already set")
    ranks = ranks_on_node or train.nproc_per_node
    cores = usable_cores()
    return ThreadChoice(
        max(1, cores // ranks), "cores", f"{cores} usable core(s) / {ranks} rank(s) on this node"
    )


def set_rank_threads(train: TrainConfig) -> ThreadChoice:
    """In a rank: torch's intra-op threads by the same rule, counting the ranks torchrun put on this node."""
    import torch

    local_world = os.environ.get("LOCAL_WORLD_SIZE", "")
    choice = threads_per_rank(train, ranks_on_node=int(local_world) if local_world.isdigit() else None)
    torch.set_num_threads(choice.threads)
    return choice
