"""The trainer's save/resume component: which stateful parts a checkpoint holds, registered once
(torchtitan-style), and handing each its state back on resume.

``CheckpointManager(folder, states={"model": model, "optimizer": ..., "dataloader": loader, ...})`` takes parts
that implement ``torch.distributed.checkpoint.stateful.Stateful`` (``state_dict()`` / ``load_state_dict()``).
Each part's state is saved under its name and handed back to the same part on resume; ``PerRankState`` is the
part for what every rank holds for itself (its RNG streams, a compression hook's carried errors).

The files (names, checksums, atomic saves, newest-valid loading, pipeline shards) are the model's on-disk
format, ``pipeline.model.checkpoint``; this module only decides what goes in them. ``CheckpointManager`` writes
``train.checkpoint_format=torch``'s files (rank 0 writes every part, gathered whole);
``DistributedCheckpointManager`` writes ``dcp``'s (every rank its shards of the model and the optimizer),
optionally in the background (``train.checkpoint_async``).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful

from pipeline.model.checkpoint import (
    DCP_SHARDED_PARTS,
    Checkpointer,
    CheckpointError,
    DistributedCheckpointer,
    dcp_state_bytes,
    gathered_digests,
)

if TYPE_CHECKING:
    from pipeline.train.distributed.process_groups import DistributedContext

log = logging.getLogger(__name__)


class CheckpointManager:
    """The trainer's checkpoint: each stateful part registered once, by name, over a ``Checkpointer``.

    ``save(step)`` asks every part for its ``state_dict()`` on every rank, in registration order (some are
    collective: ZeRO-1's optimizer consolidates its shards, per-rank state is gathered), and rank 0 writes
    ``{**metadata, name: state, ...}``. ``load(state)`` hands each part its entry back, in the same order, so a
    part may rely on the ones registered before it. ``metadata`` is written for readers (the model config for
    export, the settings a resume must share) and never loaded into a part.
    """

    def __init__(
        self,
        folder: Path,
        states: Mapping[str, Stateful],
        *,
        is_main: bool,
        keep_last: int = 3,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        for name, part in states.items():
            if not isinstance(part, Stateful):
                raise TypeError(
                    f"checkpoint part {name!r} ({type(part).__name__}) has no state_dict()/load_state_dict()"
                )
        self.metadata = dict(metadata or {})
        clashes = sorted(set(states) & {*self.metadata, "format"})
        if clashes:
            raise ValueError(f"checkpoint parts {clashes} clash with metadata keys of the same name")
        self.states = dict(states)
        self.is_main = is_main
        self.files = Checkpointer(folder, keep_last=keep_last)

    def save(self, step: int) -> Path:
        """Collective: every rank calls it; rank 0 writes the file. Returns its path on every rank."""
        state = {name: part.state_dict() for name, part in self.states.items()}
        if self.is_main:
            self.files.save(step, {**self.metadata, **state})
        return self.files.path_for(step)

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore every registered part from a loaded checkpoint (``files.load`` / ``files.load_latest``)."""
        missing = [name for name in self.states if name not in state]
        if missing:
            raise CheckpointError(
                f"the checkpoint has no state for {', '.join(missing)}: it was written by another version of "
                "the trainer; set train.resume=false to discard it"
            )
        for name, part in self.states.items():
            part.load_state_dict(state[name])

    def restore(self, step: int, state: Mapping[str, Any]) -> None:
        """Restore every part from the checkpoint of ``step``, whose file ``state`` is."""
        self.load(state)

    def wait(self) -> None:
        """Until the latest save is on disk (saves here are synchronous)."""
        return None


class DistributedCheckpointManager(CheckpointManager):
    """``train.checkpoint_format=dcp``: every rank writes its shards of the parts named in ``DCP_SHARDED_PARTS``
    (``model`` and ``optimizer``, whose ``state_dict()`` is this rank's sharded state dict under the unsplit
    model's names) with ``torch.distributed.checkpoint``; rank 0 writes every other part into ``state.pt``
    and publishes the step (``DistributedCheckpointer``). A resume at another layout gets each rank's part of
    every tensor, whatever layout wrote it.

    With ``async_save`` the shards are copied (staged, this rank's share of the model and optimizer state
    once more in host memory) and written by a background thread, over a gloo process group of its own so
    its collectives never meet the training's; the loop goes on at once. The next save, ``wait()`` and the
    end of the run wait for it. ``after_write`` hooks run in the writer after this rank's shards are on disk
    and before the step is published (the fault injection of the kill-mid-write test)."""

    def __init__(
        self,
        folder: Path,
        states: Mapping[str, Stateful],
        *,
        is_main: bool,
        keep_last: int = 3,
        metadata: Mapping[str, Any] | None = None,
        async_save: bool = False,
    ) -> None:
        missing = [name for name in DCP_SHARDED_PARTS if name not in states]
        if missing:
            raise ValueError(f"a distributed checkpoint needs the parts {missing}")
        super().__init__(folder, states, is_main=is_main, keep_last=keep_last, metadata=metadata)
        self.files: DistributedCheckpointer = DistributedCheckpointer(folder, keep_last=keep_last)  # type: ignore[assignment]
        self.async_save = async_save
        # Collective: every rank builds its manager.
        self.group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self.after_write: list[Callable[[int], None]] = []
        self._writer: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._staging: dict[str, torch.Tensor] = {}  # the async copies, reused save after save

    def save(self, step: int) -> Path:
        """Collective. Synchronous: returns once the step is published. Asynchronous: once this rank's
        shards are staged and its writer started."""
        self.wait()
        sharded = {name: self.states[name].state_dict() for name in DCP_SHARDED_PARTS}
        rest = {name: part.state_dict() for name, part in self.states.items() if name not in sharded}
        blob = dcp_state_bytes({**self.metadata, **rest}) if self.is_main else b""
        if not self.async_save:
            self._write(step, sharded, blob)
        else:
            self._writer = threading.Thread(
                target=self._write_in_background,
                args=(step, staged(sharded, self._staging), blob),
                name=f"checkpoint-step-{step}",
                daemon=True,
            )
            self._writer.start()
        return self.files.path_for(step)

    def _write(self, step: int, sharded: dict[str, Any], blob: bytes) -> None:
        digests = self.files.write_shards(step, sharded, self.group)
        for hook in self.after_write:
            hook(step)
        gathered = gathered_digests(self.group, digests, self.is_main)
        if self.is_main:
            assert gathered is not None
            self.files.publish(step, {n: d for rank in gathered for n, d in rank.items()}, blob)
        if self.group is not None:
            dist.barrier(group=self.group)  # every rank's save ends with the step published

    def _write_in_background(self, step: int, sharded: dict[str, Any], blob: bytes) -> None:
        try:
            self._write(step, sharded, blob)
        except BaseException as exc:  # raised in the training thread by wait()
            log.exception("the asynchronous checkpoint save of step %d failed", step)
            self._failure = exc

    def wait(self) -> None:
        """Until the latest save is published on every rank; raises CheckpointError if it failed."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise CheckpointError(f"the asynchronous checkpoint save failed: {failure}") from failure

    def restore(self, step: int, state: Mapping[str, Any]) -> None:
        """Collective: the sharded parts read from the step's shards into this rank's layout, every other
        part from ``state`` (the step's ``state.pt``), in registration order."""
        missing = [name for name in self.states if name not in state and name not in DCP_SHARDED_PARTS]
        if missing:
            raise CheckpointError(
                f"the checkpoint has no state for {', '.join(missing)}: it was written by another version of "
                "the trainer; set train.resume=false to discard it"
            )
        template = {name: self.states[name].state_dict() for name in DCP_SHARDED_PARTS}
        self.files.read_sharded(step, template, self.group)
        for name, part in self.states.items():
            part.load_state_dict(template[name] if name in template else state[name])


def staged(state: Any, buffers: dict[str, torch.Tensor], path: str = "") -> Any:
    """A copy of a state dict's tensors in host memory (a DTensor stays a DTensor of copied local shards), so
    a background writer saves the values of this moment while training changes the originals. The copies go
    into ``buffers`` (by their path in the state dict), kept from one save to the next: copying into memory
    already touched is several times faster than into fresh pages (the previous writer is done by then)."""
    if isinstance(state, dict):
        return {key: staged(value, buffers, f"{path}.{key}") for key, value in state.items()}
    if isinstance(state, list):
        return [staged(value, buffers, f"{path}.{index}") for index, value in enumerate(state)]
    if not isinstance(state, torch.Tensor):
        return state
    from torch.distributed.tensor import DTensor

    local = state.to_local() if isinstance(state, DTensor) else state
    buffer = buffers.get(path)
    if buffer is None or buffer.shape != local.shape or buffer.dtype != local.dtype:
        buffer = buffers[path] = torch.empty_like(local, device="cpu")
    buffer.copy_(local.detach())
    if isinstance(state, DTensor):
        return DTensor.from_local(
            buffer,
            state.device_mesh,
            state.placements,
            run_check=False,
            shape=state.shape,
            stride=state.stride(),
        )
    return buffer


class PerRankState:
    """Parts each rank holds for itself, as one checkpoint part: ``{"ranks": [rank 0's states, ...]}``.

    Saving gathers every rank's ``{name: part.state_dict()}`` to rank 0 (collective; None on the other ranks).
    Loading gives each rank its own entry back when the checkpoint has as many ranks as this run. With another
    number of ranks no entry belongs to this rank, so nothing is loaded and ``on_other_world_size(saved_ranks)``
    decides what to do instead (re-seed, start afresh). A part the checkpoint has no entry for keeps its state.
    """

    def __init__(
        self,
        ctx: DistributedContext,
        parts: Mapping[str, Stateful],
        on_other_world_size: Callable[[int], None],
    ) -> None:
        self.ctx = ctx
        self.parts = dict(parts)
        self.on_other_world_size = on_other_world_size

    def state_dict(self) -> dict[str, Any]:
        mine = {name: part.state_dict() for name, part in self.parts.items()}
        return {"ranks": self.ctx.gather_objects(mine)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ranks = state["ranks"]
        if len(ranks) != self.ctx.world_size:
            self.on_other_world_size(len(ranks))
            return
        mine = ranks[self.ctx.rank]
        for name, part in self.parts.items():
            if name in mine:
                part.load_state_dict(mine[name])


# --- random number generators ----------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process' torch (CPU and its CUDA device), NumPy and Python RNG states, in weights_only-safe types."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": random.getstate(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    numpy = state["numpy"]
    np.random.set_state(
        (
            numpy["kind"],
            numpy["keys"].numpy().astype(np.uint32),
            numpy["position"],
            numpy["has_gauss"],
            numpy["cached_gaussian"],
        )
    )
    random.setstate(state["python"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


class RNGState:
    """This process' RNG streams (``rng_state`` / ``set_rng_state``) as a checkpoint part."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def state_dict(self) -> dict[str, Any]:
        return rng_state(self.device)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_rng_state(state, self.device)
