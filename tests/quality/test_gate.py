"""The quality gate names each threshold a snapshot misses; in mode fail it blocks training."""

import pytest

from pipeline.config import load_config
from pipeline.core.config import ConfigError
from pipeline.quality.funnel import Step, shares
from pipeline.quality.gate import blocks_training, evaluate

STEPS = [
    Step("crawl", "input", 100),
    Step("crawl", "dns_error", 10),
    Step("clean", "language.not_kept", 30),
    Step("dedup", "exact_duplicate", 15),
    Step("dedup", "near_duplicate", 5),
    Step("dedup", "kept", 40),
]


SHARES = shares(STEPS)  # kept 40 of 100; dedup read 60 and removed 20


def gate(*overrides):
    return load_config(overrides=list(overrides), environ={}).quality.gate


def test_the_default_gate_warns_on_an_empty_snapshot_only():
    assert evaluate(gate(), {"documents": 40, **SHARES}) == {"mode": "warn", "passed": True, "failures": []}
    verdict = evaluate(gate(), {"documents": 0, **SHARES})
    assert not verdict["passed"] and verdict["failures"] == ["documents 0 < quality.gate.min_documents 1"]
    assert not blocks_training(verdict), "warn announces the shards anyway"


def test_each_threshold_is_named_when_missed():
    strict = gate(
        "quality.gate.mode=fail",
        "quality.gate.min_documents=50",
        "quality.gate.min_kept_share=0.5",
        "quality.gate.max_duplicate_share=0.25",  # dedup read 60 and removed 20: 0.333
        "quality.gate.max_mean_pairwise_cosine=0.3",
        "quality.gate.max_self_bleu=20",
        "quality.gate.max_unassigned_share=0.1",
        "quality.gate.min_subject_share=0.05",
    )
    metrics = {
        "documents": 40,
        "mean_pairwise_cosine": 0.42,
        "self_bleu": 31.5,
        "unassigned_share": 0.05,
        "subjects": {"code": {"share": 0.9}, "news": {"share": 0.04}, "legal_government": {"share": 0.0}},
        **SHARES,
    }
    verdict = evaluate(strict, metrics)
    assert verdict["mode"] == "fail" and not verdict["passed"] and blocks_training(verdict)
    assert verdict["failures"] == [
        "documents 40 < quality.gate.min_documents 50",
        "kept_share 0.4000 < quality.gate.min_kept_share 0.5",
        "duplicate_share 0.3333 > quality.gate.max_duplicate_share 0.25",
        "mean_pairwise_cosine 0.4200 > quality.gate.max_mean_pairwise_cosine 0.3",
        "self_bleu 31.5000 > quality.gate.max_self_bleu 20.0",
        "subject legal_government share 0.0000 < quality.gate.min_subject_share 0.05",
        "subject news share 0.0400 < quality.gate.min_subject_share 0.05",
    ]
    relaxed = gate("quality.gate.mode=fail", "quality.gate.max_duplicate_share=0.34")
    assert evaluate(relaxed, metrics)["passed"]


def test_a_metric_the_report_could_not_compute_is_not_judged():
    strict = gate("quality.gate.mode=fail", "quality.gate.max_self_bleu=1", "quality.gate.min_kept_share=0.9")
    assert evaluate(strict, {"documents": 5, "self_bleu": None, "kept_share": None})["passed"]


def test_ignore_passes_everything_and_bad_thresholds_are_config_errors():
    assert evaluate(gate("quality.gate.mode=ignore"), {"documents": 0})["passed"]
    with pytest.raises(ConfigError, match=r"quality\.gate\.max_duplicate_share"):
        gate("quality.gate.max_duplicate_share=1.5")
    with pytest.raises(ConfigError, match="did you mean 'min_documents'"):
        gate("quality.gate.min_document=5")
