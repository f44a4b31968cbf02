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


def pretrain(*args: str | bytes, root=None) -> subprocess.CompletedProcess:
    """`pretrain ...` in a child process (bytes arguments pass invalid UTF-8 as a shell would)."""
    extra = ["--set", f"project.data_root={root}"] if root is not None else []
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args, *extra],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=300,
    )


def assert_one_line_exit_2(result: subprocess.CompletedProcess, *expected: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("error: ") and "Traceback" not in result.stderr
    for text in expected:
        assert text in lines[0], lines[0]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (["--temperature", "-0.5"], "argument --temperature: -0.5 is outside [0.0, inf]"),
        (["--temperature", "nan"], "'nan' is not a finite number"),
        (["--temperature", "1e-40"], "use 0 to decode greedily"),
        (["--top-p", "0"], "argument --top-p: 0 is outside (0.0, 1.0]"),
        (["--top-p", "1.5"], "1.5 is outside (0.0, 1.0]"),
        (["--top-k", "0"], "argument --top-k: 0 is outside [1, inf]"),
        (["--top-k", "2.5"], "'2.5' is not an integer"),
        (["--max-tokens", "-1"], "argument --max-tokens"),
        ([b"--prompt", b"caf\xe9 au lait"], "argument --prompt: 'caf\\\\udce9 au lait' is not valid UTF-8"),
    ],
)
def test_generate_checks_its_sampling_arguments_at_parse_time(tmp_path, arguments, expected):
    """A negative temperature, top_p 0 or 1.5, top_k 0 and a prompt that is not text used to end in
    tracebacks (ValueError, `probability tensor contains inf/nan`, TypeError) after loading the model."""
    prompt = [] if b"--prompt" in arguments else ["--prompt", "The"]
    result = pretrain("generate", "--snapshot", "none", *prompt, *arguments, root=tmp_path)
    assert_one_line_exit_2(result, "pretrain generate", expected)


@pytest.mark.parametrize("command", ["clean", "ship-logs", "tensorboard", "config", "train"])
def test_every_command_answers_a_bad_argument_with_one_line(command):
    assert_one_line_exit_2(pretrain(command, "--no-such-option"), "unrecognized arguments: --no-such-option")


@pytest.mark.parametrize("stage", ["../../../outside", "/etc", "clean/../../x", "nosuchstage"])
def test_input_stage_takes_registered_stage_names_only(tmp_path, stage):
    """`pretrain clean --input-stage ../../../outside` read a folder outside the data root and published
    from it; `--input-stage /etc` resolved to /etc/<snapshot>."""
    outside = tmp_path / "outside" / "s1"
    outside.mkdir(parents=True)
    result = pretrain("clean", "--snapshot", "s1", "--input-stage", stage, root=tmp_path / "data")
    assert_one_line_exit_2(result, "argument --input-stage: invalid choice")
    assert not (tmp_path / "data").exists()


def test_a_path_built_from_names_stays_under_the_data_root(tmp_path):
    from pipeline.core.config import ConfigError
    from pipeline.core.storage import DatasetRef, path_under

    for stage in ("../../../outside", "/etc", "..", "a/b"):
        with pytest.raises(ConfigError, match="stage"):
            DatasetRef(str(tmp_path), "sample", stage, "s1")
    with pytest.raises(ConfigError, match="leads outside"):
        path_under(tmp_path, "mlartifacts", "../../etc")
    assert path_under(tmp_path, "a", "b") == tmp_path / "a" / "b"


@pytest.mark.parametrize("data_root", ["/proc/self/pretrain", "{file}/data"])
def test_an_unusable_data_root_is_one_line(tmp_path, data_root):
    (tmp_path / "file").write_text("not a folder")
    result = pretrain("clean", "--snapshot", "s1", root=data_root.format(file=tmp_path / "file"))
    assert_one_line_exit_2(result, "project.data_root")
