"""manifest.json: what a stage wrote, what it kept and dropped, and what it was made from."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MANIFEST_NAME = "manifest.json"
SUCCESS_NAME = "_SUCCESS"
MANIFEST_VERSION = 1


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
        return cls.from_dict(json.loads(Path(path).read_text()))

    def input_ref(self) -> dict[str, Any]:
        """How a downstream manifest refers to this one."""
        return {"stage": self.stage, "snapshot": self.snapshot, "path": self.path, "digest": self.digest}


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


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
