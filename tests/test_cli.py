import subprocess
import sys

import pytest

from pipeline.cli import COMMANDS, main


def test_top_level_help_lists_every_stage(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("crawl", "clean", "tokenize", "train", "report", "demo"):
        assert command in out and command in COMMANDS


@pytest.mark.parametrize("command", sorted(set(COMMANDS) - {"demo", "ship-logs"}))  # ship-logs: not a stage
def test_each_stage_has_helpful_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--snapshot" in out and "--set" in out


def test_bad_config_is_one_clear_line_and_exit_2():
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "config", "--set", "train.steps=-3"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: invalid config")
    assert "train.steps" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_command_is_rejected():
    with pytest.raises(SystemExit) as exit_info:
        main(["frobnicate"])
    assert exit_info.value.code == 2
