"""The storage contract: ``<root>/<corpus>/<stage>/<snapshot>/``, published atomically.

A stage that keeps one output per run (training and its report, see ``pipeline.stages``) writes
``<stage>/<snapshot>/<run>/`` instead, and after each publish points ``<stage>/<snapshot>/latest`` (a symlink
replaced in one rename) at the run it published; readers that name no run read the latest complete one.

A stage writes into a hidden staging folder next to its final place. On success it writes
``manifest.json`` and ``_SUCCESS`` into the staging folder and renames it into place, so a
reader either sees the previous complete output or the new complete output, never a half-written one.
A re-run of the same snapshot swaps the new folder with the old one in one step (Linux ``renameat2`` with
``RENAME_EXCHANGE``), so the path holds a complete output at every instant; the old one is then deleted.
Where the system cannot swap (another OS, or a filesystem without it, such as NFS) the old output is
renamed aside first, and for that moment the path is absent: ``is_complete()`` is False, never half true.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline.core.config import ConfigError, CoreConfig
from pipeline.core.lineage import Lineage, code_version
from pipeline.core.locks import OutputLock, lock_path
from pipeline.core.manifest import MANIFEST_NAME, SUCCESS_NAME, Manifest, checksum_tree, sha256_file

SNAPSHOT_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
STAGING_PREFIX = ".staging-"
LATEST = "latest"  # <stage>/<snapshot>/latest -> <run>: the newest complete run of a per-run stage
RESUMABLE_TAG = "resume"  # .staging-<name>@resume: the one staging folder a resumable stage keeps
SWAP_TAG = "swap-"  # .staging-<snapshot>@swap-<id>: an output on its way in or out, never resumed from


class MissingInputError(FileNotFoundError):
    """An upstream stage's output is absent or incomplete."""


class StageFailure(RuntimeError):
    """A stage ran and its result cannot be published (for example a crawl that stored no page); the
    message says why and what to change. The CLI prints it as one line."""


class DamagedOutputError(StageFailure):
    """A published output's file no longer matches the digest its manifest recorded (changed on disk, cut
    short, tampered with). No retry can fix it."""

    not_retried = True


def local_path(root: str) -> Path:
    if root.startswith("file://"):
        root = root[len("file://") :]
    if "://" in root:
        raise NotImplementedError(
            f"data root {root!r}: only local folders are supported by the Python-side writers; "
            "mount the bucket or volume and point project.data_root at the mount"
        )
    return Path(root)


def validate_snapshot(snapshot: str) -> str:
    if not isinstance(snapshot, str) or not SNAPSHOT_PATTERN.fullmatch(snapshot):
        raise ConfigError(
            f"snapshot {snapshot!r} must match {SNAPSHOT_PATTERN.pattern} (e.g. 2026-11-29 or demo)"
        )
    return snapshot


def validate_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not SNAPSHOT_PATTERN.fullmatch(run_id) or run_id == LATEST:
        raise ConfigError(
            f"run id {run_id!r} must match {SNAPSHOT_PATTERN.pattern} and not be {LATEST!r} "
            "(e.g. lr-3e-3 or 20261201-101530-3f9a2c)"
        )
    return run_id


@dataclass(frozen=True)
class DatasetRef:
    """Where one stage's output for one snapshot lives (and, for a per-run stage, which run's)."""

    root: str
    corpus: str
    stage: str
    snapshot: str
    run: str | None = None  # per-run stages (train, report): <stage>/<snapshot>/<run>/

    def __post_init__(self) -> None:
        validate_snapshot(self.snapshot)
        if self.run is not None:
            validate_run_id(self.run)

    @classmethod
    def of(cls, config: CoreConfig, stage: str, snapshot: str, run: str | None = None) -> DatasetRef:
        """The output of ``stage`` for ``snapshot``. For a stage that keeps one output per run: ``run``, else
        the run the config names (``train.run_id``), else the latest complete run (none yet: the snapshot
        folder itself, which is not complete)."""
        ref = cls(config.project.data_root, config.project.corpus, stage, snapshot)
        if config.keeps_runs(stage):
            run = run or config.named_run(stage) or ref.latest_run()
        return ref if run is None else cls(ref.root, ref.corpus, stage, snapshot, run)

    @property
    def snapshot_path(self) -> Path:
        return local_path(self.root) / self.corpus / self.stage / self.snapshot

    @property
    def path(self) -> Path:
        return self.snapshot_path / self.run if self.run else self.snapshot_path

    def latest_run(self) -> str | None:
        """The run the snapshot's ``latest`` pointer names: the newest complete run."""
        try:
            return validate_run_id(os.readlink(self.snapshot_path / LATEST))
        except (OSError, ConfigError):
            return None

    def staging_path(self, resumable: bool = False) -> Path:
        """The hidden folder beside ``path`` that a writer fills before publishing; a resumable stage keeps
        one fixed folder across attempts (training resumes from its checkpoints)."""
        suffix = RESUMABLE_TAG if resumable else uuid.uuid4().hex[:8]
        return self.path.parent / f"{STAGING_PREFIX}{self.path.name}@{suffix}"

    @property
    def uri(self) -> str:
        return str(self.path)

    def is_complete(self) -> bool:
        return (self.path / SUCCESS_NAME).is_file() and (self.path / MANIFEST_NAME).is_file()

    def manifest(self) -> Manifest:
        self.require()
        return Manifest.read(self.path / MANIFEST_NAME)

    def require(self) -> DatasetRef:
        if not self.is_complete():
            run = f" run {self.run!r}" if self.run else ""
            raise MissingInputError(
                f"no complete {self.stage} output for snapshot {self.snapshot!r}{run} at {self.path}; "
                f"run `pretrain {self.stage} --snapshot {self.snapshot}` first"
            )
        return self

    def verify(self, *names: str) -> DatasetRef:
        """Check the named files (paths relative to the output; none: every file) against the sha256 its
        manifest recorded when it was written; raises ``DamagedOutputError`` naming the first that differs."""
        recorded = self.manifest().files
        for name in names or sorted(recorded):
            entry = recorded.get(name)
            if entry is None:
                raise DamagedOutputError(f"{self.path / name}: not among the files {self.what} recorded")
            path = self.path / name
            actual = sha256_file(path) if path.is_file() else "missing"
            if actual != entry.sha256:
                raise DamagedOutputError(
                    f"{path} does not match the {self.stage} manifest (sha256 {actual}, expected "
                    f"{entry.sha256}): it changed after it was written; restore it, or make {self.what} "
                    "again"
                )
        return self

    @property
    def what(self) -> str:
        """How messages name this output: ``train sample/2026-11-29`` (``... run lr-3e-3``)."""
        return f"{self.stage} {self.corpus}/{self.snapshot}" + (f" run {self.run}" if self.run else "")


class StageOutput:
    """Context manager that owns a staging folder and publishes it atomically on commit.

    >>> with StageOutput(ref, config, inputs=[clean_ref]) as out:
    ...     write_files(out.path)
    ...     out.commit(rows={"documents": n}, counters={...})
    """

    def __init__(
        self,
        ref: DatasetRef,
        config: CoreConfig,
        inputs: Sequence[DatasetRef] = (),
        lineage: Lineage | None = None,
        resumable: bool = False,
    ) -> None:
        """resumable: keep one fixed staging folder across attempts (training resumes from its checkpoints)."""
        self.ref = ref
        self.config = config
        self.inputs = list(inputs)
        self.lineage = lineage or Lineage.from_env()
        self.resumable = resumable
        self.manifest: Manifest | None = None
        self._lock: OutputLock | None = None
        self._started = 0.0
        self.path = ref.staging_path(resumable)

    def __enter__(self) -> StageOutput:
        for upstream in self.inputs:
            upstream.require()
        # One writer per output for the whole block; only the holder may clear staging folders.
        self._lock = OutputLock(self.ref.path, what=self.ref.what)
        self._lock.acquire()
        if not self.resumable:
            self._remove_stale_staging()
        self.path.mkdir(parents=True, exist_ok=self.resumable)
        self._started = time.monotonic()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self.manifest is None:
                if not self.resumable:
                    shutil.rmtree(self.path, ignore_errors=True)
                if exc_type is None:
                    raise RuntimeError(
                        f"{self.ref.stage}: output block ended without commit(); nothing was published"
                    )
        finally:
            if self._lock is not None:
                self._lock.release()

    def _remove_stale_staging(self) -> None:
        """A killed earlier attempt leaves its staging folder behind; it was never visible, so drop it."""
        parent = self.ref.path.parent
        if parent.is_dir():
            for stale in parent.glob(f"{STAGING_PREFIX}{self.ref.path.name}@*"):
                shutil.rmtree(stale, ignore_errors=True)

    def commit(
        self,
        rows: dict[str, int] | None = None,
        counters: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Manifest:
        manifest = Manifest(
            stage=self.ref.stage,
            corpus=self.ref.corpus,
            snapshot=self.ref.snapshot,
            path=self.ref.uri,
            config_hash=self.config.hash,
            code_version=code_version(),
            rows=dict(rows or {}),
            counters=dict(counters or {}),
            files=checksum_tree(self.path),
            inputs=[upstream.manifest().input_ref() for upstream in self.inputs],
            lineage=self.lineage.to_dict(),
            extra=dict(extra or {}),
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            duration_s=round(time.monotonic() - self._started, 3),
        )
        (self.path / MANIFEST_NAME).write_text(manifest.to_json())
        (self.path / SUCCESS_NAME).write_text("")
        if self.ref.run is None:
            publish(self.path, self.ref.path)
        else:
            # Concurrent runs of one snapshot publish one after the other, so `latest` names the last one.
            with _latest_pointer_lock(self.ref.snapshot_path):
                publish(self.path, self.ref.path)
                point_latest(self.ref.snapshot_path, self.ref.run)
        self.manifest = manifest
        return manifest


def point_latest(snapshot_folder: Path, run: str) -> None:
    """Point ``<snapshot_folder>/latest`` at ``run`` in one rename: a reader finds the old run or the new."""
    temporary = snapshot_folder / f".{LATEST}.tmp-{uuid.uuid4().hex[:8]}"
    os.symlink(run, temporary)
    os.replace(temporary, snapshot_folder / LATEST)


@contextlib.contextmanager
def _latest_pointer_lock(snapshot_folder: Path) -> Iterator[None]:
    """A short blocking lock for publish-then-point, beside the runs' own locks (.lock-<run>)."""
    snapshot_folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path(snapshot_folder / LATEST), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def publish(staging: Path, final: Path) -> None:
    """Put ``staging`` where ``final`` is, so that a reader of ``final`` never sees a partial output.

    The first publish is one rename. A republish swaps the two folders in one atomic step where the system
    can (``swap_folders``), so ``final`` holds the old complete output or the new one at every instant; the
    old one is then deleted (a reader still inside it may find its files gone). Elsewhere the old output is
    renamed aside and the new one into place: between those two renames ``final`` does not exist.
    """
    if not final.exists():
        os.replace(staging, final)
        return
    # Off the staging name first: killed right after the swap, the old output must not be left where the
    # next attempt of a resumable stage would take it for its own unfinished run.
    incoming = _swap_name(final)
    os.replace(staging, incoming)
    if swap_folders(incoming, final):
        outgoing = incoming
    else:
        outgoing = _swap_name(final)
        os.replace(final, outgoing)
        os.replace(incoming, final)
    shutil.rmtree(outgoing, ignore_errors=True)
    # Left by a publish that was killed half-way; nothing reads them.
    for leftover in final.parent.glob(f"{STAGING_PREFIX}{final.name}@{SWAP_TAG}*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _swap_name(final: Path) -> Path:
    return final.parent / f"{STAGING_PREFIX}{final.name}@{SWAP_TAG}{uuid.uuid4().hex[:8]}"


_AT_FDCWD = -100
_RENAME_EXCHANGE = 1 << 1
# What renameat2 answers where the kernel, the C library or the filesystem has no RENAME_EXCHANGE.
_CANNOT_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}


@functools.cache
def _renameat2():
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2  # glibc 2.28+, musl 1.1.20+
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def swap_folders(a: Path, b: Path) -> bool:
    """Exchange two existing paths in one atomic step; False (nothing changed) where the system cannot."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in _CANNOT_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))
