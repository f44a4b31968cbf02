"""Process groups and data parallelism: torch.distributed set-up from the config, DDP wrapping.

Under torchrun everything comes from the environment (``env://``: RANK, WORLD_SIZE, MASTER_ADDR, ...).
``distributed.init_method`` / ``world_size`` / ``rank`` start a group without torchrun (``tcp://`` or
``file://``). NCCL is the backend on GPU and gloo on CPU unless ``distributed.backend`` says otherwise.

Besides the main group, every run has a gloo *control* group for small CPU-side messages (the SIGTERM
agreement each step, token counts, per-rank checkpoint state), so none of them forces a GPU synchronisation.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from pipeline.config import PipelineConfig
from pipeline.core.config import ConfigError
from pipeline.train.config import TrainConfig

log = logging.getLogger(__name__)


def resolve_backend(requested: str) -> str:
    if requested != "auto":
        return requested
    return "nccl" if torch.cuda.is_available() else "gloo"


@dataclass
class DistributedContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    control_group: Any  # gloo ProcessGroup for CPU tensors; None means the (gloo) default group
    owns_process_group: bool
    # A sub-context (one dimension of the pipeline's pp x dp mesh) talks over its own groups; rank and
    # world_size are then the ones inside the group. None: the default group.
    group: Any = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce(self, tensor: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        """In place over the main group (device tensors); a no-op for a single process."""
        if self.world_size > 1:
            dist.all_reduce(tensor, op=op, group=self.group)
        return tensor

    def any_rank(self, flag: bool) -> bool:
        """True on every rank when it is True on any rank (CPU, control group)."""
        if self.world_size == 1:
            return flag
        value = torch.tensor([int(flag)], dtype=torch.int32)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.control_group)
        return bool(value.item())

    def sum_cpu(self, value: int) -> int:
        if self.world_size == 1:
            return value
        tensor = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(tensor, group=self.control_group)
        return int(tensor.item())

    def gather_objects(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (in rank order); None elsewhere."""
        if self.world_size == 1:
            return [obj]
        gathered = [None] * self.world_size if self.is_main else None
        dist.gather_object(obj, gathered, group=self.control_group, group_dst=0)
        return gathered

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if self.world_size == 1:
            return obj
        holder = [obj if self.is_main else None]
        dist.broadcast_object_list(holder, group=self.control_group, group_src=0)
        return holder[0]

    def first_message(self, message: str | None) -> str | None:
        """The lowest rank's non-None ``message``, on every rank (None when no rank has one): so ranks that
        found different things, or nothing, fail together with one message instead of one rank failing and
        the others breaking in their next collective."""
        gathered = self.gather_objects(message)
        return self.broadcast_object(next((m for m in gathered or [] if m is not None), None))

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier(group=self.control_group)

    def close(self, wait_s: float = 30.0) -> None:
        """Destroy the group we created, waiting at most ``wait_s``: the run's work is done and saved by now,
        and a peer that already exited must not keep this rank alive (seen once with gloo on 2 CPU ranks)."""
        if not (self.owns_process_group and dist.is_initialized()):
            return

        def destroy() -> None:
            with contextlib.suppress(Exception):  # a peer that died already must not mask the real error
                dist.destroy_process_group()

        worker = threading.Thread(target=destroy, name="destroy-process-group", daemon=True)
        worker.start()
        worker.join(wait_s)
        if worker.is_alive():
            log.warning("destroying the process group took over %.0f s; exiting without waiting", wait_s)


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else None


def _attempt_store(timeout: datetime.timedelta) -> dist.Store:
    """torchrun's shared store, with keys private to this restart attempt.

    Workers of every attempt share the agent's TCPStore, and torch adds no per-attempt prefix there: a
    restarted rank could read a dead peer's address left by the previous attempt and wait for it forever.
    """
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        is_master=False,
        timeout=timeout,
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(
        f"pretrain-train/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/attempt-{attempt}", store
    )


def init_distributed(config: PipelineConfig) -> DistributedContext:
    """Join (or reuse) the default process group and pick this rank's device."""
    settings = config.distributed
    backend = resolve_backend(settings.backend)
    if backend == "nccl" and not torch.cuda.is_available():
        raise ConfigError("distributed.backend: nccl needs CUDA, and no GPU is visible; use gloo (or auto)")
    owns = False
    if not dist.is_initialized():
        env_rank, env_world = _env_int("RANK"), _env_int("WORLD_SIZE")
        if (
            settings.rank is not None
            and env_rank is not None
            and (settings.rank, settings.world_size)
            != (
                env_rank,
                env_world,
            )
        ):
            raise ConfigError(
                f"distributed.rank/world_size ({settings.rank}/{settings.world_size}) disagree with the "
                f"launcher's RANK/WORLD_SIZE ({env_rank}/{env_world}); leave them unset under torchrun"
            )
        options: dict[str, Any] = {
            "backend": backend,
            "init_method": settings.init_method,
            "timeout": datetime.timedelta(seconds=settings.timeout_s),
        }
        if settings.rank is not None:
            options.update(rank=settings.rank, world_size=settings.world_size)
        elif settings.init_method == "env://" and env_rank is None:
            raise ConfigError(
                "no RANK/WORLD_SIZE in the environment: start the trainer with torchrun (`pretrain train` does "
                "that for you), or set distributed.init_method, world_size and rank"
            )
        elif settings.init_method == "env://" and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            options.update(store=_attempt_store(options["timeout"]), rank=env_rank, world_size=env_world)
            del options["init_method"]
        dist.init_process_group(**options)
        owns = True
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = _env_int("LOCAL_RANK")
    if local_rank is None:
        local_rank = rank % max(torch.cuda.device_count(), 1) if backend == "nccl" else 0
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    control = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None
    return DistributedContext(rank, world_size, local_rank, device, backend, control, owns)


def data_parallel(model: torch.nn.Module, ctx: DistributedContext, train: TrainConfig) -> torch.nn.Module:
    """DDP around the model for more than one rank of ``ctx`` (a pipeline stage's: its "dp" group); the bare
    model for one (nothing to reduce)."""
    if ctx.world_size == 1:
        return model
    return DistributedDataParallel(
        model,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        process_group=ctx.group,
        bucket_cap_mb=train.bucket_cap_mb,
        # The only buffers are RoPE tables, identical everywhere: do not broadcast them every forward.
        forward_sync_buffers=False,
        gradient_as_bucket_view=True,
    )


def settle_buckets(ddp: torch.nn.Module, make_inputs, autocast) -> None:
    """One forward/backward on throw-away inputs, before training and before a comm hook is registered.

    DDP lays out its gradient buckets again after the first backward, in the order gradients became ready.
    Doing that here, on every start, means the first real step of a fresh run and of a resumed run reduce
    gradients in the same final buckets, which keeps a resumed run bit-identical and lets stateful hooks
    (error feedback) key their state by bucket. RNG states are forked so nothing observable changes.
    """
    if not isinstance(ddp, DistributedDataParallel):
        return
    devices = [ddp.device.index] if ddp.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        inputs, targets = make_inputs()
        with autocast():
            out = ddp(inputs, targets)
        out.loss.backward()
    ddp.module.zero_grad(set_to_none=True)
