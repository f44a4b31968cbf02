"""The storage contract: ``<root>/<corpus>/<stage>/<snapshot>/``, published atomically.

A stage writes into a hidden staging folder next to its final place. On success it writes
``manifest.json`` and ``_SUCCESS`` into the staging folder and renames it into place, so a
reader either sees the previous complete output or the new complete output, never a half-written one.
A re-run of the same snapshot replaces the old output the same way.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline.core.config import ConfigError, CoreConfig
from pipeline.core.lineage import Lineage, code_version
from pipeline.core.manifest import MANIFEST_NAME, SUCCESS_NAME, Manifest, checksum_tree

SNAPSHOT_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
STAGING_PREFIX = ".staging-"


class MissingInputError(FileNotFoundError):
    """An upstream stage's output is absent or incomplete."""


class StageFailure(RuntimeError):
    """A stage ran and its result cannot be published (for example a crawl that stored no page); the
    message says why and what to change. The CLI prints it as one line."""


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


@dataclass(frozen=True)
class DatasetRef:
    """Where one stage's output for one snapshot lives."""

    root: str
    corpus: str
    stage: str
    snapshot: str

    def __post_init__(self) -> None:
        validate_snapshot(self.snapshot)

    @classmethod
    def of(cls, config: CoreConfig, stage: str, snapshot: str) -> DatasetRef:
        return cls(config.project.data_root, config.project.corpus, stage, snapshot)

    @property
    def path(self) -> Path:
        return local_path(self.root) / self.corpus / self.stage / self.snapshot

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
            raise MissingInputError(
                f"no complete {self.stage} output for snapshot {self.snapshot!r} at {self.path}; "
                f"run `pretrain {self.stage} --snapshot {self.snapshot}` first"
            )
        return self


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
        inputs: list[DatasetRef] = (),
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
        self._started = 0.0
        suffix = "resume" if resumable else uuid.uuid4().hex[:8]
        self.path = ref.path.parent / f"{STAGING_PREFIX}{ref.snapshot}@{suffix}"

    def __enter__(self) -> StageOutput:
        for upstream in self.inputs:
            upstream.require()
        if not self.resumable:
            self._remove_stale_staging()
        self.path.mkdir(parents=True, exist_ok=self.resumable)
        self._started = time.monotonic()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.manifest is None:
            if not self.resumable:
                shutil.rmtree(self.path, ignore_errors=True)
            if exc_type is None:
                raise RuntimeError(
                    f"{self.ref.stage}: output block ended without commit(); nothing was published"
                )

    def _remove_stale_staging(self) -> None:
        """A killed earlier attempt leaves its staging folder behind; it was never visible, so drop it."""
        parent = self.ref.path.parent
        if parent.is_dir():
            for stale in parent.glob(f"{STAGING_PREFIX}{self.ref.snapshot}@*"):
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
        publish(self.path, self.ref.path)
        self.manifest = manifest
        return manifest


def publish(staging: Path, final: Path) -> None:
    """Swap staging into final. Each rename is atomic; readers check _SUCCESS before reading."""
    retired = final.parent / f".retired-{final.name}-{uuid.uuid4().hex[:8]}"
    if final.exists():
        os.replace(final, retired)
    os.replace(staging, final)
    shutil.rmtree(retired, ignore_errors=True)
