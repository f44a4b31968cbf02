"""Who ran this: the Airflow DAG run and task, or a manual CLI run."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import resources
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


BUILD_INFO = "build_info.json"  # in this package, written by setup.py when a wheel is built


def _git_revision(checkout: Path) -> str | None:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=checkout,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("-dirty" if dirty else "")


@functools.cache
def code_version(project_root: Path = PROJECT_ROOT) -> str:
    """What code made an output: the checkout's git commit (with -dirty when modified) when the code runs from a
    checkout; an installed wheel's, the revision recorded when it was built, with its version; else the
    installed distribution's version."""
    if (project_root / ".git").exists():  # not git's search upwards: a venv inside a checkout is no checkout
        revision = _git_revision(project_root)
        if revision:
            return revision
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = "pretrain-pipeline==" + version("pretrain-pipeline")
    except PackageNotFoundError:
        installed = "unknown"
    info = resources.files("pipeline.core") / BUILD_INFO
    if info.is_file():
        revision = json.loads(info.read_text()).get("git_revision")
        if revision:
            return f"{revision} ({installed})"
    return installed
