"""The trainer with ``train.optimizer=muon``: stopped and resumed bit for bit in one process; DDP and ZeRO-1 on a
real 2-process gloo group against one process with the same global batch (one spawned group runs every case)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipeline.core.storage import DatasetRef
from pipeline.model.checkpoint import Checkpointer
from pipeline.train.fault_injection import ENV_FAULT
from pipeline.train.trainer import TrainingStopped, train
from tests.train.support import losses, single_process, train_config, write_token_corpus

SNAPSHOT = "muon"
STEPS = 8
MUON = ("train.optimizer=muon", f"train.steps={STEPS}", "train.checkpoint_every=100", "train.muon_lr=0.05")


def muon_config(root: Path, *overrides: str):
    return train_config(root / "data", *MUON, *overrides)


def final_state(config) -> dict:
    return Checkpointer(DatasetRef.of(config, "train", SNAPSHOT).path / "checkpoints").load(STEPS)


def stopped_and_resumed(config, step: int) -> None:
    os.environ[ENV_FAULT] = f"SIGTERM@{step}"
    try:
        train(config, SNAPSHOT)
        raise AssertionError("the run was not stopped")
    except TrainingStopped as stopped:
        assert stopped.step == step
    finally:
        del os.environ[ENV_FAULT]
    train(config, SNAPSHOT)


def test_muon_run_stopped_and_resumed_repeats_the_uninterrupted_run_bit_for_bit(tmp_path):
    # fp16 with a loss scaler and two micro-batches: Muon's momentum, AdamW's moments, the schedule and the
    # scaler must all come back.
    settings = ("train.precision=fp16", "train.grad_accum=2")
    straight = single_process(muon_config(tmp_path / "straight", *settings), tmp_path)
    resumed = single_process(muon_config(tmp_path / "resumed", *settings), tmp_path)
    for config in (straight, resumed):
        write_token_corpus(config, SNAPSHOT)
    train(straight, SNAPSHOT)
    stopped_and_resumed(resumed, STEPS // 2)

    expected = losses(straight, SNAPSHOT)
    assert losses(resumed, SNAPSHOT) == expected  # exact, every step
    assert expected[-1] < expected[0] - 1.0
    a, b = final_state(straight), final_state(resumed)
    for name, tensor in a["model"].items():
        assert torch.equal(b["model"][name], tensor), name
    assert any("momentum_buffer" in s for s in a["optimizer"]["state"].values())
    for index, state in a["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(b["optimizer"]["state"][index][key], value), (index, key)


CASES = {"ddp": (), "zero1": ("train.data_parallel=zero1",)}


def _worker(rank: int, world: int, root: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/pg", rank=rank, world_size=world)
    try:
        for case, overrides in CASES.items():
            train(muon_config(Path(root) / case, *overrides), SNAPSHOT)
        stopped_and_resumed(muon_config(Path(root) / "zero1-resumed", *CASES["zero1"]), STEPS // 2)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("muon-2")
    for case, overrides in {**CASES, "zero1-resumed": CASES["zero1"]}.items():
        write_token_corpus(muon_config(root / case, *overrides), SNAPSHOT)
    mp.spawn(_worker, args=(2, str(root)), nprocs=2, join=True)
    return root


@pytest.mark.slow
def test_muon_under_ddp_and_zero1_trains_like_one_process_and_zero1_resumes_exactly(two_ranks, tmp_path):
    # One rank with twice the per-rank batch sees the same 8 windows per step.
    single = single_process(muon_config(tmp_path, "train.batch_size=8"), tmp_path)
    write_token_corpus(single, SNAPSHOT)
    train(single, SNAPSHOT)
    expected = losses(single, SNAPSHOT)
    ddp = losses(muon_config(two_ranks / "ddp"), SNAPSHOT)
    zero1 = losses(muon_config(two_ranks / "zero1", *CASES["zero1"]), SNAPSHOT)
    assert ddp == pytest.approx(expected, abs=1e-3)  # reduction order, through a bf16 orthogonalisation
    assert zero1 == pytest.approx(ddp, abs=1e-3)
    assert losses(muon_config(two_ranks / "zero1-resumed", *CASES["zero1"]), SNAPSHOT) == zero1
