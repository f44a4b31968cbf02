"""A stage that reads a damaged input refuses it in one line naming the file and the stage to re-run: a
manifest that does not match its _SUCCESS, a file whose size changed (checked before Spark starts), and a
file Spark cannot read (the Spark failure itself, translated)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.storage import DatasetRef
from tests.conftest import make_config

pytestmark = pytest.mark.slow
SNAPSHOT = "damaged"


@pytest.fixture
def clean_copy(sample_corpus, tmp_path) -> tuple[Path, Path]:
    """(data root, clean output) holding a copy of the session's clean output under SNAPSHOT."""
    config, snapshot = sample_corpus
    root = tmp_path / "data"
    target = DatasetRef.of(make_config(root), "clean", SNAPSHOT).path
    shutil.copytree(DatasetRef.of(config, "clean", snapshot).path, target)
    return root, target


def dedup(root: Path) -> subprocess.CompletedProcess:
    settings = [f"project.data_root={root}", "logging.console=false", "tracking.stage_runs=false"]
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "dedup", "--snapshot", SNAPSHOT]
        + [argument for setting in settings for argument in ("--set", setting)],
        capture_output=True,
        text=True,
        timeout=600,
    )


def error_line(result: subprocess.CompletedProcess, spark_ran: bool = False) -> str:
    """The stage's one error line (the last); no traceback of the stage's own. Once Spark ran, its log
    lines may carry a Python worker's traceback (a worker cut off when the task failed), not the stage's."""
    assert result.returncode == 2, result.stderr[-5000:]
    if not spark_ran:
        assert "Traceback" not in result.stderr, result.stderr[-5000:]
    assert "pipeline/cli.py" not in result.stderr, result.stderr[-5000:]  # an uncaught exception's frames
    # Spark's JVM may still log a line or two after it (a task killed as the job ends): find the error line.
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-5000:]
    return errors[0]


def parquet_part(folder: Path) -> Path:
    return max((folder / "documents").glob("*.parquet"), key=lambda p: p.stat().st_size)


def test_a_truncated_parquet_input_is_refused_before_spark_starts(clean_copy):
    """100 bytes cut off a clean output's Parquet file: `pretrain dedup` used to exit 1 after ~250 lines of
    Spark task errors, the file named somewhere in the middle."""
    root, clean = clean_copy
    part = parquet_part(clean)
    size = part.stat().st_size
    part.write_bytes(part.read_bytes()[:-100])
    result = dedup(root)
    line = error_line(result)
    assert str(part) in line and f"expected {size} bytes" in line and f"found {size - 100} bytes" in line
    assert f"`pretrain clean --snapshot {SNAPSHOT}`" in line
    assert len(result.stderr.strip().splitlines()) <= 2  # the data-root line, then the error: no Spark ran


def test_a_parquet_file_spark_cannot_read_is_named_in_the_first_line(clean_copy):
    """Same size, damaged footer: only Spark finds out, and its failure names the file on the error line."""
    root, clean = clean_copy
    part = parquet_part(clean)
    data = bytearray(part.read_bytes())
    data[-4:] = b"XXXX"  # the PAR1 magic closing every Parquet file
    part.write_bytes(bytes(data))
    line = error_line(dedup(root), spark_ran=True)
    assert line.startswith(f"error: {part} (part of clean sample/{SNAPSHOT}) cannot be read: "), line
    assert f"`pretrain clean --snapshot {SNAPSHOT}`" in line


def test_an_edited_manifest_no_longer_matches_its_success_marker(clean_copy):
    root, clean = clean_copy
    manifest = json.loads((clean / "manifest.json").read_text())
    manifest["rows"]["documents"] += 1
    (clean / "manifest.json").write_text(json.dumps(manifest))
    line = error_line(dedup(root))
    assert f"{clean / 'manifest.json'} does not match its _SUCCESS (expected sha256:" in line, line
