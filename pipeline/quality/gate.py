"""The quality gate: does a snapshot meet the thresholds it must meet before it is trained on?

The quality stage evaluates it and records the verdict in its manifest (``extra["gate"]``) and report;
the DAG that announces a snapshot's token shards reads the verdict (``operators.assets``) and, in mode
"fail", announces nothing, so no training starts on the snapshot.

Each ``min_*``/``max_*`` threshold of ``GateConfig`` names the report metric it bounds (its field's
``metric``), so a new threshold is one field there.
"""

from __future__ import annotations

from typing import Any

from pipeline.quality.config import GateConfig


def _shown(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:.4f}"


def evaluate(gate: GateConfig, metrics: dict[str, Any]) -> dict[str, Any]:
    """{"mode", "passed", "failures": ["documents 3 < quality.gate.min_documents 10", ...]}.

    A threshold whose metric the report could not compute (a sample too small for self-BLEU, say) is not
    judged: the report shows that metric as missing."""
    failures = []
    if gate.mode != "ignore":
        for name, field in GateConfig.model_fields.items():
            threshold = getattr(gate, name)
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            metric = extra.get("metric")
            if threshold is None or not isinstance(metric, str) or metrics.get(metric) is None:
                continue
            value = metrics[metric]
            if name.startswith("min_") and value < threshold:
                failures.append(f"{metric} {_shown(value)} < quality.gate.{name} {threshold}")
            elif name.startswith("max_") and value > threshold:
                failures.append(f"{metric} {_shown(value)} > quality.gate.{name} {threshold}")
        if gate.min_subject_share is not None:
            for subject, row in sorted(metrics.get("subjects", {}).items()):
                if row["share"] < gate.min_subject_share:
                    failures.append(
                        f"subject {subject} share {row['share']:.4f} < quality.gate.min_subject_share "
                        f"{gate.min_subject_share}"
                    )
    return {"mode": gate.mode, "passed": not failures, "failures": failures}


def blocks_training(gate: dict[str, Any] | None) -> bool:
    return gate is not None and gate.get("mode") == "fail" and not gate.get("passed", True)
