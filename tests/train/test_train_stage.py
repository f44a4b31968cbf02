"""Train with torchrun --nproc_per_node=2 (gloo, DDP) on the sample corpus."""

import json

import pytest
import torch

from pipeline.core.storage import DatasetRef
from pipeline.train.launcher import launch


@pytest.mark.slow
def test_two_process_ddp_training_learns_and_checkpoints(sample_corpus):
    config, snapshot = sample_corpus
    manifest = launch.run(
        config, [DatasetRef.of(config, "tokenize", snapshot)], DatasetRef.of(config, "train", snapshot)
    )
    train = DatasetRef.of(config, "train", snapshot)
    history = [json.loads(line) for line in (train.path / "metrics.jsonl").read_text().splitlines()]

    assert [row["step"] for row in history] == list(range(1, config.train.steps + 1))
    assert manifest.extra["world_size"] == 2
    assert sum(row["loss"] for row in history[-3:]) / 3 < sum(row["loss"] for row in history[:3]) / 3 - 0.5
    checkpoint = torch.load(train.path / manifest.extra["checkpoint"], weights_only=True)
    assert checkpoint["train_state"]["step"] == config.train.steps
    assert checkpoint["config_hash"] == config.hash
    assert manifest.extra["val_loss"] is not None
