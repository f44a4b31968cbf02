"""A failure no restart can fix fails the job once, with the one-line reason on top (issue 17, item 13):
a rank that meets one records it and stops its torchrun agent, and the launcher leads with the reason."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.core.config import ConfigError
from pipeline.core.proc import ChildFailedError
from pipeline.core.storage import DatasetRef, MissingInputError
from pipeline.model.checkpoint import CheckpointError
from pipeline.train.launcher.failures import (
    EXIT_NOT_RETRIED,
    FailureRecord,
    TrainingFailed,
    failure_summary,
    is_deterministic,
    read_failures,
)
from tests.train.support import (
    finish,
    pretrain_train,
    start,
    torchrun,
    train_config,
    write_config,
    write_token_corpus,
)

SNAPSHOT = "failures"


@pytest.mark.parametrize(
    ("error", "deterministic"),
    [
        (PermissionError(errno.EACCES, "Permission denied", "ckpt"), True),
        (PermissionError(errno.EPERM, "Operation not permitted", "ckpt"), True),
        (OSError(errno.EROFS, "Read-only file system"), True),
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (FileExistsError(errno.EEXIST, "File exists"), True),
        (ConfigError("train.lr: must be positive"), True),
        (MissingInputError("no complete tokenize output"), True),
        (CheckpointError("trained with other settings"), True),
        (OSError(errno.EIO, "Input/output error"), False),
        (RuntimeError("Connection closed by peer"), False),
        (MemoryError(), False),
    ],
)
def test_which_failures_a_restart_cannot_fix(error, deterministic):
    assert is_deterministic(error) is deterministic


def record(rank: int, error: str, deterministic: bool, at: str, attempt: int = 0) -> FailureRecord:
    return FailureRecord(rank, attempt, error, deterministic, at, "Traceback ...")


def test_the_summary_leads_with_the_reason_no_restart_can_fix_in_one_line():
    failed = ChildFailedError(["torchrun"], 143)
    records = [
        record(1, "RuntimeError: Connection closed by peer", False, "2026-12-01T10:00:00.000001"),
        record(
            0, "PermissionError: [Errno 13] Permission denied: '/ckpt'", True, "2026-12-01T10:00:00.000002"
        ),
    ]
    summary = failure_summary(failed, records, "run r1 resumes from step 3")
    assert (
        isinstance(summary, TrainingFailed)
        and isinstance(summary, ChildFailedError)
        and summary.deterministic
    )
    assert str(summary).startswith(
        "rank 0: PermissionError: [Errno 13] Permission denied: '/ckpt' (not retried"
    )
    assert "\n" not in str(summary) and str(summary).endswith("run r1 resumes from step 3")
    later = failure_summary(failed, [record(1, "RuntimeError: boom", False, "t", attempt=2)], "run r1 ...")
    assert (
        not later.deterministic
        and "after 2 restart(s)" in str(later)
        and "rank 1: RuntimeError: boom" in str(later)
    )


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """``folder`` refuses new files: chmod for a normal user, the immutable flag for root (whom modes do
    not stop)."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
        try:
            yield
        finally:
            folder.chmod(stat.S_IRWXU)
        return
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("running as root on a filesystem without the immutable flag: no read-only folder to test")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(folder)], check=True)


@pytest.mark.slow
def test_a_read_only_checkpoint_folder_fails_once_with_the_reason_on_top(tmp_path):
    config = train_config(tmp_path / "data", "train.nproc_per_node=2", "train.max_restarts=3")
    write_token_corpus(config, SNAPSHOT)
    path = write_config(config, tmp_path / "config.yaml")
    staging = DatasetRef.of(config, "train", SNAPSHOT, run="ro").staging_path(resumable=True)

    with read_only(staging / "checkpoints"):
        launcher = start(pretrain_train(path, SNAPSHOT, "train.run_id=ro"))
        output = finish(launcher, expect_success=False)

    assert launcher.returncode == EXIT_NOT_RETRIED, output[-5000:]
    last = output.strip().splitlines()[-1]
    assert last.startswith("error: rank 0: PermissionError: [Errno "), output[-5000:]
    assert "checkpoints" in last and "not retried" in last and "run ro starts over" in last
    assert "Traceback" not in output, output[-5000:]  # the tracebacks are in the records
    # One attempt: the rank stopped its agent, which restarted nothing (max_restarts=3).
    (failures,) = (tmp_path / "data" / "_runs").glob(f"*/train-{SNAPSHOT}-ro-failures")
    records = read_failures(failures)
    assert {r.attempt for r in records} == {0} and records[0].deterministic
    assert "Traceback" in records[0].traceback and "PermissionError" in records[0].traceback
    assert len(rank0_messages(tmp_path, "training tiny")) == 1


def rank0_messages(tmp_path: Path, prefix: str) -> list[str]:
    """Rank 0's ECS log messages (every attempt's) that start with ``prefix``."""
    return [
        message
        for log_file in (tmp_path / "data" / "_runs").glob("*/logs/train-rank0-*.ecs.json")
        for line in log_file.read_text().splitlines()
        if (message := json.loads(line)["message"]).startswith(prefix)
    ]


@pytest.mark.slow
def test_under_torchrun_alone_the_rank_still_stops_its_agent_instead_of_a_restart(tmp_path):
    """As in a Kubernetes pod: no launcher reads records; the rank logs the traceback, and no restart runs."""
    config = train_config(tmp_path / "data").with_run("ro")
    write_token_corpus(config, SNAPSHOT)
    path = write_config(config, tmp_path / "config.yaml")
    staging = DatasetRef.of(config, "train", SNAPSHOT).staging_path(resumable=True)

    with read_only(staging / "checkpoints"):
        agent = torchrun(
            ["--standalone", "--nproc-per-node=2", "--max-restarts=3"], path, SNAPSHOT, run_id="ro"
        )
        output = finish(agent, expect_success=False)

    assert agent.returncode != 0 and "Received 15 death signal" in output, output[-5000:]
    assert len(rank0_messages(tmp_path, "training tiny")) == 1  # one attempt of the four allowed
    (stopped,) = rank0_messages(tmp_path, "rank 0: PermissionError")
    assert "a restart cannot fix this" in stopped
    assert rank0_messages(tmp_path, "Traceback (most recent call last)")  # in the log, with no launcher


def zero_bytes(path: Path, offset: int, count: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(bytes(count))


def cut_in_half(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("damage", "where", "expected"),
    [
        # 512 bytes zeroed: still valid ids, so it trained on them and published.
        (
            lambda p: zero_bytes(p, 0, 512),
            "train/shard-00000-0000.bin",
            "does not match the tokenize manifest",
        ),
        # A changed .idx: ShardFormatError, and three restarts.
        (
            lambda p: zero_bytes(p, 40, 8),
            "train/shard-00001-0000.idx",
            "does not match the tokenize manifest",
        ),
    ],
)
def test_a_damaged_token_shard_fails_the_training_once_naming_the_file(tmp_path, damage, where, expected):
    config = train_config(tmp_path / "data", "train.nproc_per_node=2", "train.max_restarts=3")
    tokens = write_token_corpus(config, SNAPSHOT)
    damage(tokens.path / where)
    path = write_config(config, tmp_path / "config.yaml")

    launcher = start(pretrain_train(path, SNAPSHOT, "train.run_id=damaged"))
    output = finish(launcher, expect_success=False)

    assert launcher.returncode == EXIT_NOT_RETRIED, output[-5000:]
    last = output.strip().splitlines()[-1]
    assert last.startswith("error: rank ") and "DamagedInputError" in last and expected in last, last
    assert str(tokens.path / where) in last and "not retried" in last and "expected sha256" in last
    assert "Traceback" not in output
    (failures,) = (tmp_path / "data" / "_runs").glob(f"*/train-{SNAPSHOT}-damaged-failures")
    assert {record.attempt for record in read_failures(failures)} == {0}  # one attempt of the four allowed
    assert not DatasetRef.of(config, "train", SNAPSHOT, run="damaged").is_complete()


@pytest.mark.slow
def test_a_token_id_beyond_the_vocabulary_fails_once_before_the_first_step(tmp_path):
    """It used to end in `IndexError: index out of range in self` inside the model, after 3 restarts,
    90 s and 241 lines. Here the manifest (as its producer could have written it) names a smaller
    vocabulary than the ids in the shards."""
    from pipeline.core.manifest import write_published

    config = train_config(tmp_path / "data", "train.nproc_per_node=2", "train.max_restarts=3")
    tokens = write_token_corpus(config, SNAPSHOT)
    manifest = tokens.manifest()
    manifest.extra["vocab_size"] = 200  # the corpus' tokenizer has 320 ids
    write_published(tokens.path, manifest)
    path = write_config(config, tmp_path / "config.yaml")

    launcher = start(pretrain_train(path, SNAPSHOT, "train.run_id=vocab"))
    output = finish(launcher, expect_success=False)

    assert launcher.returncode == EXIT_NOT_RETRIED, output[-5000:]
    last = output.strip().splitlines()[-1]
    assert "is outside the vocabulary of 200 ids" in last and "not retried" in last, last
    (failures,) = (tmp_path / "data" / "_runs").glob(f"*/train-{SNAPSHOT}-vocab-failures")
    assert {record.attempt for record in read_failures(failures)} == {0}
    assert not rank0_messages(tmp_path, "step ")  # no step ran


@pytest.mark.slow
def test_a_manifest_cut_in_half_is_one_line_before_torchrun_starts(tmp_path):
    """A JSONDecodeError used to go through 3 restarts."""
    config = train_config(tmp_path / "data", "train.nproc_per_node=2", "train.max_restarts=3")
    tokens = write_token_corpus(config, SNAPSHOT)
    cut_in_half(tokens.path / "manifest.json")
    path = write_config(config, tmp_path / "config.yaml")

    launcher = start(pretrain_train(path, SNAPSHOT))
    output = finish(launcher, expect_success=False)

    assert launcher.returncode == EXIT_NOT_RETRIED, output[-5000:]
    assert output.strip().splitlines()[-1] == output.strip().splitlines()[-1].split("\n")[0]
    last = output.strip().splitlines()[-1]
    assert last.startswith("error: ") and str(tokens.path / "manifest.json") in last, output[-3000:]
    assert "does not match its _SUCCESS" in last and f"pretrain tokenize --snapshot {SNAPSHOT}" in last
    assert "Traceback" not in output and not list((tmp_path / "data" / "_runs").glob("*/train-*-failures"))
