"""The checkpoint file format: the trained model on disk, which training writes and every reader (export,
evaluation, inference) goes through. What a training checkpoint holds is decided by the trainer's
``pipeline.train.components.checkpoint_manager``; this module only writes, verifies and reads the files.

A training run's ``checkpoints/`` folder (``train/<snapshot>/<run>/checkpoints/``)::

    step-000040.pt              one process or data parallel: the whole model
    step-000040.pt.sha256       "<hex digest>  step-000040.pt" (sha256sum format)
    pp-rank-0-of-2/step-000040.pt(.sha256)   pipeline parallel: each pp rank's stages, in a folder of its own
    pp-rank-1-of-2/step-000040.pt(.sha256)

A file is ``torch.save`` of one dict: ``format`` (``FORMAT_VERSION``), the metadata readers need
(``model_config``: the ``GPTConfig`` fields; ``config_hash``; ``resume_identity``; ``pipeline``: the split),
then one entry per training part (``model``, ``optimizer``, ``lr_scheduler``, ``dataloader``, ``train_state``:
step and tokens seen, ...). Under a pipeline each rank's ``model`` holds its stages' parameters under the unsplit
model's names, so the shards of one step together are the whole model's state dict (``whole_model_checkpoint``).

A save writes both files under temporary names, fsyncs them, renames the checksum into place and then the
checkpoint, and fsyncs the folder: a visible ``step-*.pt`` always has its checksum, and a crash mid-save leaves
only temporary files, removed on the next start. Every load verifies the checksum and unpickles with
``weights_only=True`` (tensors and plain containers only).

Readers: ``pipeline.model.inference.load_model(path)`` gives a ``GPT`` in eval mode from a checkpoint file, a
checkpoints folder (its newest complete step) or a weights file (``save_weights``, what the registered MLflow
model holds), and generates from it. Training registers its parts with
``pipeline.train.components.checkpoint_manager.CheckpointManager``, which writes through ``Checkpointer``.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import torch

from pipeline.core.manifest import sha256_file
from pipeline.core.storage import StageFailure
from pipeline.model.config import GPTConfig
from pipeline.model.gpt import GPT

log = logging.getLogger(__name__)
FORMAT_VERSION = 2  # 2: one entry per part registered with CheckpointManager
WEIGHTS_FORMAT = "weights-1"  # save_weights: the model config and its state dict, nothing to resume with
CHECKSUM_SUFFIX = ".sha256"
_STEP_FILE = re.compile(r"^step-(\d+)\.pt$")
_TEMPORARY = re.compile(r"^\.step-\d+\.pt(\.sha256)?\.tmp-\d+$")
_SHARD_FOLDER = re.compile(r"^pp-rank-(\d+)-of-(\d+)$")


class CheckpointError(StageFailure):
    """No usable checkpoint where one was expected, one that does not fit this run, or a damaged file; the
    CLI prints it as one line."""

    not_retried = True  # a restart finds the same checkpoints (pipeline.train.launcher.failures)


def step_file(step: int) -> str:
    return f"step-{step:06d}.pt"


def step_of(path: Path) -> int:
    """The step a checkpoint file holds, from its name; CheckpointError for any other file."""
    match = _STEP_FILE.match(Path(path).name)
    if match is None:
        raise CheckpointError(f"{path} is not a checkpoint file (step-<N>.pt)")
    return int(match.group(1))


def shard_folder(rank: int, ranks: int) -> str:
    """Each pp rank's checkpoints (its stages' parts) in a folder of its own under checkpoints/."""
    return f"pp-rank-{rank}-of-{ranks}"


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


def _verified_load(path: Path, expected: str, what: str) -> Any:
    """``torch.load(weights_only=True)`` of ``path`` after checking its sha256 against ``expected``."""
    actual = sha256_file(path)
    if actual != expected:
        raise CheckpointError(f"{path} does not match {what} (sha256 {actual}, expected {expected})")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path} cannot be loaded with weights_only=True: {exc}") from exc


class Checkpointer:
    """The checkpoint files of one folder (a run's ``checkpoints/``, or one pp rank's shard folder)."""

    def __init__(self, folder: Path, keep_last: int = 3) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, got {keep_last}")
        self.folder = Path(folder)
        self.keep_last = keep_last

    def path_for(self, step: int) -> Path:
        return self.folder / step_file(step)

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
        line = f"{sha256_file(temporary)}  {target.name}\n"
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
        state = _verified_load(path, expected, f"its checksum file {checksum.name}")
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


def shard_checkpointers(checkpoints: Path, ranks: int) -> list[Checkpointer]:
    """The folders one step's files are spread over: one per pp rank under a pipeline, else the folder."""
    if ranks == 1:
        return [Checkpointer(checkpoints)]
    return [Checkpointer(checkpoints / shard_folder(rank, ranks)) for rank in range(ranks)]


def written_layout(checkpoints: Path) -> set[int]:
    """The pipeline rank counts the checkpoints in ``checkpoints`` were written with (1: unsplit)."""
    if not checkpoints.is_dir():
        return set()
    layouts = set()
    for path in checkpoints.iterdir():
        if match := _SHARD_FOLDER.match(path.name):
            layouts.add(int(match.group(2)))
        elif _STEP_FILE.match(path.name):
            layouts.add(1)
    return layouts


def checkpoint_layout_problem(checkpoints: Path, ranks: int) -> str | None:
    """Why checkpoints written with another number of pipeline stages cannot be resumed here, or None."""
    other = sorted(written_layout(checkpoints) - {ranks})
    if not other:
        return None
    return (
        f"the checkpoints in {checkpoints} were written with train.pp_degree={other[0]}, and this run "
        f"has train.pp_degree={ranks}: a checkpoint holds one part per pipeline rank, so resume it "
        "with the same train.pp_degree, or set train.resume=false to start over"
    )


def latest_checkpoint(checkpoints: Path) -> Path:
    """The newest step's file in a checkpoints folder that every pipeline shard holds (shard 0's file)."""
    layouts = written_layout(checkpoints)
    if not layouts:
        raise CheckpointError(f"no checkpoint (step-*.pt) in {checkpoints}")
    if len(layouts) > 1:
        raise CheckpointError(
            f"{checkpoints} holds checkpoints of several pipeline layouts {sorted(layouts)}"
        )
    (ranks,) = layouts
    shards = shard_checkpointers(checkpoints, ranks)
    steps = set.intersection(*(set(shard.steps()) for shard in shards))
    if not steps:
        raise CheckpointError(f"no step in {checkpoints} is held by all of its {ranks} pipeline shards")
    return shards[0].path_for(max(steps))


def step_files(path: Path) -> list[Path]:
    """Every file of the step ``path`` holds: its checkpoint files (one per pipeline shard) and their checksums."""
    path = Path(path)
    step = step_of(path)
    shard = _SHARD_FOLDER.match(path.parent.name)
    folders = (
        [path.parent]
        if shard is None
        else [
            checkpointer.folder
            for checkpointer in shard_checkpointers(path.parent.parent, int(shard.group(2)))
        ]
    )
    files = [folder / step_file(step) for folder in folders]
    return [
        file
        for checkpoint in files
        for file in (checkpoint, checkpoint.with_name(checkpoint.name + CHECKSUM_SUFFIX))
    ]


def whole_model_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint file ``path`` (or a checkpoints folder's newest) with the whole model under ``model``:
    a pipeline rank's part (``pp-rank-R-of-N/step-K.pt``) merged with the other ranks' parts of the same
    step, each verified by its checksum; any other checkpoint as it is."""
    path = Path(path)
    if path.is_dir():
        path = latest_checkpoint(path)
    step = step_of(path)
    shard = _SHARD_FOLDER.match(path.parent.name)
    if shard is None:
        return Checkpointer(path.parent).load(step)
    ranks = int(shard.group(2))
    parts = [shard.load(step) for shard in shard_checkpointers(path.parent.parent, ranks)]
    merged = dict(parts[0])
    merged["model"] = {name: tensor for part in parts for name, tensor in part["model"].items()}
    return merged


# --- the model alone ----------------------------------------------------------------------------------------


def model_from_state(state: dict[str, Any]) -> GPT:
    """A GPT in eval mode from a dict holding ``model_config`` (GPTConfig fields) and ``model`` (a state dict)."""
    model = GPT(GPTConfig(**state["model_config"]))
    model.load_state_dict(state["model"])
    return model.eval()


def save_weights(state: dict[str, Any], path: Path) -> str:
    """The model of a checkpoint dict alone (config and weights, no training state); returns its sha256."""
    weights = {"format": WEIGHTS_FORMAT, "model_config": state["model_config"], "model": state["model"]}
    _write_durably(Path(path), lambda handle: torch.save(weights, handle))
    return sha256_file(path)


def load_weights(path: Path, sha256: str) -> dict[str, Any]:
    """A ``save_weights`` file, verified against the digest recorded when it was written."""
    state = _verified_load(Path(path), sha256, "the recorded digest")
    if not isinstance(state, dict) or state.get("format") != WEIGHTS_FORMAT:
        raise CheckpointError(f"{path} is not a {WEIGHTS_FORMAT} model weights file")
    return state
