"""The trainer on a declared mixture (data.mixture): per-source loss, epochs and validation, the inputs it
records, and exact resume, in one process. Resume at another data-parallel size: tests/test_mixture_e2e.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.core.config import ConfigError
from pipeline.core.storage import DatasetRef
from pipeline.data.blend import blending_schedule
from pipeline.train.fault_injection import ENV_FAULT
from pipeline.train.launcher.runs import RunRecord
from pipeline.train.trainer import TrainingStopped, train
from tests.train.support import losses, single_process, train_config, unfinished_run, write_token_corpus

SNAPSHOT = "mix"  # names the training run's folder; the data comes from the mixture
# Two corpora: "web" with two snapshots (drawn as one source), "books" with one, weighted 3:1.
MIXTURE = "data.mixture=[{corpus: web, snapshots: all, weight: 3}, {corpus: books, snapshots: b1, weight: 1}]"
SETTINGS = ("train.steps=9", "train.batch_size=8", "train.eval_sequences=8", MIXTURE)


def write_mixture_corpora(config, tokenizer_seed: int = 7) -> None:
    """Three tokenize outputs sharing one tokenizer: web/w1, web/w2 and books/b1 (one has a single document,
    so it is repeated)."""
    write_token_corpus(config, "w1", documents=120, seed=1, corpus="web", tokenizer_seed=tokenizer_seed)
    write_token_corpus(config, "w2", documents=120, seed=2, corpus="web", tokenizer_seed=tokenizer_seed)
    write_token_corpus(config, "b1", documents=60, seed=3, corpus="books", tokenizer_seed=tokenizer_seed)


def rows(config) -> list[dict]:
    path = DatasetRef.of(config, "train", SNAPSHOT).path / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture")
    config = single_process(train_config(root / "data", *SETTINGS), root)
    write_mixture_corpora(config)
    manifest = train(config, SNAPSHOT)
    return config, manifest


def test_a_mixture_logs_loss_epochs_and_validation_per_source(uninterrupted):
    config, manifest = uninterrupted
    history = rows(config)
    last = history[-1]
    for name in ("web", "books"):
        assert last[f"loss.{name}"] > 0 and last[f"val_loss.{name}"] > 0
        assert last[f"epochs.{name}"] > 0
    # Each source's own validation split (different text, different loss); the mixture's: weighted as drawn.
    assert last["val_loss.web"] != last["val_loss.books"]
    expected = 0.75 * last["val_loss.web"] + 0.25 * last["val_loss.books"]
    assert last["val_loss"] == pytest.approx(expected, abs=1e-5)
    # The step's loss is the token mean over its rows: the sources' losses weighted by their rows in the step,
    # which Megatron's rule (blending_schedule, tested on its own) gives for windows 64..71 of the blend.
    rows_of = np.bincount(blending_schedule((0.75, 0.25))[64:72], minlength=2)
    assert 0 < rows_of[1] < 8 and last["loss.web"] != last["loss.books"]
    expected_loss = (rows_of[0] * last["loss.web"] + rows_of[1] * last["loss.books"]) / 8
    assert last["loss"] == pytest.approx(expected_loss, abs=1e-5)
    # 9 steps x 8 windows, 3:1 by windows (packed: windows are tokens).
    samples = manifest.extra["source_samples"]
    assert samples == {"web": 54, "books": 18}
    assert manifest.extra["source_epochs"]["books"] > manifest.extra["source_epochs"]["web"]
    assert manifest.extra["val_loss_by_source"] == {
        "web": last["val_loss.web"],
        "books": last["val_loss.books"],
    }


def test_the_run_records_every_input_and_the_tokenizer(uninterrupted):
    config, manifest = uninterrupted
    inputs = manifest.extra["inputs"]
    assert [(i["source"], i["corpus"], i["snapshot"]) for i in inputs] == [
        ("web", "web", "w1"),
        ("web", "web", "w2"),
        ("books", "books", "b1"),
    ]
    for entry in inputs:
        tokens = DatasetRef(config.project.data_root, entry["corpus"], "tokenize", entry["snapshot"])
        assert entry["digest"] == tokens.manifest().digest
    assert [i["path"] for i in manifest.inputs] == [i["path"] for i in inputs]
    record = RunRecord.read(DatasetRef.of(config, "train", SNAPSHOT).path)
    assert record is not None
    assert record.inputs == inputs and record.tokenizer_digest == manifest.extra["tokenizer_digest"]
    assert record.mixture == ["web", "books"]
    assert record.source_epochs == manifest.extra["source_epochs"]


def test_a_stopped_mixture_run_resumes_exactly(uninterrupted, tmp_path, monkeypatch):
    reference, reference_manifest = uninterrupted
    config = single_process(train_config(tmp_path / "data", *SETTINGS), tmp_path)
    write_mixture_corpora(config)
    monkeypatch.setenv(ENV_FAULT, "SIGTERM@5")
    with pytest.raises(TrainingStopped):
        train(config, SNAPSHOT)
    monkeypatch.delenv(ENV_FAULT)
    assert (unfinished_run(config, SNAPSHOT) / "run.json").is_file()

    manifest = train(single_process(config, tmp_path), SNAPSHOT)

    assert losses(config, SNAPSHOT) == losses(reference, SNAPSHOT)
    assert [row.get("loss.books") for row in rows(config)] == [
        row.get("loss.books") for row in rows(reference)
    ]
    assert manifest.extra["source_epochs"] == reference_manifest.extra["source_epochs"]
    assert manifest.extra["val_loss"] == reference_manifest.extra["val_loss"]


def test_a_mixture_of_two_tokenizers_is_refused_before_training(tmp_path):
    config = single_process(train_config(tmp_path / "data", *SETTINGS), tmp_path)
    write_mixture_corpora(config)
    write_token_corpus(config, "b1", documents=60, seed=3, corpus="books", tokenizer_seed=11)  # replaces b1
    with pytest.raises(ConfigError, match="different tokenizers") as refused:
        train(config, SNAPSHOT)
    assert "books/b1" in str(refused.value)
    assert not DatasetRef.of(config, "train", SNAPSHOT).snapshot_path.exists()


def test_per_source_losses_come_with_the_logged_steps_only(tmp_path):
    config = single_process(train_config(tmp_path / "data", *SETTINGS, "train.log_every=4"), tmp_path)
    write_mixture_corpora(config)
    train(config, SNAPSHOT)
    logged = [(row["step"], "loss.web" in row, "loss.books" in row) for row in rows(config) if "loss" in row]
    assert logged == [(4, True, True), (8, True, True), (9, True, True)]
