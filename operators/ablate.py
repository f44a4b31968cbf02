"""The ablate DAG's task bodies: the ablation's three steps (``pipeline.ablate.runner``) with the spec built
from the run's form. Each task rebuilds the plan from the same spec, so a mapped training task needs only its
variant and seed in XCom."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.ablate.spec import SPEC_KEYS, AblationSpec, parse_spec


def spec_of(params: Mapping[str, Any]) -> AblationSpec:
    """The ablation the form describes; empty fields keep the spec's defaults. A ``mixture`` (as data.mixture
    declares one) is the source in place of the snapshot."""
    data = {key: params[key] for key in SPEC_KEYS if key in params and params[key] not in (None, "", [], {})}
    stage = params.get("source_stage") or "ingest"
    if params.get("mixture"):
        data["source"] = {"mixture": list(params["mixture"]), "stage": stage}
    elif params.get("source_stage"):
        data["source"] = {"snapshot": data.get("source"), "stage": stage}
    return parse_spec(data)


def prepare_step(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Corpus stages, tokenizer and reference check; XCom: the trainings to map, as {variant, seed}."""
    from pipeline.ablate.runner import prepare

    plan = prepare(spec_of(params), params.get("config_path") or None, list(params.get("overrides") or []))
    return [{"variant": t.variant, "seed": t.seed} for t in plan.trainings]


def train_step(params: Mapping[str, Any], training: Mapping[str, Any]) -> dict[str, Any]:
    """One mapped training and its evaluations (skipped when finished: a retry or rerun resumes)."""
    from pipeline.ablate.plan import make_plan
    from pipeline.ablate.runner import train_and_evaluate

    config_path, overrides = params.get("config_path") or None, list(params.get("overrides") or [])
    plan = make_plan(spec_of(params), config_path, overrides)
    (chosen,) = [t for t in plan.trainings if (t.variant, t.seed) == (training["variant"], training["seed"])]
    return train_and_evaluate(plan, chosen, config_path, overrides)


def compare_step(params: Mapping[str, Any], results: list[dict[str, Any]]) -> str:
    from pipeline.ablate.compare import compare
    from pipeline.ablate.plan import make_plan

    config_path, overrides = params.get("config_path") or None, list(params.get("overrides") or [])
    plan = make_plan(spec_of(params), config_path, overrides)
    return str(compare(plan, list(results), config_path, overrides).path)
