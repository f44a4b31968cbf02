"""Checkpoints: written atomically with a SHA-256 checksum, the newest K kept, loaded with weights_only=True.

What goes in is registered once, torchtitan-style: ``CheckpointManager(folder, states={"model": model,
"optimizer": ..., "dataloader": loader, ...})`` over parts that implement
``torch.distributed.checkpoint.stateful.Stateful`` (``state_dict()`` / ``load_state_dict()``). Each part's
state is saved under its name and handed back to the same part on resume; ``PerRankState`` is the part for
what every rank holds for itself (its RNG streams, a compression hook's carried errors).

Layout in ``<train output>/checkpoints/``:

    step-000040.pt          torch.save of one dict: the manager's metadata, then one entry per registered part
    step-000040.pt.sha256   "<hex digest>  step-000040.pt" (sha256sum format)

A save writes both under temporary names, fsyncs them, renames the checksum into place and then the
checkpoint, and fsyncs the folder: a visible ``step-*.pt`` always has its checksum, and a crash mid-save leaves
only temporary files, removed on the next start. Loading verifies the checksum and unpickles with
``weights_only=True`` (tensors and plain containers only); a checkpoint that fails either is skipped with a
warning and the previous one is tried.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.distributed.checkpoint.stateful import Stateful

if TYPE_CHECKING:
    from pipeline.train.parallel import DistributedContext

log = logging.getLogger(__name__)
FORMAT_VERSION = 2  # 2: one entry per part registered with CheckpointManager
CHECKSUM_SUFFIX = ".sha256"
_STEP_FILE = re.compile(r"^step-(\d+)\.pt$")
_TEMPORARY = re.compile(r"^\.step-\d+\.pt(\.sha256)?\.tmp-\d+$")


class CheckpointError(RuntimeError):
    """No usable checkpoint where one was expected, or one that does not fit this run."""

    not_retried = True  # a restart finds the same checkpoints (pipeline.train.failures)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_durably(path: Path, write) -> None:
    with open(path, "wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_folder(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class Checkpointer:
    def __init__(self, folder: Path, keep_last: int = 3) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, got {keep_last}")
        self.folder = Path(folder)
        self.keep_last = keep_last

    def path_for(self, step: int) -> Path:
        return self.folder / f"step-{step:06d}.pt"

    def steps(self) -> list[int]:
        if not self.folder.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.folder.iterdir() if (m := _STEP_FILE.match(p.name)))

    def remove_partial_saves(self) -> None:
        """Temporary files of a save that was killed, and checksums whose checkpoint never arrived."""
        if not self.folder.is_dir():
            return
        steps = {self.path_for(step).name for step in self.steps()}
        for path in self.folder.iterdir():
            orphan = (
                path.name.endswith(".pt" + CHECKSUM_SUFFIX)
                and path.name[: -len(CHECKSUM_SUFFIX)] not in steps
            )
            if _TEMPORARY.match(path.name) or orphan:
                log.info("removing %s, left by an interrupted checkpoint save", path)
                path.unlink(missing_ok=True)

    def save(self, step: int, state: dict[str, Any]) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        target = self.path_for(step)
        checksum = target.with_name(target.name + CHECKSUM_SUFFIX)
        temporary = self.folder / f".{target.name}.tmp-{os.getpid()}"
        temporary_checksum = self.folder / f".{checksum.name}.tmp-{os.getpid()}"
        _write_durably(temporary, lambda handle: torch.save({"format": FORMAT_VERSION, **state}, handle))
        line = f"{sha256_of(temporary)}  {target.name}\n"
        _write_durably(temporary_checksum, lambda handle: handle.write(line.encode()))
        os.replace(temporary_checksum, checksum)
        os.replace(temporary, target)
        _fsync_folder(self.folder)
        for old in self.steps()[: -self.keep_last]:
            self.path_for(old).unlink(missing_ok=True)
            self.path_for(old).with_name(self.path_for(old).name + CHECKSUM_SUFFIX).unlink(missing_ok=True)
        return target

    def load(self, step: int) -> dict[str, Any]:
        """The checkpoint of ``step``, checksum verified; raises CheckpointError saying what is wrong."""
        path = self.path_for(step)
        checksum = path.with_name(path.name + CHECKSUM_SUFFIX)
        if not path.is_file():
            raise CheckpointError(f"{path} does not exist")
        if not checksum.is_file():
            raise CheckpointError(f"{path} has no checksum file {checksum.name}")
        expected = checksum.read_text().split()[0] if checksum.read_text().strip() else ""
        actual = sha256_of(path)
        if actual != expected:
            raise CheckpointError(
                f"{path} does not match its checksum (sha256 {actual}, expected {expected})"
            )
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise CheckpointError(f"{path} cannot be loaded with weights_only=True: {exc}") from exc
        if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION:
            raise CheckpointError(f"{path} is not a version-{FORMAT_VERSION} training checkpoint")
        return state

    def load_latest(self) -> tuple[int, dict[str, Any]] | None:
        """The newest checkpoint that verifies and loads; None when there is none at all.

        A corrupt one is skipped with a warning. When checkpoints exist but none loads, raises CheckpointError
        rather than silently starting over.
        """
        latest = load_latest_of([self])
        return None if latest is None else (latest[0], latest[1][0])


def load_latest_of(shards: list[Checkpointer]) -> tuple[int, list[dict[str, Any]]] | None:
    """The newest step whose checkpoint verifies and loads in every shard (one folder per pipeline rank), with
    each shard's state; ``Checkpointer.load_latest``'s rules otherwise (a step missing from a shard counts as
    corrupt)."""
    steps = sorted(set().union(*(shard.steps() for shard in shards)))
    for step in reversed(steps):
        try:
            return step, [shard.load(step) for shard in shards]
        except CheckpointError as exc:
            log.warning("skipping a corrupt checkpoint, trying the previous one: %s", exc)
    if steps:
        folders = ", ".join(str(shard.folder) for shard in shards)
        raise CheckpointError(
            f"none of the {len(steps)} checkpoint(s) in {folders} can be loaded (see the warnings); "
            "move them away, or set train.resume=false to discard them and start over"
        )
    return None


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
            "keys": torch.from_numpy(keys.astype(np.int64)),
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
