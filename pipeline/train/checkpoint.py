"""Checkpoints written atomically (temp file, fsync, rename) and loaded with weights_only=True."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)
_STEP_FILE = re.compile(r"^step-(\d+)\.pt$")


class Checkpointer:
    def __init__(self, folder: Path, keep_last: int = 3) -> None:
        self.folder = Path(folder)
        self.keep_last = keep_last

    def path_for(self, step: int) -> Path:
        return self.folder / f"step-{step:06d}.pt"

    def steps(self) -> list[int]:
        if not self.folder.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.folder.iterdir() if (m := _STEP_FILE.match(p.name)))

    def save(self, step: int, state: dict[str, Any]) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        target = self.path_for(step)
        temporary = target.with_suffix(".pt.tmp")
        with open(temporary, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
        for old in self.steps()[: -self.keep_last]:
            self.path_for(old).unlink(missing_ok=True)
        return target

    def load_latest(self) -> tuple[int, dict[str, Any]] | None:
        """The newest checkpoint that loads; a corrupt one is skipped with a warning."""
        for step in reversed(self.steps()):
            path = self.path_for(step)
            try:
                return step, torch.load(path, map_location="cpu", weights_only=True)
            except Exception as exc:  # a torn or corrupt file: fall back to the previous one
                log.warning("checkpoint %s is unreadable (%s); trying the previous one", path, exc)
        return None
