"""The suite's own housekeeping (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def test_a_session_leaves_no_airflow_home_behind(tmp_path: Path) -> None:
    """Each session makes a private AIRFLOW_HOME (a metadata database, task logs): it is removed when the
    session ends, so runs do not pile up folders in the temp directory."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    environ = {**os.environ, "TMPDIR": str(scratch)}
    finished = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--collect-only",
            "tests/test_stages.py",
        ],
        cwd=PROJECT_ROOT,
        env=environ,
        capture_output=True,
        text=True,
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "test_" in finished.stdout  # the session did collect, so the conftest did run
    assert list(scratch.glob("pretrain-airflow-home-*")) == []
