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

``train.checkpoint_format=dcp`` writes each step as a ``torch.distributed.checkpoint`` (DCP) folder instead,
every rank its own shards::

    step-000040/                    a complete step: renamed into place once everything below is verified
        __0_0.distcp, __1_0.distcp  each rank's shards of ``model`` and ``optimizer`` (DTensor shards under
                                    FSDP, a pipeline rank's stages), under the unsplit model's names
        .metadata                   DCP's index: which shard holds which part of which tensor
        state.pt                    rank 0's every other part and the metadata, as the file format's dict
        SHA256SUMS                  "<hex digest>  <file>" for every other file (sha256sum format)
    .step-000040.partial/           a save not yet published (or killed): never read, removed on the next start

The shards carry their tensors' global shapes and offsets, so a step loads at any other layout (DCP
reshards): another data-parallel size, FSDP or not, another number of pipeline stages, or no process group
at all (``whole_model_checkpoint``: export, evaluation and generation read it as they read a file).

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

import io
import logging
import os
import re
import shutil
from collections.abc import Callable
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
_DCP_STEP = re.compile(r"^step-(\d+)$")
_DCP_PARTIAL = re.compile(r"^\.step-(\d+)\.partial$")
DCP_STATE_FILE = "state.pt"  # rank 0's parts that are not sharded, and the metadata readers need
DCP_CHECKSUMS = "SHA256SUMS"
DCP_SHARDED_PARTS = ("model", "optimizer")  # the parts each rank writes its own shards of


class CheckpointError(StageFailure):
    """No usable checkpoint where one was expected, one that does not fit this run, or a damaged file; the
    CLI prints it as one line."""

    not_retried = True  # a restart finds the same checkpoints (pipeline.train.launcher.failures)


def step_file(step: int) -> str:
    return f"step-{step:06d}.pt"


def step_of(path: Path) -> int:
    """The step a checkpoint file (or DCP step folder) holds, from its name; CheckpointError for any other."""
    match = _STEP_FILE.match(Path(path).name) or _DCP_STEP.match(Path(path).name)
    if match is None:
        raise CheckpointError(f"{path} is not a checkpoint file (step-<N>.pt) or folder (step-<N>/)")
    return int(match.group(1))


def is_dcp_step(path: Path) -> bool:
    """Whether ``path`` is one step's DCP checkpoint folder (``step-<N>/``)."""
    path = Path(path)
    return path.is_dir() and _DCP_STEP.match(path.name) is not None


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


class _StepFolder:
    """What both checkpoint formats share: the folder a run's steps are in, and how many of them it keeps."""

    def __init__(self, folder: Path, keep_last: int = 3) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, got {keep_last}")
        self.folder = Path(folder)
        self.keep_last = keep_last

    def steps(self) -> list[int]:
        raise NotImplementedError

    def expired_steps(self) -> list[int]:
        """The steps a save removes: all but the newest ``keep_last``."""
        return self.steps()[: -self.keep_last]


def _newest_that_loads(steps: list[int], load: Callable[[int], Any], folders: str) -> tuple[int, Any] | None:
    """The newest of ``steps`` that ``load`` (a CheckpointError when it is corrupt) loads, with what it gave;
    a corrupt one is skipped with a warning. None when there are no steps; CheckpointError when none loads,
    rather than silently starting over."""
    for step in reversed(steps):
        try:
            return step, load(step)
        except CheckpointError as exc:
            log.warning("skipping a corrupt checkpoint, trying the previous one: %s", exc)
    if steps:
        raise CheckpointError(
            f"none of the {len(steps)} checkpoint(s) in {folders} can be loaded (see the warnings); "
            "move them away, or set train.resume=false to discard them and start over"
        )
    return None


class Checkpointer(_StepFolder):
    """The checkpoint files of one folder (a run's ``checkpoints/``, or one pp rank's shard folder)."""

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
        for old in self.expired_steps():
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
    folders = ", ".join(str(shard.folder) for shard in shards)
    return _newest_that_loads(steps, lambda step: [shard.load(step) for shard in shards], folders)


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
    """The newest step's file in a checkpoints folder that every pipeline shard holds (shard 0's file), or
    its newest DCP step folder, whichever step is newer."""
    layouts = written_layout(checkpoints)
    dcp_steps = DistributedCheckpointer(checkpoints).steps()
    if dcp_steps:
        newest = DistributedCheckpointer(checkpoints).path_for(dcp_steps[-1])
        if not layouts:
            return newest
        files = latest_checkpoint_file(checkpoints)
        return newest if dcp_steps[-1] >= step_of(files) else files
    return latest_checkpoint_file(checkpoints)


def latest_checkpoint_file(checkpoints: Path) -> Path:
    """``latest_checkpoint`` among the ``torch.save`` files (``train.checkpoint_format=torch``)."""
    layouts = written_layout(checkpoints)
    if not layouts:
        raise CheckpointError(f"no checkpoint (step-*.pt or step-*/) in {checkpoints}")
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
    """Every file of the step ``path`` holds: its checkpoint files (one per pipeline shard) and their checksums,
    or every file of a DCP step folder."""
    path = Path(path)
    if is_dcp_step(path):
        return sorted(file for file in path.iterdir() if file.is_file())
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
    step, each verified by its checksum; a DCP step folder (``step-K/``) read into the whole model without a
    process group, every file verified; any other checkpoint as it is."""
    path = Path(path)
    if path.is_dir() and not is_dcp_step(path):
        path = latest_checkpoint(path)
    if is_dcp_step(path):
        return _dcp_whole_model(path)
    step = step_of(path)
    shard = _SHARD_FOLDER.match(path.parent.name)
    if shard is None:
        return Checkpointer(path.parent).load(step)
    ranks = int(shard.group(2))
    parts = [shard.load(step) for shard in shard_checkpointers(path.parent.parent, ranks)]
    merged = dict(parts[0])
    merged["model"] = {name: tensor for part in parts for name, tensor in part["model"].items()}
    return merged


# --- distributed checkpoints (train.checkpoint_format=dcp) -------------------------------------------------


def dcp_state_bytes(state: dict[str, Any]) -> bytes:
    """A DCP step's ``state.pt`` as bytes: the file format's dict (``format`` first), serialised at once, so
    parts that go on changing while a background writer runs do not reach it."""
    buffer = io.BytesIO()
    torch.save({"format": FORMAT_VERSION, **state}, buffer)
    return buffer.getvalue()


def gathered_digests(
    process_group: Any, digests: dict[str, str], is_main: bool
) -> list[dict[str, str]] | None:
    """Every rank's ``write_shards`` digests on rank 0 (collective over ``process_group``), None elsewhere."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return [digests]
    gathered: list[Any] | None = [None] * dist.get_world_size(process_group) if is_main else None
    dist.gather_object(digests, gathered, group=process_group, group_dst=0)
    return gathered


class DistributedCheckpointer(_StepFolder):
    """The DCP checkpoints of one run's ``checkpoints/`` folder: one folder per step, written by every rank.

    ``write_shards`` (collective) has every rank write its shards into the step's partial folder; rank 0 then
    ``publish``-es it: ``state.pt``, the checksums of every file, and the folder renamed into place. A step
    is complete, hence visible, only once all of that is done; ``load_state`` verifies every file again."""

    def path_for(self, step: int) -> Path:
        return self.folder / f"step-{step:06d}"

    def partial_path(self, step: int) -> Path:
        return self.folder / f".step-{step:06d}.partial"

    def steps(self) -> list[int]:
        if not self.folder.is_dir():
            return []
        return sorted(
            int(m.group(1)) for p in self.folder.iterdir() if (m := _DCP_STEP.match(p.name)) and p.is_dir()
        )

    def remove_partial_saves(self) -> None:
        """The folders of saves that were killed (or are not yet published: call it before any save)."""
        if not self.folder.is_dir():
            return
        for path in self.folder.iterdir():
            if _DCP_PARTIAL.match(path.name):
                log.info("removing %s, left by an interrupted checkpoint save", path)
                shutil.rmtree(path, ignore_errors=True)

    def write_shards(self, step: int, sharded: dict[str, Any], process_group: Any = None) -> dict[str, str]:
        """Collective over ``process_group``: every rank writes its shards of ``sharded`` into the step's
        partial folder (``torch.distributed.checkpoint.save``; rank 0 also DCP's ``.metadata``, once every
        rank's shards are written). Returns the sha256 of each file this rank wrote."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        partial = self.partial_path(step)
        partial.mkdir(parents=True, exist_ok=True)
        writer = dcp.FileSystemWriter(partial, sync_files=True, thread_count=1, overwrite=True)
        dcp.save(sharded, storage_writer=writer, process_group=process_group)
        rank = dist.get_rank(process_group) if dist.is_initialized() else 0
        return {path.name: sha256_file(path) for path in sorted(partial.glob(f"__{rank}_*.distcp"))}

    def publish(self, step: int, digests: dict[str, str], state: bytes) -> Path:
        """Rank 0, once every rank's shards are written (``digests``: every rank's files): ``state.pt``
        (``state``: ``torch.save`` of the file format's dict without model and optimizer), the checksums of
        every file, then the folder renamed into place; steps beyond ``keep_last`` removed."""
        partial = self.partial_path(step)
        _write_durably(partial / DCP_STATE_FILE, lambda handle: handle.write(state))
        digests = {**digests, **{name: sha256_file(partial / name) for name in (".metadata", DCP_STATE_FILE)}}
        unclaimed = sorted(path.name for path in partial.iterdir() if path.name not in digests)
        if unclaimed:
            raise CheckpointError(f"{partial} holds files no rank wrote for step {step}: {unclaimed}")
        lines = "".join(f"{digests[name]}  {name}\n" for name in sorted(digests))
        _write_durably(partial / DCP_CHECKSUMS, lambda handle: handle.write(lines.encode()))
        _fsync_folder(partial)
        target = self.path_for(step)
        if target.exists():  # the same step saved again by a restarted attempt
            shutil.rmtree(target)
        os.replace(partial, target)
        _fsync_folder(self.folder)
        for old in self.expired_steps():
            shutil.rmtree(self.path_for(old), ignore_errors=True)
        return target

    def checksums(self, step: int) -> dict[str, str]:
        """The step's ``SHA256SUMS``: each file's recorded digest; CheckpointError when it is missing."""
        path = self.path_for(step)
        listing = path / DCP_CHECKSUMS
        if not listing.is_file():
            raise CheckpointError(f"{path} has no checksum file {DCP_CHECKSUMS}")
        digests = {}
        for line in listing.read_text().splitlines():
            digest, _, name = line.partition("  ")
            digests[name] = digest
        if not {".metadata", DCP_STATE_FILE} <= set(digests):
            raise CheckpointError(f"{listing} does not list .metadata and {DCP_STATE_FILE}")
        return digests

    def load_state(self, step: int, verify_shards: bool = True) -> dict[str, Any]:
        """The step's ``state.pt`` (every part but the sharded ones, and the metadata), after checking the
        checksum of every file in the folder (``verify_shards``; else of ``state.pt`` alone)."""
        path = self.path_for(step)
        if not path.is_dir():
            raise CheckpointError(f"{path} does not exist")
        digests = self.checksums(step)
        if verify_shards:
            present = {file.name for file in path.iterdir()} - {DCP_CHECKSUMS}
            if present != set(digests):
                raise CheckpointError(
                    f"{path}: the files {sorted(present ^ set(digests))} are missing or not in {DCP_CHECKSUMS}"
                )
            for name, digest in digests.items():
                if name != DCP_STATE_FILE and sha256_file(path / name) != digest:
                    raise CheckpointError(f"{path / name} does not match its checksum in {DCP_CHECKSUMS}")
        state = _verified_load(path / DCP_STATE_FILE, digests[DCP_STATE_FILE], f"its line in {DCP_CHECKSUMS}")
        if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION:
            raise CheckpointError(f"{path} is not a version-{FORMAT_VERSION} training checkpoint")
        return state

    def load_latest(self) -> tuple[int, dict[str, Any]] | None:
        """The newest step that verifies (``load_state``); ``Checkpointer.load_latest``'s rules otherwise."""
        return _newest_that_loads(self.steps(), self.load_state, str(self.folder))

    def read_sharded(self, step: int, template: dict[str, Any], process_group: Any = None) -> None:
        """Collective: fill ``template`` (this rank's sharded state dicts, any layout) in place from the step's
        shards; DCP reads the parts of each tensor this rank holds, whatever layout wrote them."""
        import torch.distributed.checkpoint as dcp

        try:
            dcp.load(template, checkpoint_id=self.path_for(step), process_group=process_group)
        except Exception as exc:
            raise CheckpointError(f"{self.path_for(step)} does not fit this model: {exc}") from exc


def _dcp_whole_model(folder: Path) -> dict[str, Any]:
    """A DCP step folder as the file format's dict, the whole model under ``model`` (no process group)."""
    import torch.distributed.checkpoint as dcp

    state = DistributedCheckpointer(folder.parent).load_state(step_of(folder))
    weights = GPT(GPTConfig(**state["model_config"])).state_dict()
    try:
        dcp.load({"model": weights}, checkpoint_id=folder, no_dist=True)
    except Exception as exc:
        raise CheckpointError(f"{folder} does not hold this model's weights: {exc}") from exc
    return {**state, "model": weights}


def checkpoint_format_problem(checkpoints: Path, checkpoint_format: str) -> str | None:
    """Why the checkpoints in ``checkpoints`` cannot be resumed with ``train.checkpoint_format``, or None."""
    other = "torch" if checkpoint_format == "dcp" else "dcp"
    found = written_layout(checkpoints) if other == "torch" else DistributedCheckpointer(checkpoints).steps()
    if not found:
        return None
    return (
        f"the checkpoints in {checkpoints} were written with train.checkpoint_format={other}, and this run "
        f"has train.checkpoint_format={checkpoint_format}: resume it with train.checkpoint_format={other}, "
        "or set train.resume=false to start over"
    )


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
