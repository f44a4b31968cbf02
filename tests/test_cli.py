import subprocess
import sys

import pytest

from pipeline.cli import COMMANDS, main


def test_top_level_help_lists_every_stage(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("crawl", "clean", "tokenize", "train", "report", "demo"):
        assert command in out and command in COMMANDS


# ship-logs and tokenizer: not stages (no snapshot); tokenizer's subcommands take --set (tests/tokenization)
@pytest.mark.parametrize("command", sorted(set(COMMANDS) - {"demo", "ship-logs", "tokenizer"}))
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


def test_a_missing_input_fails_at_once_before_spark_or_mlflow_start(tmp_path):
    """`pretrain tokenize --snapshot nope` used to take 18-30 s and leave a FAILED MLflow run behind."""
    root = tmp_path / "data"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            "tokenize",
            "--snapshot",
            "nope",
            "--set",
            f"project.data_root={root}",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].startswith(
        "error: no complete decontaminate output for snapshot 'nope'"
    )
    assert "Traceback" not in result.stderr
    assert not (root / "mlflow.db").exists() and not (root / "_runs").exists()


def test_a_reader_that_goes_away_ends_the_output_quietly():
    """`pretrain config | head` printed a BrokenPipeError traceback."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "config"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.stdout.close()  # the reader is gone before the first line is written
    _, stderr = process.communicate(timeout=120)
    assert b"Traceback" not in stderr and b"BrokenPipeError" not in stderr, stderr.decode()
    assert process.returncode == 141
