"""The trainer's save/resume component: which stateful parts a checkpoint holds, registered once
(torchtitan-style), and handing each its state back on resume.

``CheckpointManager(folder, states={"model": model, "optimizer": ..., "dataloader": loader, ...})`` takes parts
that implement ``torch.distributed.checkpoint.stateful.Stateful`` (``state_dict()`` / ``load_state_dict()``).
Each part's state is saved under its name and handed back to the same part on resume; ``PerRankState`` is the
part for what every rank holds for itself (its RNG streams, a compression hook's carried errors).

The files (names, checksums, atomic saves, newest-valid loading, pipeline shards) are the model's on-disk
format, ``pipeline.model.checkpoint``; this module only decides what goes in them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.distributed.checkpoint.stateful import Stateful

from pipeline.model.checkpoint import Checkpointer, CheckpointError

if TYPE_CHECKING:
    from pipeline.train.distributed.process_groups import DistributedContext


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
