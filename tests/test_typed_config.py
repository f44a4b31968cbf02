"""The config tree is a class the type checker reads: a misspelt key fails `make typecheck`.

mypy runs, with the project's own settings (setup.cfg), on a small file that reads the tree the way stage
code does, one access spelt right and the others misspelt.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import PROJECT_ROOT

PROBE = """\
from pipeline.config import load_config

config = load_config()
steps: int = config.train.steps
batching: str = config.data.batching
layers: int = config.model.gpt().num_hidden_layers
typo = config.train.stpes
section = config.tarin
wrong_type: str = config.train.steps
"""


@pytest.mark.slow
def test_mypy_reports_a_misspelt_key_and_passes_the_right_ones(tmp_path):
    probe = tmp_path / "config_probe.py"
    probe.write_text(textwrap.dedent(PROBE), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(PROJECT_ROOT / "setup.cfg"), str(probe)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    errors = {
        int(match.group(1)): match.group(2)
        for match in re.finditer(r"^.*config_probe\.py:(\d+): error: (.*)$", result.stdout, re.MULTILINE)
    }
    assert result.returncode == 1, result.stdout + result.stderr
    assert set(errors) == {7, 8, 9}, result.stdout  # lines 4-6 read real keys and type-check
    assert '"TrainConfig" has no attribute "stpes"' in errors[7]
    assert '"PipelineConfig" has no attribute "tarin"' in errors[8]
    assert "Incompatible types in assignment" in errors[9]
