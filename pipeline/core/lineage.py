"""Who ran this: the Airflow DAG run and task, or a manual CLI run."""

from __future__ import annotations

import functools
import os
import re
import subprocess
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from pipeline.core.config import PROJECT_ROOT


@dataclass(frozen=True)
class Lineage:
    dag_id: str | None = None
    run_id: str | None = None
    task_id: str | None = None
    try_number: int | None = None

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Lineage:
        """Airflow exports AIRFLOW_CTX_* into every task process; torchrun children inherit them."""
        env = os.environ if environ is None else environ
        try_number = env.get("AIRFLOW_CTX_TRY_NUMBER")
        return cls(
            dag_id=env.get("AIRFLOW_CTX_DAG_ID"),
            run_id=env.get("AIRFLOW_CTX_DAG_RUN_ID"),
            task_id=env.get("AIRFLOW_CTX_TASK_ID"),
            try_number=int(try_number) if try_number else None,
        )

    def to_dict(self) -> dict[str, str | int | None]:
        return asdict(self)

    def to_env(self) -> dict[str, str]:
        """The inverse of from_env, for handing lineage to a child process."""
        pairs = {
            "AIRFLOW_CTX_DAG_ID": self.dag_id,
            "AIRFLOW_CTX_DAG_RUN_ID": self.run_id,
            "AIRFLOW_CTX_TASK_ID": self.task_id,
            "AIRFLOW_CTX_TRY_NUMBER": None if self.try_number is None else str(self.try_number),
        }
        return {key: value for key, value in pairs.items() if value is not None}

    @property
    def run_folder_name(self) -> str:
        """A filesystem-safe name for this run's log folder."""
        if self.run_id:
            name = f"{self.dag_id or 'dag'}__{self.run_id}"
        else:
            name = "manual__" + os.environ.get("PRETRAIN_RUN_ID", _process_start_stamp())
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


@functools.cache
def _process_start_stamp() -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    # Children (torchrun ranks, Spark workers) should log under the parent's folder.
    os.environ.setdefault("PRETRAIN_RUN_ID", stamp)
    return os.environ["PRETRAIN_RUN_ID"]


@functools.cache
def code_version(project_root: Path = PROJECT_ROOT) -> str:
    """The git commit of the code (with -dirty when modified), or the package version outside git."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=project_root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=project_root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        from importlib.metadata import PackageNotFoundError, version

        try:
            return "pretrain-pipeline==" + version("pretrain-pipeline")
        except PackageNotFoundError:
            return "unknown"
