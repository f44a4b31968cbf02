"""The quality gate: does a snapshot meet the thresholds it must meet before it is trained on?

The quality stage evaluates it and records the verdict in its manifest (``extra["gate"]``) and report;
the DAG that announces a snapshot's token shards reads the verdict (``operators.assets``) and, in mode
"fail", announces nothing, so no training starts on the snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.quality.config import GateConfig
from pipeline.quality.funnel import Step


def evaluate(gate: GateConfig, metrics: dict[str, Any], steps: Sequence[Step]) -> dict[str, Any]:
    """{"mode", "passed", "failures": ["kept documents 3 < quality.gate.min_documents 10", ...]}."""
    failures = []
    if gate.mode != "ignore":
        documents = metrics.get("documents", 0)
        if gate.min_documents is not None and documents < gate.min_documents:
            failures.append(f"kept documents {documents} < quality.gate.min_documents {gate.min_documents}")
        first = steps[0].documents if steps and steps[0].reason == "input" else None
        if gate.min_kept_share is not None and first:
            share = documents / first
            if share < gate.min_kept_share:
                failures.append(
                    f"kept share {share:.4f} (of {first} in) < quality.gate.min_kept_share {gate.min_kept_share}"
                )
        removed = sum(s.documents for s in steps if s.stage == "dedup" and s.reason.endswith("_duplicate"))
        dedup_read = _documents_read_by(steps, "dedup")
        if gate.max_duplicate_share is not None and dedup_read:
            share = removed / dedup_read
            if share > gate.max_duplicate_share:
                failures.append(
                    f"duplicate share {share:.4f} > quality.gate.max_duplicate_share {gate.max_duplicate_share}"
                )
        cosine = metrics.get("mean_pairwise_cosine")
        if (
            gate.max_mean_pairwise_cosine is not None
            and cosine is not None
            and cosine > gate.max_mean_pairwise_cosine
        ):
            failures.append(
                f"mean pairwise cosine {cosine:.4f} > quality.gate.max_mean_pairwise_cosine "
                f"{gate.max_mean_pairwise_cosine}"
            )
    return {"mode": gate.mode, "passed": not failures, "failures": failures}


def _documents_read_by(steps: Sequence[Step], stage: str) -> int:
    """Documents a stage took in: what was left before its first step."""
    left = None
    for step in steps:
        if step.reason == "input":
            left = step.documents
        elif step.stage == stage:
            return left or 0
        elif step.reason != "kept" and left is not None:
            left -= step.documents
    return 0


def blocks_training(gate: dict[str, Any] | None) -> bool:
    return bool(gate) and gate.get("mode") == "fail" and not gate.get("passed", True)
