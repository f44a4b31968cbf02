"""manifest.json: what a stage wrote, what it kept and dropped, and what it was made from."""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MANIFEST_NAME = "manifest.json"
SUCCESS_NAME = "_SUCCESS"  # holds the sha256 of manifest.json: the two were published together
MANIFEST_VERSION = 1
# How a stage's tracking (pipeline.tracking.mlflow_runs) tells the output it publishes, also in the
# torchrun ranks it starts, which MLflow run records it, or why none does.
ENV_TRACKING_RUN = "PRETRAIN_MLFLOW_RUN_ID"
ENV_TRACKING_ERROR = "PRETRAIN_MLFLOW_ERROR"


class DamagedInputError(ValueError):
    """A file a stage reads does not parse, or does not match the size or digest its producer recorded.

    Reading it again gives the same bytes, so no restart can fix it: the failure is never retried
    (``not_retried``, see pipeline.train.launcher.failures) and the CLI prints it as one line, naming the file, what
    was expected and what was found, and the stage to re-run.
    """

    not_retried = True


@dataclass
class FileEntry:
    bytes: int
    sha256: str


@dataclass
class Manifest:
    stage: str
    corpus: str
    snapshot: str
    path: str
    config_hash: str
    code_version: str
    rows: dict[str, int] = field(default_factory=dict)
    """Row counts per dataset in the output, e.g. {"documents": 812, "excluded": 95}."""
    counters: dict[str, Any] = field(default_factory=dict)
    """Stage counts in datatrove's spirit: {"dropped": {"too_short": 31}, "kept": 812, ...}."""
    files: dict[str, FileEntry] = field(default_factory=dict)
    inputs: list[dict[str, Any]] = field(default_factory=list)
    """One entry per input: stage, snapshot, path and digest of the input's manifest."""
    lineage: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    created_at: str = ""
    duration_s: float = 0.0
    tracking: dict[str, Any] = field(default_factory=dict)
    """The MLflow run recording this output ({"mlflow_run_id": ...}), or why none does ({"error": ...})."""
    version: int = MANIFEST_VERSION

    @property
    def bytes(self) -> int:
        return sum(entry.bytes for entry in self.files.values())

    @property
    def digest(self) -> str:
        """Content digest of the output: stable across re-runs that write the same bytes."""
        summary = sorted((name, entry.sha256) for name, entry in self.files.items())
        return hashlib.sha256(json.dumps(summary).encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["bytes"] = self.bytes
        data["digest"] = self.digest
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        data = {key: value for key, value in data.items() if key not in ("bytes", "digest")}
        data["files"] = {name: FileEntry(**entry) for name, entry in data.get("files", {}).items()}
        return cls(**data)

    @classmethod
    def read(cls, path: str | Path) -> Manifest:
        return cls.parse(Path(path).read_bytes(), path)

    @classmethod
    def parse(cls, data: builtins.bytes, path: str | Path) -> Manifest:
        """The manifest in ``data`` (read from ``path``); DamagedInputError naming the file when it is not one."""
        try:
            return cls.from_dict(json.loads(data.decode("utf-8")))
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            raise DamagedInputError(f"{path} is not a readable manifest ({reason})") from None

    def input_ref(self) -> dict[str, Any]:
        """How a downstream manifest refers to this one."""
        return {"stage": self.stage, "snapshot": self.snapshot, "path": self.path, "digest": self.digest}


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


# A stage's MLflow run may still be starting beside its work (importing MLflow and opening its store take
# seconds): what the manifest records about it waits for the start to settle. Set by the tracking package.
_pending_tracking: list[Callable[[], None]] = []


@contextlib.contextmanager
def pending_tracking(settle: Callable[[], None]) -> Iterator[None]:
    """While the block runs, ``tracking_state`` first calls ``settle``, which must leave the run's id (or
    why there is none) in the environment."""
    _pending_tracking.append(settle)
    try:
        yield
    finally:
        _pending_tracking.remove(settle)


def tracking_state(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What this process's environment says about the stage's MLflow run, for the manifest."""
    for settle in list(_pending_tracking):
        settle()
    env = os.environ if environ is None else environ
    state = {"mlflow_run_id": env.get(ENV_TRACKING_RUN), "error": env.get(ENV_TRACKING_ERROR)}
    return {key: value for key, value in state.items() if value}


def success_marker(manifest_json: bytes) -> str:
    """What ``_SUCCESS`` holds for this manifest.json: its sha256, so a reader can tell the manifest it finds
    is the one that was published (not cut short, not edited)."""
    return f"sha256:{hashlib.sha256(manifest_json).hexdigest()}\n"


def write_published(folder: Path, manifest: Manifest) -> None:
    """``manifest.json``, then ``_SUCCESS`` holding its digest: the last two files of a published output."""
    data = manifest.to_json().encode("utf-8")
    (folder / MANIFEST_NAME).write_bytes(data)
    (folder / SUCCESS_NAME).write_text(success_marker(data))


def read_published(folder: Path) -> Manifest:
    """``folder``'s manifest, checked against its ``_SUCCESS``; DamagedInputError naming the file otherwise.

    An empty ``_SUCCESS`` was written before it held the digest: only the parse is checked then.
    """
    path = folder / MANIFEST_NAME
    data = path.read_bytes()
    marker = (folder / SUCCESS_NAME).read_text(encoding="utf-8", errors="replace").strip()
    if marker:
        actual = success_marker(data).strip()
        if marker != actual:
            raise DamagedInputError(
                f"{path} does not match its {SUCCESS_NAME} (expected {marker}, found {actual}): the manifest "
                "changed after it was published"
            )
    return Manifest.parse(data, path)


def verify_files(
    folder: Path, manifest: Manifest, checksums: bool = False, names: Iterable[str] | None = None
) -> None:
    """Every file the manifest lists (or those of ``names``) is in ``folder`` with its recorded size (and
    sha256 when ``checksums``); DamagedInputError naming the first that is not. Sizes cost a stat per file,
    so they are always checked."""
    for relative in manifest.files if names is None else names:
        entry = manifest.files.get(relative)
        if entry is None:
            raise DamagedInputError(f"{folder / relative} is not among the files its manifest lists")
        path = folder / relative
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise DamagedInputError(f"{path} is missing (its manifest lists {entry.bytes} bytes)") from None
        if size != entry.bytes or (checksums and sha256_file(path) != entry.sha256):
            raise DamagedInputError(
                f"{path} was changed after it was published: expected {entry.bytes} bytes, sha256 "
                f"{entry.sha256}; found {size} bytes, sha256 {sha256_file(path)}"
            )


def checksum_tree(folder: Path) -> dict[str, FileEntry]:
    """Checksums for every data file under folder, by relative path; bookkeeping files excluded."""
    entries = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder).as_posix()
        if path.name in (MANIFEST_NAME, SUCCESS_NAME):
            continue
        entries[relative] = FileEntry(bytes=path.stat().st_size, sha256=sha256_file(path))
    return entries


def upstream_manifests(manifest: Manifest) -> list[Manifest]:
    """Every manifest this one was made from, nearest first, by walking input references back to the crawl
    (train -> tokenize -> dedup -> clean -> crawl)."""
    chain, frontier = [], list(manifest.inputs)
    while frontier:
        ref = frontier.pop(0)
        path = Path(ref["path"]) / MANIFEST_NAME
        if path.is_file():
            upstream = Manifest.read(path)
            chain.append(upstream)
            frontier.extend(upstream.inputs)
    return chain
