"""The quality gate names each threshold a snapshot misses; in mode fail it blocks training."""

import pytest

from pipeline.config import load_config
from pipeline.core.config import ConfigError
from pipeline.quality.funnel import Step
from pipeline.quality.gate import blocks_training, evaluate

STEPS = [
    Step("crawl", "input", 100),
    Step("crawl", "dns_error", 10),
    Step("clean", "language.not_kept", 30),
    Step("dedup", "exact_duplicate", 15),
    Step("dedup", "near_duplicate", 5),
    Step("dedup", "kept", 40),
]


def gate(*overrides):
    return load_config(overrides=list(overrides), environ={}).quality.gate


def test_the_default_gate_warns_on_an_empty_snapshot_only():
    assert evaluate(gate(), {"documents": 40}, STEPS) == {"mode": "warn", "passed": True, "failures": []}
    verdict = evaluate(gate(), {"documents": 0}, STEPS)
    assert not verdict["passed"] and verdict["failures"] == [
        "kept documents 0 < quality.gate.min_documents 1"
    ]
    assert not blocks_training(verdict), "warn announces the shards anyway"


def test_each_threshold_is_named_when_missed():
    strict = gate(
        "quality.gate.mode=fail",
        "quality.gate.min_documents=50",
        "quality.gate.min_kept_share=0.5",
        "quality.gate.max_duplicate_share=0.25",  # dedup read 60 and removed 20: 0.333
        "quality.gate.max_mean_pairwise_cosine=0.3",
    )
    verdict = evaluate(strict, {"documents": 40, "mean_pairwise_cosine": 0.42}, STEPS)
    assert verdict["mode"] == "fail" and not verdict["passed"] and blocks_training(verdict)
    assert verdict["failures"] == [
        "kept documents 40 < quality.gate.min_documents 50",
        "kept share 0.4000 (of 100 in) < quality.gate.min_kept_share 0.5",
        "duplicate share 0.3333 > quality.gate.max_duplicate_share 0.25",
        "mean pairwise cosine 0.4200 > quality.gate.max_mean_pairwise_cosine 0.3",
    ]
    relaxed = gate("quality.gate.mode=fail", "quality.gate.max_duplicate_share=0.34")
    assert evaluate(relaxed, {"documents": 40, "mean_pairwise_cosine": 0.42}, STEPS)["passed"]


def test_ignore_passes_everything_and_bad_thresholds_are_config_errors():
    assert evaluate(gate("quality.gate.mode=ignore"), {"documents": 0}, STEPS)["passed"]
    with pytest.raises(ConfigError, match=r"quality\.gate\.max_duplicate_share"):
        gate("quality.gate.max_duplicate_share=1.5")
    with pytest.raises(ConfigError, match="did you mean 'min_documents'"):
        gate("quality.gate.min_document=5")
