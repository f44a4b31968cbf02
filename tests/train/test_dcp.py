"""Distributed checkpoints (``train.checkpoint_format=dcp``): every rank writes its shards, a step resumes at
another layout (fsdp 2 -> 1 and 2 -> 4 ranks; one process -> pp 2 x fsdp 2, saving asynchronously -> one
process) with the data and the losses an uninterrupted run at the new layout has, an asynchronous save killed mid-write leaves nothing visible and the previous step loads,
Muon's state survives the round trip, and the readers (export, evaluation, generation) read the new format as
they read the old one."""

from __future__ import annotations

import copy
import shutil

import pytest
import torch

from pipeline.core.config import ConfigError
from pipeline.core.storage import DatasetRef
from pipeline.model import GPTConfig, model_config
from pipeline.model.checkpoint import (
    DCP_CHECKSUMS,
    DistributedCheckpointer,
    checkpoint_format_problem,
    latest_checkpoint,
    whole_model_checkpoint,
)
from pipeline.model.gpt import GPT
from pipeline.model.inference import load_model
from pipeline.model.trained import TrainedRun
from pipeline.train.components.checkpoint_manager import DistributedCheckpointManager
from pipeline.train.components.optimizer import build_optimizer
from pipeline.train.distributed.parallelism import ShardedModelState, ShardedOptimizerState
from pipeline.train.fault_injection import ENV_FAULT
from pipeline.train.trainer import TrainingStopped, train
from tests.conftest import make_config
from tests.train.support import (
    TORCHRUN_RUN,
    launched,
    losses,
    single_process,
    train_config,
    trained_in_one_process,
    unfinished_run,
    write_token_corpus,
)

SNAPSHOT = "dcp"
# A global batch of 8 windows a step at every layout, so every layout's losses are one process's.
SMALL = ("train.steps=6", "train.checkpoint_every=2", "train.eval_sequences=9")
DCP = ("train.checkpoint_format=dcp",)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """One uninterrupted process in today's format (one torch.save file a step): losses and final weights."""
    config, _ = trained_in_one_process(tmp_path_factory.mktemp("one"), SNAPSHOT, *SMALL, "train.batch_size=8")
    # The old format still reads through the readers' one entry point.
    model = load_model(DatasetRef.of(config, "train", SNAPSHOT).path / "checkpoints")
    return losses(config, SNAPSHOT), model.state_dict()


def launch(root, ranks: int, *overrides: str, env=None, expect_success=True):
    config, _, output = launched(
        root, SNAPSHOT, ranks, *SMALL, *DCP, *overrides, env=env, expect_success=expect_success
    )
    return config, output


@pytest.mark.slow
def test_fsdp_run_killed_mid_async_save_resumes_at_one_and_at_four_ranks(one_process, tmp_path):
    expected, _ = one_process
    # Rank 1 is killed in its background writer after its shards of step 4 are on disk, before the step is
    # published; rank 0 trains on meanwhile (the save is asynchronous) until torchrun ends the job.
    fsdp = ("train.data_parallel=fsdp", "train.checkpoint_async=true")
    config, output = launch(
        tmp_path,
        2,
        *fsdp,
        "train.batch_size=4",
        env={"PRETRAIN_TRAIN_FAULT": "SIGKILL@4:rank=1:at=checkpoint"},
        expect_success=False,
    )
    folder = unfinished_run(config, SNAPSHOT) / "checkpoints"
    checkpoints = DistributedCheckpointer(folder)
    assert checkpoints.steps() == [2], output[-5000:]  # step 4 never became visible
    partial = checkpoints.partial_path(4)
    written = {path.name for path in partial.iterdir()}
    assert "__1_0.distcp" in written and DCP_CHECKSUMS not in written  # killed mid-save, not before it
    step, state = checkpoints.load_latest()
    assert step == 2 and state["dataloader"]["position"] == 2 * 8
    shards = {path.name for path in checkpoints.path_for(2).iterdir()}
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "state.pt", DCP_CHECKSUMS} == shards

    # dp 2 -> 1: a copy resumes in one process (FSDP over one rank), from step 2.
    shutil.copytree(tmp_path / "data", tmp_path / "copy" / "data")
    one = single_process(
        train_config(tmp_path / "copy" / "data", *SMALL, *DCP, *fsdp, "train.batch_size=8"), tmp_path
    )
    assert train(one, SNAPSHOT).rows["steps"] == 6
    # The same windows from step 3 on (none repeated or skipped), hence one process's losses.
    assert losses(one, SNAPSHOT) == pytest.approx(expected, abs=1e-4)
    published = DatasetRef.of(one, "train", SNAPSHOT).path / "checkpoints"
    assert not list(published.glob(".step-*")) and DistributedCheckpointer(published).steps() == [2, 4, 6]

    # dp 2 -> 4: the original resumes on four ranks.
    four, _ = launch(tmp_path, 4, *fsdp, "train.batch_size=2")
    assert losses(four, SNAPSHOT) == pytest.approx(expected, abs=1e-4)
    assert DatasetRef.of(four, "train", SNAPSHOT).manifest().extra["world_size"] == 4


@pytest.mark.slow
def test_one_process_step_resumes_at_pp2_x_fsdp2_whose_async_step_resumes_in_one_process(
    one_process, tmp_path, monkeypatch
):
    expected, final_weights = one_process
    # One process, stopped (SIGTERM to itself) after step 3: whole tensors, under the run torchrun resumes.
    first = single_process(
        train_config(tmp_path / "data", *SMALL, *DCP, "train.batch_size=8", f"train.run_id={TORCHRUN_RUN}"),
        tmp_path,
    )
    write_token_corpus(first, SNAPSHOT)
    monkeypatch.setenv(ENV_FAULT, "SIGTERM@3")
    with pytest.raises(TrainingStopped):
        train(first, SNAPSHOT)
    monkeypatch.delenv(ENV_FAULT)
    folder = unfinished_run(first, SNAPSHOT) / "checkpoints"
    assert DistributedCheckpointer(folder).steps() == [2, 3]

    # 1 -> pp 2 x fsdp 2 (4 ranks; 2 stages, each sharded over 2 ranks), saving asynchronously, preempted
    # after step 5: DCP reshards the whole tensors into each rank's stage and shard.
    pipeline = (
        "train.pp_degree=2",
        "train.nproc_per_node=4",
        "train.batch_size=4",
        "train.data_parallel=fsdp",
        "train.checkpoint_async=true",
    )
    config, output = launch(
        tmp_path,
        4,
        *pipeline,
        env={"PRETRAIN_TRAIN_FAULT": "SIGTERM@5:rank=0:to=launcher"},
        expect_success=False,
    )
    assert DistributedCheckpointer(folder).steps() == [3, 4, 5], output[-5000:]
    assert losses(config, SNAPSHOT, staging=True) == pytest.approx(expected[:5], abs=1e-4)
    # Each of the 4 ranks wrote its own stage's shard into the one folder.
    written = {path.name for path in DistributedCheckpointer(folder).path_for(5).iterdir()}
    assert {f"__{rank}_0.distcp" for rank in range(4)} <= written
    # Read without a process group into the whole model, as export does: both stages' names are there.
    state = whole_model_checkpoint(latest_checkpoint(folder))
    GPT(GPTConfig(**state["model_config"])).load_state_dict(state["model"])

    # pp 2 x fsdp 2 -> 1: resumed in one process, with one process's losses.
    one = single_process(train_config(tmp_path / "data", *SMALL, *DCP, "train.batch_size=8"), tmp_path)
    assert train(one, SNAPSHOT).rows["steps"] == 6
    assert losses(one, SNAPSHOT) == pytest.approx(expected, abs=1e-4)

    # What export, evaluation and generation read: the final DCP step, verified against the manifest.
    trained = TrainedRun.of(DatasetRef.of(one, "train", SNAPSHOT))
    assert trained.checkpoint.name == "step-000006" and trained.checkpoint.is_dir()
    weights = trained.model().state_dict()
    for name, tensor in final_weights.items():
        torch.testing.assert_close(weights[name], tensor, atol=1e-4, rtol=0, msg=name)


def small_training(tmp_path, seed: int):
    """A tiny GPT and Muon (with AdamW on the rest), a few steps on random gradients."""
    train_section = make_config(tmp_path, "train.optimizer=muon").train
    torch.manual_seed(seed)
    model = GPT(model_config("tiny"))
    optimizer = build_optimizer(model, train_section, torch.device("cpu"))
    for _ in range(2):
        for param in model.parameters():
            param.grad = torch.randn_like(param)
        optimizer.step()
    return model, optimizer


def manager(folder, model, optimizer, async_save: bool) -> DistributedCheckpointManager:
    return DistributedCheckpointManager(
        folder,
        states={
            "model": ShardedModelState([(model, str)]),
            "optimizer": ShardedOptimizerState(model, optimizer, str),
        },
        is_main=True,
        metadata={"model_config": {}},
        async_save=async_save,
    )


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_muon_state_round_trips_and_a_corrupt_step_falls_back(tmp_path, async_save):
    model, optimizer = small_training(tmp_path, seed=1)
    saving = manager(tmp_path / "checkpoints", model, optimizer, async_save)
    expected_params = {name: param.detach().clone() for name, param in model.named_parameters()}
    expected_state = copy.deepcopy(optimizer.state_dict())
    saving.save(2)
    # Training goes on while an asynchronous save writes: it writes the values of the moment it was asked.
    for param in model.parameters():
        param.data.add_(1.0)
    saving.wait()
    saving.save(3)
    saving.wait()

    fresh_model, fresh_optimizer = small_training(tmp_path, seed=2)
    loading = manager(tmp_path / "checkpoints", fresh_model, fresh_optimizer, async_save=False)
    (tmp_path / "checkpoints" / "step-000003" / "__0_0.distcp").write_bytes(b"damaged")
    step, state = loading.files.load_latest()
    assert step == 2  # step 3's shard does not match its checksum
    loading.restore(step, state)
    for name, param in fresh_model.named_parameters():
        assert torch.equal(param, expected_params[name]), name
    restored = fresh_optimizer.state_dict()
    assert restored["param_groups"] == expected_state["param_groups"]
    for number, entry in expected_state["state"].items():
        for key, value in entry.items():
            assert torch.equal(torch.as_tensor(restored["state"][number][key]), torch.as_tensor(value))


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["train.checkpoint_format=dcp", "train.data_parallel=zero1"], "train.checkpoint_format"),
        (["train.checkpoint_async=true"], "train.checkpoint_async"),
    ],
)
def test_impossible_checkpoint_settings_are_refused_when_the_config_loads(tmp_path, overrides, named):
    with pytest.raises(ConfigError, match=named):
        make_config(tmp_path, *overrides)


def test_a_run_does_not_switch_checkpoint_format_mid_run(tmp_path):
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "step-000002.pt").write_bytes(b"")
    problem = checkpoint_format_problem(tmp_path / "files", "dcp")
    assert (
        "train.checkpoint_format=torch" in problem and "this run has train.checkpoint_format=dcp" in problem
    )
    assert checkpoint_format_problem(tmp_path / "files", "torch") is None
    (tmp_path / "folders" / "step-000002").mkdir(parents=True)
    assert "train.checkpoint_format=dcp" in checkpoint_format_problem(tmp_path / "folders", "torch")
    assert checkpoint_format_problem(tmp_path / "folders", "dcp") is None
