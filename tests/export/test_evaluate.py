"""The evaluate stage: windows score every target of a document once, group losses are token-weighted means
that add back up to the overall one (hand-computed and random inputs), and lm-evaluation-harness's figures on
the exported model agree with our own model's."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.storage import DatasetRef
from pipeline.evaluate.harness import continuation_items, cut
from pipeline.evaluate.job import document_windows, grouped, summary
from tests.export.lm_eval_tasks import LOCAL_ITEMS, LOCAL_TASK, write_local_task


@settings(max_examples=100, deadline=None)
@given(length=st.integers(2, 60), context=st.integers(1, 16))
def test_windows_score_every_token_after_the_first_once_from_earlier_tokens(length, context):
    tokens = np.arange(length)
    windows = document_windows(tokens, context)
    targets = np.concatenate([y for _, y in windows])
    assert targets.tolist() == list(range(1, length))
    for inputs, outputs in windows:
        assert len(inputs) == len(outputs) <= context
        assert (outputs == inputs + 1).all()  # each target's input is the token just before it


def test_grouped_losses_by_hand():
    # Two English documents (loss sums 6 and 2 over 3 and 1 tokens), one Chinese (3 over 2).
    groups = grouped(np.array([6.0, 2.0, 3.0]), np.array([3, 1, 2]), ["en", "en", "zh"])
    assert list(groups) == ["en", "zh"]
    assert groups["en"] == {"loss": 2.0, "perplexity": math.exp(2.0), "tokens": 4, "documents": 2}
    assert groups["zh"]["loss"] == 1.5 and groups["zh"]["documents"] == 1
    top = grouped(np.array([6.0, 2.0, 3.0]), np.array([3, 1, 2]), ["a", "b", "c"], top=1)
    assert list(top) == ["a", "other"] and top["other"]["loss"] == 5.0 / 3


@settings(max_examples=100, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.floats(0, 50), st.integers(1, 100), st.sampled_from("abcdef")), min_size=1, max_size=40
    ),
    top=st.integers(1, 6),
)
def test_groups_add_up_to_the_overall_loss(rows, top):
    losses = np.array([loss * count for loss, count, _ in rows])
    counts = np.array([count for _, count, _ in rows])
    groups = grouped(losses, counts, [key for _, _, key in rows], top=top)
    assert len(groups) <= top + 1
    overall = summary(float(losses.sum()), int(counts.sum()), len(rows))
    assert sum(g["tokens"] for g in groups.values()) == overall["tokens"]
    assert sum(g["documents"] for g in groups.values()) == len(rows)
    weighted = sum(g["loss"] * g["tokens"] for g in groups.values()) / overall["tokens"]
    assert math.isclose(weighted, overall["loss"], rel_tol=1e-9, abs_tol=1e-9)


def test_continuation_items_put_the_truth_among_other_documents_continuations():
    texts = [f"document {i} " + " ".join(f"w{i}x{j}" for j in range(60)) for i in range(5)]
    items = continuation_items(texts, choices=4)
    assert len(items) == 5
    for index, item in enumerate(items):
        context, truth = cut(texts[index])
        assert item["context"] == context and item["choices"][item["label"]] == truth
        assert texts[index].startswith(context) or context in texts[index]
        assert len(set(item["choices"])) == 4 and item["label"] == index % 4
    assert continuation_items(texts[:3], choices=4) == []  # fewer usable documents than choices


@pytest.mark.slow
def test_lm_eval_on_the_export_agrees_with_our_model_on_every_choice(tmp_path, monkeypatch, capfd):
    """A short training on the synthetic corpus, then export and evaluate through their entrypoints:
    lm-evaluation-harness runs offline on the exported folder with the held-out continuation task, and its
    log-likelihood of every choice equals the one our scorer (``choice_loglikelihoods``, which the ablations
    use) computes from our own model, and its acc and acc_norm equal ``multiple_choice_accuracy``'s. Run from a folder
    outside any git checkout, as a deployed image runs, the log holds no `fatal: not a git repository`."""
    from tokenizers import Tokenizer

    from pipeline.evaluate.__main__ import main as evaluate_main
    from pipeline.evaluate.harness import TASK, choice_loglikelihoods, multiple_choice_accuracy
    from pipeline.export.__main__ import main as export_main
    from pipeline.model.trained import TrainedRun
    from pipeline.train.trainer import train
    from tests.train.support import single_process, train_config, write_config, write_token_corpus

    pytest.importorskip("lm_eval")
    config = train_config(tmp_path / "data", "train.steps=6", "evaluate.lm_eval_documents=8")
    write_token_corpus(config, "lm")
    train(single_process(config, tmp_path), "lm")
    path = write_config(config, tmp_path / "config.yaml")
    monkeypatch.chdir(tmp_path)
    capfd.readouterr()
    for main in (export_main, evaluate_main):
        assert main(["--config", str(path), "--snapshot", "lm"]) == 0
    assert "not a git repository" not in capfd.readouterr().err

    folder = DatasetRef.of(config, "evaluate", "lm").path
    metrics = json.loads((folder / "metrics.json").read_text())["lm_eval"]
    found = json.loads((folder / "lm_eval" / "results.json").read_text())
    items = [json.loads(line) for line in (folder / "lm_eval" / f"{TASK}.jsonl").read_text().splitlines()]
    assert metrics["items"] == len(items) == len(found["predictions"]) >= 4 and metrics["choices"] == 4

    trained = TrainedRun.of(DatasetRef.of(config, "train", "lm"))
    model = trained.model()
    tokenizer = Tokenizer.from_file(str(trained.tokenizer_file))
    correct = 0
    for item, prediction in zip(items, found["predictions"], strict=True):
        ours = choice_loglikelihoods(model, tokenizer, item["context"], item["choices"])
        assert ours == pytest.approx(prediction["loglikelihoods"], abs=1e-3)
        correct += int(max(range(len(ours)), key=ours.__getitem__) == item["label"])
    assert metrics["acc"] == pytest.approx(correct / len(items))
    # The ablations' scorer (no export, no harness) gives lm-eval's accuracies.
    scored = multiple_choice_accuracy(model, tokenizer, items)
    assert scored["acc"] == pytest.approx(metrics["acc"]) and scored["acc_norm"] == pytest.approx(
        metrics["acc_norm"]
    )
    assert metrics["acc"] == pytest.approx(correct / len(items))

    # Any multiple-choice task lm-eval has on this machine (the ablations score them): items made by lm-eval's
    # own task code (its templates, description and target delimiter), scored by ours, match lm-eval on the export.
    import lm_eval
    from lm_eval.tasks import TaskManager

    from pipeline.evaluate.harness import local_task_items

    tasks = write_local_task(tmp_path / "tasks", random.Random(7))
    local = local_task_items(LOCAL_TASK, tasks)
    export = DatasetRef.of(config, "export", "lm").path
    found = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={export},dtype=float32",
        tasks=[LOCAL_TASK],
        task_manager=TaskManager(include_path=str(tasks)),
        batch_size=4,
        device="cpu",
        log_samples=True,
    )
    samples = sorted(found["samples"][LOCAL_TASK], key=lambda sample: sample["doc_id"])
    assert len(local) == len(samples) == LOCAL_ITEMS
    for item, sample in zip(local, samples, strict=True):
        assert item["label"] == sample["target"] or item["choices"][item["label"]] == sample["target"]
        choices = [item["delimiter"] + choice for choice in item["choices"]]
        ours = choice_loglikelihoods(model, tokenizer, item["context"], choices)
        assert ours == pytest.approx([float(r[0]) for r in sample["filtered_resps"]], abs=1e-3)
    scored = multiple_choice_accuracy(model, tokenizer, local)
    figures = found["results"][LOCAL_TASK]
    assert scored["acc"] == pytest.approx(figures["acc,none"])
    assert scored["acc_norm"] == pytest.approx(figures["acc_norm,none"])
