"""Dynamic (token-budget) batches: padded rows of different widths, gradient accumulation over them.

The logged loss of a step must be the mean over every real token of the step, not the mean of per-batch
means, and the token count must be the real tokens, not batch_size x seq_len.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from pipeline.core.storage import DatasetRef
from pipeline.data.loader import build_loader
from pipeline.data.mixture import resolve_mixture
from pipeline.data.sequences import IGNORE_INDEX
from pipeline.model.gpt import GPT
from pipeline.train.components.checkpoint_manager import seed_everything
from pipeline.train.trainer import build_model_config, train
from tests.train.support import single_process, train_config, write_token_corpus

SNAPSHOT = "budget"


def test_token_budget_steps_weight_every_real_token_equally(tmp_path):
    config = single_process(
        train_config(
            tmp_path / "data",
            "data.batching=token_budget",
            "data.max_tokens_per_batch=400",
            "train.grad_accum=2",
            "train.steps=4",
            "train.precision=fp32",
        ),
        tmp_path,
    )
    tokens = write_token_corpus(config, SNAPSHOT)
    vocab = tokens.manifest().extra["vocab_size"]
    manifest = train(config, SNAPSHOT)

    # Independently: the first step's two batches from a fresh loader, the initial weights from the seed, and
    # a summed cross-entropy over all real tokens.
    loader = build_loader(resolve_mixture(config, snapshot=SNAPSHOT), config)
    batches = [next(loader) for _ in range(2 * 4)]
    assert len({tuple(batch.inputs.shape) for batch in batches}) > 1  # really different shapes
    seed_everything(config.project.seed)
    model = GPT(build_model_config(config, vocab))
    with torch.no_grad():
        total, count = 0.0, 0
        for batch in batches[:2]:
            logits = model(batch.inputs, document_ids=batch.document_ids).logits
            total += F.cross_entropy(
                logits.flatten(0, 1).double(),
                batch.targets.flatten(),
                ignore_index=IGNORE_INDEX,
                reduction="sum",
            ).item()
            count += int((batch.targets != IGNORE_INDEX).sum())

    rows = [
        json.loads(line)
        for line in (DatasetRef.of(config, "train", SNAPSHOT).path / "metrics.jsonl").read_text().splitlines()
    ]
    assert rows[0]["loss"] == pytest.approx(total / count, abs=2e-6)
    real_tokens = sum(int((batch.targets != IGNORE_INDEX).sum()) for batch in batches)
    assert manifest.counters["tokens_seen"] == real_tokens
    assert rows[0]["tokens"] == count
