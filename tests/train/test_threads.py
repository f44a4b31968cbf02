"""CPU threads per rank: what the launcher hands torchrun, and what each rank sets torch to."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from pipeline.core.config import ConfigError
from pipeline.core.storage import DatasetRef
from pipeline.train.launcher import launch
from pipeline.train.launcher.launch import child_environment
from pipeline.train.threads import set_rank_threads
from tests.train.support import single_process, train_config, write_token_corpus

SNAPSHOT = "threads"


@pytest.fixture
def cores(monkeypatch):
    """This process may run on ``cores(n)`` CPUs of a 64-CPU host; OMP_NUM_THREADS unset (conftest sets 1)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)

    def usable(count: int) -> None:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(count)), raising=False)

    usable(2)
    return usable


@pytest.fixture
def torch_threads():
    """Give the test process its torch thread count back after a test that changes it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def train_settings(tmp_path, *overrides):
    return train_config(tmp_path / "data", *overrides).train


def test_one_process_on_two_usable_cores_gets_both(tmp_path, cores, caplog):
    with caplog.at_level(logging.INFO, logger="pipeline.train.launcher.launch"):
        env = child_environment(train_settings(tmp_path, "train.nproc_per_node=1"))
    assert env["OMP_NUM_THREADS"] == "2"
    assert caplog.text.count("2 thread(s) per rank (2 usable core(s) / 1 rank(s) on this node)") == 1


def test_two_processes_on_two_usable_cores_get_one_each_set_explicitly(tmp_path, cores):
    assert child_environment(train_settings(tmp_path, "train.nproc_per_node=2"))["OMP_NUM_THREADS"] == "1"
    # torchrun would set 1 by itself here; with 4 cores it must not get the chance.
    cores(4)
    assert child_environment(train_settings(tmp_path, "train.nproc_per_node=2"))["OMP_NUM_THREADS"] == "2"
    cores(3)
    assert child_environment(train_settings(tmp_path, "train.nproc_per_node=4"))["OMP_NUM_THREADS"] == "1"


def test_a_preset_omp_num_threads_is_kept(tmp_path, cores, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert child_environment(train_settings(tmp_path, "train.nproc_per_node=1"))["OMP_NUM_THREADS"] == "3"
    monkeypatch.setenv("OMP_NUM_THREADS", "2,1")  # OpenMP's per-nesting-level list passes through as it is
    assert child_environment(train_settings(tmp_path, "train.nproc_per_node=2"))["OMP_NUM_THREADS"] == "2,1"


def test_train_threads_per_rank_overrides_cores_and_environment(tmp_path, cores, monkeypatch):
    settings = train_settings(tmp_path, "train.nproc_per_node=2", "train.threads_per_rank=3")
    assert child_environment(settings)["OMP_NUM_THREADS"] == "3"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert child_environment(settings)["OMP_NUM_THREADS"] == "3"


def test_a_malformed_omp_num_threads_fails_naming_it(tmp_path, cores, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "many")
    with pytest.raises(ConfigError, match="OMP_NUM_THREADS='many'"):
        child_environment(train_settings(tmp_path, "train.nproc_per_node=1"))
    with pytest.raises(ConfigError):
        train_settings(tmp_path, "train.threads_per_rank=0")


def test_the_stage_launches_torchrun_with_that_environment(tmp_path, cores, monkeypatch):
    config = train_config(tmp_path / "data", "train.nproc_per_node=1")
    write_token_corpus(config, SNAPSHOT, documents=60)
    launched = {}

    def fake_run_streaming(command, *, env, on_line, **options):  # on_start, die_with_parent, ...: unused
        launched.update(command=command, env=env)

    monkeypatch.setattr(launch, "run_streaming", fake_run_streaming)
    real_manifest = DatasetRef.manifest  # the fake torchrun published no training output
    monkeypatch.setattr(
        DatasetRef, "manifest", lambda self: None if self.stage == "train" else real_manifest(self)
    )
    launch.run(
        config, [DatasetRef.of(config, "tokenize", SNAPSHOT)], DatasetRef.of(config, "train", SNAPSHOT)
    )
    assert "--nproc-per-node=1" in launched["command"]
    assert launched["env"]["OMP_NUM_THREADS"] == "2"


def test_a_rank_sets_torch_threads_by_the_same_rule(tmp_path, cores, monkeypatch, torch_threads):
    settings = train_settings(tmp_path, "train.nproc_per_node=1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun's count of the ranks on this node wins
    torch.set_num_threads(2)
    assert set_rank_threads(settings).threads == 1 and torch.get_num_threads() == 1
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert set_rank_threads(settings).threads == 2 and torch.get_num_threads() == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what the launcher (or torchrun) passed
    assert set_rank_threads(settings).threads == 1 and torch.get_num_threads() == 1


def test_the_trainer_runs_with_train_threads_per_rank(tmp_path, caplog, torch_threads):
    config = single_process(
        train_config(tmp_path / "data", "train.steps=2", "train.threads_per_rank=2"), tmp_path
    )
    write_token_corpus(config, SNAPSHOT)
    torch.set_num_threads(1)
    from pipeline.train.trainer import train

    with caplog.at_level(logging.INFO, logger="pipeline.train.trainer"):
        train(config, SNAPSHOT)
    assert torch.get_num_threads() == 2
    assert "2 thread(s) per rank (train.threads_per_rank)" in caplog.text


def test_a_rank_names_the_launchers_choice_as_the_launchers(tmp_path, cores, monkeypatch, torch_threads):
    """Ranks used to log `(OMP_NUM_THREADS was already set)` about the value their own launcher had set."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = child_environment(train_settings(tmp_path, "train.nproc_per_node=2"))
    for name in ("OMP_NUM_THREADS", "PRETRAIN_THREADS_CHOSEN_BY"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    choice = set_rank_threads(train_settings(tmp_path, "train.nproc_per_node=2"))
    assert choice.source == "launcher" and "already set" not in str(choice)
    assert (
        str(choice)
        == "1 thread(s) per rank (chosen by the launcher: 2 usable core(s) / 2 rank(s) on this node)"
    )

    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's own value, passed through: said as such
    user = child_environment(train_settings(tmp_path, "train.nproc_per_node=2"))
    assert user["OMP_NUM_THREADS"] == "3" and "PRETRAIN_THREADS_CHOSEN_BY" not in user
