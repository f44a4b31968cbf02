"""Stop and resume in one process: SIGTERM checkpoints, bit-exact continuation, corrupt-checkpoint fallback."""

from __future__ import annotations

import fcntl
import json
import logging
import os

import pytest
import torch

from pipeline.core.locks import lock_path
from pipeline.core.storage import DatasetRef
from pipeline.model.checkpoint import Checkpointer, CheckpointError
from pipeline.train.fault_injection import ENV_FAULT
from pipeline.train.launcher.runs import RunRecord, decide_run, run_ref
from pipeline.train.trainer import Trainer, TrainingStopped, train
from tests.train.support import losses, single_process, train_config, unfinished_run, write_token_corpus

SNAPSHOT = "resume"
# fp16 with a loss scaler, two micro-batches and dropout: every piece of state a resume must restore matters.
SETTINGS = (
    "train.steps=9",
    "train.grad_accum=2",
    "train.precision=fp16",
    "model.overrides={dropout: 0.1}",
)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    root = tmp_path_factory.mktemp("uninterrupted")
    config = single_process(train_config(root / "data", *SETTINGS), root)
    write_token_corpus(config, SNAPSHOT)
    manifest = train(config, SNAPSHOT)
    output = DatasetRef.of(config, "train", SNAPSHOT).path
    final = Checkpointer(output / "checkpoints").load(9)
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    # fp16: the GradScaler's scale is logged every step, next to the count of skipped steps.
    assert all(row["loss_scale"] > 0 and row["skipped_steps"] >= 0 for row in rows)
    assert rows[-1]["loss_scale"] == final["precision"]["scaler"]["scale"]
    return losses(config, SNAPSHOT), final, manifest


def checkpoints_of(config) -> Checkpointer:
    return Checkpointer(unfinished_run(config, SNAPSHOT) / "checkpoints")


def stop_at(config, step: int, monkeypatch) -> TrainingStopped:
    """Run until the fault injector sends this process SIGTERM after ``step``."""
    monkeypatch.setenv(ENV_FAULT, f"SIGTERM@{step}")
    with pytest.raises(TrainingStopped) as stopped:
        train(config, SNAPSHOT)
    monkeypatch.delenv(ENV_FAULT)
    return stopped.value


def assert_same_run(resumed_config, uninterrupted) -> None:
    expected_losses, expected_final, expected_manifest = uninterrupted
    manifest = train(resumed_config, SNAPSHOT)
    assert losses(resumed_config, SNAPSHOT) == expected_losses  # exact float equality, every step
    final = Checkpointer(DatasetRef.of(resumed_config, "train", SNAPSHOT).path / "checkpoints").load(9)
    for name, tensor in expected_final["model"].items():
        assert torch.equal(final["model"][name], tensor), name
    assert final["precision"] == expected_final["precision"]
    assert manifest.extra["val_loss"] == expected_manifest.extra["val_loss"]


def test_sigterm_checkpoints_and_resume_repeats_the_uninterrupted_run_bit_for_bit(
    uninterrupted, tmp_path, monkeypatch
):
    config = single_process(train_config(tmp_path / "data", *SETTINGS), tmp_path)
    write_token_corpus(config, SNAPSHOT)

    stopped = stop_at(config, 5, monkeypatch)

    assert stopped.step == 5
    assert checkpoints_of(config).steps() == [3, 5]  # every 3 steps, and on SIGTERM
    state = checkpoints_of(config).load(5)
    assert state["train_state"]["step"] == 5 and state["dataloader"]["position"] == 5 * 2 * 4
    assert not DatasetRef.of(config, "train", SNAPSHOT).is_complete()  # nothing published yet
    assert losses(config, SNAPSHOT, staging=True) == uninterrupted[0][:5]
    # The stopped run is not locked for the rest of this process's life, so a launch from here can resume it
    # (the trainer kept its output's lock after a stop until a test resuming in torchrun ran into it).
    stopped_run = run_ref(config, SNAPSHOT, RunRecord.read(unfinished_run(config, SNAPSHOT)).run_id)
    assert not locked(lock_path(stopped_run.path))
    assert_same_run(single_process(config, tmp_path), uninterrupted)


def locked(lock_file) -> bool:
    """Whether a writer holds ``lock_file`` (this process included: flock belongs to the open file)."""
    fd = os.open(lock_file, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_torn_last_metrics_line_is_dropped_and_the_run_resumes(uninterrupted, tmp_path, monkeypatch):
    """Killed mid-write, the metrics file ends in half a line; it used to fail every resume with a
    JSONDecodeError although the checkpoint was fine."""
    config = single_process(train_config(tmp_path / "data", *SETTINGS), tmp_path)
    write_token_corpus(config, SNAPSHOT)
    stop_at(config, 5, monkeypatch)
    metrics = checkpoints_of(config).folder.parent / "metrics.jsonl"
    with metrics.open("ab") as handle:  # cut inside a two-byte character, as a kill can leave it
        handle.write('{"step": 6, "loss": 1.25, "note": "\u00e9'.encode()[:-1])

    assert_same_run(single_process(config, tmp_path), uninterrupted)


def test_corrupt_newest_checkpoint_is_skipped_for_the_previous_one(
    uninterrupted, tmp_path, monkeypatch, caplog
):
    config = single_process(train_config(tmp_path / "data", *SETTINGS), tmp_path)
    write_token_corpus(config, SNAPSHOT)
    stop_at(config, 7, monkeypatch)
    checkpoints = checkpoints_of(config)
    assert checkpoints.steps() == [3, 6, 7]
    newest = checkpoints.path_for(7)
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit pattern in the middle: the checksum must catch it
    newest.write_bytes(bytes(data))

    config = single_process(config, tmp_path)
    with caplog.at_level(logging.WARNING, logger="pipeline.model.checkpoint"):
        trainer = Trainer(config.with_run(decide_run(config, SNAPSHOT)), SNAPSHOT)
    assert trainer.step == 6
    assert "does not match its checksum" in caplog.text
    trainer.run()
    expected_losses = uninterrupted[0]
    assert losses(config, SNAPSHOT) == expected_losses


def test_other_settings_start_a_new_run_and_resuming_the_old_one_with_them_is_refused(tmp_path, monkeypatch):
    config = single_process(train_config(tmp_path / "data", *SETTINGS), tmp_path)
    write_token_corpus(config, SNAPSHOT)
    stop_at(config, 2, monkeypatch)
    stopped = unfinished_run(config, SNAPSHOT)
    stopped_run = RunRecord.read(stopped).run_id

    # Another learning rate is another run (a sweep): the stopped one is left for its own settings.
    changed = single_process(train_config(tmp_path / "data", *SETTINGS, "train.lr=0.01"), tmp_path)
    other = train(changed, SNAPSHOT)
    assert other.rows["steps"] == 9 and other.extra["run_id"] != stopped_run
    assert unfinished_run(config, SNAPSHOT) == stopped

    # Naming the stopped run with the other learning rate is refused, saying what differs.
    named = single_process(
        train_config(tmp_path / "data", *SETTINGS, "train.lr=0.01", f"train.run_id={stopped_run}"), tmp_path
    )
    with pytest.raises(CheckpointError, match=r"train\.lr: checkpoint 0\.003, this run 0\.01"):
        train(named, SNAPSHOT)
    # train.resume=false starts the named run over.
    fresh = single_process(
        train_config(
            tmp_path / "data", *SETTINGS, "train.lr=0.01", f"train.run_id={stopped_run}", "train.resume=false"
        ),
        tmp_path,
    )
    assert train(fresh, SNAPSHOT).extra["run_id"] == stopped_run
