"""FSDP2 (``train.data_parallel=fsdp``) under torchrun on CPU (gloo): 2 ranks, HSDP 2x2 and pp=2 x fsdp=2, train the
model one process trains, a preempted FSDP job resumes where it stopped from a checkpoint in the one whole-model
format (under FSDP, and in one process without it), HSDP's DCP checkpoint resumes in one process and on 2 ranks of
plain FSDP, the layouts FSDP and HSDP cannot run are refused when the config loads, and Muon under FSDP
orthogonalises whole matrices."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from pipeline.core.config import ConfigError
from pipeline.core.storage import DatasetRef
from pipeline.model import GPTConfig
from pipeline.model.checkpoint import Checkpointer, DistributedCheckpointer, whole_model_checkpoint
from pipeline.model.gpt import GPT
from pipeline.train.trainer import train
from tests.conftest import make_config
from tests.train.support import (
    launched,
    losses,
    single_process,
    standalone,
    train_config,
    trained_in_one_process,
    unfinished_run,
)

SNAPSHOT = "fsdp"
# 9 validation windows: ranks hold unequal numbers of validation batches, which FSDP's collective forward
# must survive (the validator's lockstep); 6 steps with a checkpoint at 3 are enough to see the loss fall and
# to resume mid-run.
SMALL = ("train.steps=6", "train.checkpoint_every=3", "train.eval_sequences=9")


def fsdp_run(root, ranks: int, *overrides: str, env=None, expect_success=True):
    """``ranks`` FSDP processes with the global batch of 8 windows a step (one process's batch_size=8)."""
    fsdp = (*SMALL, "train.data_parallel=fsdp", f"train.batch_size={8 // ranks}", *overrides)
    return launched(root, SNAPSHOT, ranks, *fsdp, env=env, expect_success=expect_success)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """One process (no data parallelism) with the same global batch: its losses, manifest and final weights."""
    config, manifest = trained_in_one_process(
        tmp_path_factory.mktemp("one"), SNAPSHOT, *SMALL, "train.batch_size=8"
    )
    final = whole_model_checkpoint(
        DatasetRef.of(config, "train", SNAPSHOT).path / manifest.extra["checkpoint"]
    )
    return losses(config, SNAPSHOT), manifest, final["model"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("ranks", "overrides"),
    [
        # (4 ranks of plain FSDP train in test_dcp's resume at 4 ranks; 4 ranks here run HSDP 2x2, below.)
        # Two micro-batches of 2 (the gradient sync on the last only), blocks recomputed in backward, and
        # parameters kept gathered from forward to backward: the same math.
        (
            2,
            (
                "train.batch_size=2",
                "train.grad_accum=2",
                "model.overrides={activation_checkpointing: true}",
                "train.fsdp_reshard_after_forward=false",
            ),
        ),
        # bf16 gathered parameters, fp32 reduction and master weights: one process's fp32 losses within 2 %
        # (seen: 0.9 %).
        (2, ("train.precision=bf16",)),
        # Pipeline stages over a pp x dp_shard mesh: 2 stages, each sharded over 2 ranks (4 a micro-batch).
        (4, ("train.pp_degree=2", "train.nproc_per_node=4", "train.batch_size=4")),
    ],
    ids=["2-accumulate-recompute-keep-gathered", "2-bf16", "pp2-x-fsdp2"],
)
def test_fsdp_trains_like_one_process(one_process, tmp_path, ranks, overrides):
    expected, reference, _ = one_process
    config, _, _ = fsdp_run(tmp_path, ranks, *overrides)
    manifest = DatasetRef.of(config, "train", SNAPSHOT).manifest()
    assert manifest.extra["world_size"] == ranks and manifest.extra["data_parallel"] == "fsdp"
    assert manifest.extra["dp_replicate"] == 1
    # The same windows per step, sharded parameters and optimizer: in fp32 only the float reduction order
    # differs.
    tolerance = {"rel": 2e-2} if "train.precision=bf16" in overrides else {"abs": 1e-4}
    assert losses(config, SNAPSHOT) == pytest.approx(expected, **tolerance)
    assert manifest.extra["val_loss"] == pytest.approx(reference.extra["val_loss"], **tolerance)
    # The final checkpoint (a pipeline's: one shard per pp rank, merged) is the whole model, whole tensors.
    state = whole_model_checkpoint(
        DatasetRef.of(config, "train", SNAPSHOT).path / manifest.extra["checkpoint"]
    )
    GPT(GPTConfig(**state["model_config"])).load_state_dict(state["model"])
    assert expected[-1] < expected[0] - 0.5


@pytest.mark.slow
def test_hsdp_trains_like_one_process_and_its_dcp_checkpoint_resumes_in_one_process(one_process, tmp_path):
    expected, reference, final_weights = one_process
    # HSDP 2x2 (torchtitan's (dp_replicate, dp_shard) mesh): ranks {0,1} and {2,3} each shard the model, and
    # the pairs all-reduce their gradient shards; preempted at step 4, after its DCP save.
    hsdp = ("train.dp_replicate=2", "train.nproc_per_node=4", "train.checkpoint_format=dcp")
    config, _, output = fsdp_run(
        tmp_path, 4, *hsdp, env={"PRETRAIN_TRAIN_FAULT": "SIGTERM@4:rank=0:to=launcher"}, expect_success=False
    )
    folder = unfinished_run(config, SNAPSHOT) / "checkpoints"
    checkpoints = DistributedCheckpointer(folder)
    assert checkpoints.steps() == [3, 4], output[-5000:]
    # Without the replicas' all-reduce each pair would train on its own half of the batch (a negative control
    # by hand: sharding over the dp_shard dimension alone misses by up to 0.14).
    assert losses(config, SNAPSHOT, staging=True) == pytest.approx(expected[:4], abs=1e-4)
    # Each shard written once (by its first replica), read whole without a process group, as export reads it.
    state = whole_model_checkpoint(checkpoints.path_for(4))
    GPT(GPTConfig(**state["model_config"])).load_state_dict(state["model"])

    # HSDP 2x2 -> plain FSDP on 2 ranks (a copy of the stopped run): DCP reshards each tensor's (replicate,
    # shard) placement over one dimension of 2, and the run ends with the uninterrupted losses.
    shutil.copytree(tmp_path / "data", tmp_path / "fsdp2" / "data")
    fsdp2, _, _ = fsdp_run(tmp_path / "fsdp2", 2, "train.checkpoint_format=dcp")
    assert losses(fsdp2, SNAPSHOT) == pytest.approx(expected, abs=1e-4)
    run = DatasetRef.of(fsdp2, "train", SNAPSHOT)
    assert run.manifest().extra["world_size"] == 2 and run.manifest().extra["dp_replicate"] == 1
    # Steps 3 and 4 are HSDP's (4 only SIGTERM wrote): the run resumed rather than started over.
    assert DistributedCheckpointer(run.path / "checkpoints").steps() == [3, 4, 6]

    # HSDP 2x2 -> one process without FSDP: the DTensor shards load as whole tensors, the data goes on at
    # step 5, and the run ends with one process's losses, validation loss and weights.
    one = single_process(
        train_config(tmp_path / "data", *SMALL, "train.checkpoint_format=dcp", "train.batch_size=8"), tmp_path
    )
    manifest = train(one, SNAPSHOT)
    assert manifest.rows["steps"] == 6
    assert losses(one, SNAPSHOT) == pytest.approx(expected, abs=1e-4)
    assert manifest.extra["val_loss"] == pytest.approx(reference.extra["val_loss"], abs=1e-4)
    final = whole_model_checkpoint(DatasetRef.of(one, "train", SNAPSHOT).path / manifest.extra["checkpoint"])
    for name, tensor in final_weights.items():
        torch.testing.assert_close(final["model"][name], tensor, atol=1e-4, rtol=0, msg=name)


@pytest.mark.slow
def test_preempted_fsdp_job_resumes_from_a_whole_model_checkpoint(one_process, tmp_path):
    expected, _, _ = one_process
    config, path, output = fsdp_run(
        tmp_path, 2, env={"PRETRAIN_TRAIN_FAULT": "SIGTERM@4:rank=0:to=launcher"}, expect_success=False
    )
    checkpoints = Checkpointer(unfinished_run(config, SNAPSHOT) / "checkpoints")
    assert checkpoints.steps()[-1] == 4, output[-5000:]
    state = checkpoints.load(4)
    # The format a DDP run writes: the whole model under its own names (it loads strictly into a plain GPT,
    # as export reads it) and a plain AdamW's state with every tensor whole.
    model = GPT(GPTConfig(**state["model_config"]))
    model.load_state_dict(state["model"])
    shapes = [tuple(param.shape) for param in model.parameters()]
    numbered = state["optimizer"]["state"]
    assert sorted(numbered) == list(range(len(shapes)))
    assert sorted(tuple(entry["exp_avg"].shape) for entry in numbered.values()) == sorted(shapes)

    # A copy of the stopped run resumes in one process (no FSDP): one format for both.
    shutil.copytree(tmp_path / "data", tmp_path / "copy" / "data")
    plain = single_process(train_config(tmp_path / "copy" / "data", *SMALL, "train.batch_size=8"), tmp_path)
    assert train(plain, SNAPSHOT).rows["steps"] == 6
    assert losses(plain, SNAPSHOT) == pytest.approx(expected, abs=1e-4)

    standalone(path, SNAPSHOT, 2)
    assert losses(config, SNAPSHOT) == pytest.approx(expected, abs=1e-4)
    final = DatasetRef.of(config, "train", SNAPSHOT).manifest()
    assert final.rows["steps"] == 6


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["train.grad_compression=powersgd"], "train.grad_compression"),
        (["train.precision=fp16"], "train.precision"),
        (["train.pp_degree=2", "train.nproc_per_node=3"], "train.pp_degree"),
        # HSDP: replicas that do not divide the ranks, replicas of DDP's whole model, HSDP inside stages.
        (["train.dp_replicate=3", "train.nproc_per_node=4"], "train.dp_replicate=3 does not divide the 4"),
        (
            ["train.dp_replicate=2", "train.nnodes=2", "train.min_nnodes=1", "train.nproc_per_node=1"],
            "min_nnodes",
        ),
        (["train.dp_replicate=2", "train.data_parallel=ddp"], "dp_replicate=2 replicates"),
        (
            ["train.dp_replicate=2", "train.pp_degree=2", "train.nproc_per_node=8"],
            "dp_replicate=2 with train.pp_degree",
        ),
    ],
)
def test_fsdp_refuses_what_it_cannot_run_when_the_config_loads(tmp_path, overrides, named):
    with pytest.raises(ConfigError, match=named):
        make_config(tmp_path, "train.data_parallel=fsdp", *overrides)


MUON = ("train.optimizer=muon", "train.muon_lr=0.05")
# A sitecustomize that makes every rank's Muon orthogonalise its shard alone: the test's negative control.
SHARD_WISE_MUON = Path(__file__).parent / "shardwise_muon"


def final_checkpoint(config) -> dict:
    run = DatasetRef.of(config, "train", SNAPSHOT)
    return whole_model_checkpoint(run.path / run.manifest().extra["checkpoint"])


@pytest.mark.slow
def test_muon_under_fsdp_orthogonalises_whole_matrices_as_one_process_does(tmp_path):
    # FSDP hands torch.optim.Muon each matrix as a DTensor row-sharded over the ranks; DTensor runs the
    # Newton-Schulz iteration as the whole matrix's (gathering where an op needs it), not each rank's rows alone.
    single, _ = trained_in_one_process(tmp_path / "one", SNAPSHOT, *SMALL, *MUON, "train.batch_size=8")
    expected = losses(single, SNAPSHOT)
    config, _, _ = fsdp_run(tmp_path / "fsdp", 2, *MUON)
    # Within the bf16 iteration's rounding (seen: 6.4e-4), as DDP's Muon is.
    assert losses(config, SNAPSHOT) == pytest.approx(expected, abs=1e-3)
    assert expected[-1] < expected[0] - 1.0

    # The control: the same run orthogonalising each rank's rows alone lands far outside that (seen: 0.063).
    env = {"PYTHONPATH": os.pathsep.join([str(SHARD_WISE_MUON), os.environ.get("PYTHONPATH", "")])}
    shard_wise, _, output = fsdp_run(tmp_path / "shard-wise", 2, *MUON, env=env)
    assert "muon: shard-wise orthogonalisation" in output
    assert max(abs(a - b) for a, b in zip(losses(shard_wise, SNAPSHOT), expected, strict=True)) > 1e-2

    # The checkpoint gathers Muon's momentum to whole matrices, in a plain optimizer's layout.
    def momentum_shapes(config) -> list[tuple[int, ...]]:
        state = final_checkpoint(config)["optimizer"]["state"]
        return [
            tuple(entry["momentum_buffer"].shape) for entry in state.values() if "momentum_buffer" in entry
        ]

    assert momentum_shapes(config) == momentum_shapes(single) != []
