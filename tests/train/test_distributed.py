"""The trainer under torchrun on CPU (gloo): 2 processes against 1, two agents (--nnodes=2), an elastic restart
after a killed worker, and a preempted (SIGTERM) job resumed on another number of ranks."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.core.storage import DatasetRef
from pipeline.model.checkpoint import Checkpointer
from pipeline.train.trainer import train
from tests.train.support import (
    finish,
    free_port,
    launched,
    losses,
    prepared,
    single_process,
    standalone,
    torchrun,
    train_config,
    trained_in_one_process,
    unfinished_run,
)

pytestmark = pytest.mark.slow
SNAPSHOT = "dist"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 2-process run: its losses and its published manifest."""
    root = tmp_path_factory.mktemp("reference")
    config, _, _ = launched(root, SNAPSHOT, 2)
    return losses(config, SNAPSHOT), DatasetRef.of(config, "train", SNAPSHOT).manifest()


def test_two_processes_train_like_one_process_with_the_same_global_batch(reference, tmp_path):
    expected, manifest = reference
    assert manifest.extra["world_size"] == 2
    # One rank with twice the per-rank batch sees the same 8 windows per step (the loader splits one order).
    config, single = trained_in_one_process(tmp_path, SNAPSHOT, "train.batch_size=8")
    assert single.extra["world_size"] == 1
    assert losses(config, SNAPSHOT) == pytest.approx(expected, abs=1e-4)  # float reduction order only
    assert expected[-1] < expected[0] - 1.0


def test_two_torchrun_agents_rendezvous_on_localhost_and_match_one_agent(reference, tmp_path):
    config, path = prepared(tmp_path, SNAPSHOT)
    nodes = [
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        "--rdzv-id=two-agents",
    ]
    agents = [torchrun(nodes, path, SNAPSHOT) for _ in range(2)]
    for agent in agents:
        finish(agent)
    # Two ranks either way, gloo sums of two values: bit-identical to the single-agent run.
    assert losses(config, SNAPSHOT) == reference[0]
    assert DatasetRef.of(config, "train", SNAPSHOT).manifest().extra["world_size"] == 2


def test_killed_worker_restarts_the_group_from_the_latest_checkpoint(reference, tmp_path):
    config, path = prepared(tmp_path, SNAPSHOT)
    output = standalone(
        path, SNAPSHOT, 2, "--max-restarts=1", env={"PRETRAIN_TRAIN_FAULT": "SIGKILL@5:rank=1"}
    )
    manifest = DatasetRef.of(config, "train", SNAPSHOT).manifest()
    assert manifest.extra["restarts"] == 1
    assert "exitcode: -9" in output  # torchrun saw the SIGKILL, then restarted the group
    # Both ranks of the new attempt logged (ECS files) that they continued from the checkpoint of step 3.
    resumed = [
        json.loads(line)
        for log_file in (tmp_path / "data").glob("_runs/*/logs/train-rank*.ecs.json")
        for line in log_file.read_text().splitlines()
        if "resumed from step" in line
    ]
    assert sorted(entry["labels"]["rank"] for entry in resumed) == [0, 1]
    assert {entry["message"] for entry in resumed} == {"resumed from step 3 (checkpoint of 2 ranks)"}
    # Same ranks, restored RNG and loader: the restarted run continues exactly as the uninterrupted one.
    assert losses(config, SNAPSHOT) == reference[0]
    assert manifest.extra["val_loss"] == reference[1].extra["val_loss"]


def test_preempted_job_checkpoints_and_resumes_on_one_process(reference, tmp_path):
    # SIGTERM to the torchrun agent, as a scheduler preempting the job would send it.
    config, _, output = launched(
        tmp_path,
        SNAPSHOT,
        2,
        env={"PRETRAIN_TRAIN_FAULT": "SIGTERM@5:rank=0:to=launcher"},
        expect_success=False,
    )
    checkpoints = Checkpointer(unfinished_run(config, SNAPSHOT) / "checkpoints")
    assert checkpoints.steps()[-1] == 5, output[-5000:]
    state = checkpoints.load(5)
    assert len(state["rank_states"]["ranks"]) == 2
    assert state["dataloader"]["position"] == 5 * 4 * 2

    # Resumed by one process with twice the per-rank batch (the same global batch): the loader reshards the
    # rest of the epoch, the model and optimizer carry on.
    resumed = single_process(train_config(tmp_path / "data", "train.batch_size=8"), tmp_path)
    manifest = train(resumed, SNAPSHOT)
    assert manifest.extra["world_size"] == 1 and manifest.rows["steps"] == 8
    assert losses(config, SNAPSHOT) == pytest.approx(reference[0], abs=1e-4)
    rows = [
        json.loads(line) for line in (DatasetRef.of(config, "train", SNAPSHOT).path / "metrics.jsonl").open()
    ]
    assert [row["step"] for row in rows] == list(range(1, 9))
    final = torch.load(
        DatasetRef.of(config, "train", SNAPSHOT).path / manifest.extra["checkpoint"], weights_only=True
    )
    assert len(final["rank_states"]["ranks"]) == 1 and final["train_state"]["step"] == 8
