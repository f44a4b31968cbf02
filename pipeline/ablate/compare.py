"""The comparison of an ablation: per arm (each variant, and the A/A control) and eval set, the held-out
loss (nats per token) and bits per byte over seeds, tokens, epochs, documents and share kept, the unigram
baseline of its training data; loss curves over tokens; and each arm against the base by the paired test of
``pipeline.ablate.stats`` (effect in bits per byte with its 95% interval and p-value), with the documents
that moved most. Written as ``comparison.json``, ``report.html`` (+ ``plots/``) under
``<root>/<corpus>/ablate/<name>/``, and recorded in MLflow as a parent run with one child run per arm and seed.

**The verdict rule.** A training's score on an eval set is its final checkpoint's per-document losses. An arm
is *better* (*worse*) than the base when the paired test's p-value is below 0.05 and its loss is lower
(higher); else *within noise*. Verdicts are drawn on the reference only: the base's validation split is drawn
from what the base trains on (a variant that deduplicates less keeps near-copies of it), so it is reported
with its effect and interval but judged by nobody. The A/A control is the base trained again with each
seed's weights and another data order: its row is the ablation's own measured noise floor, and a verdict
there says the test's assumptions did not hold for this run.
"""

from __future__ import annotations

import html
import json
import logging
import math
from pathlib import Path
from statistics import fmean
from typing import Any

import numpy as np

from pipeline.ablate.plan import Plan, ablation_ref
from pipeline.ablate.stats import ALPHA, PairedComparison, paired_comparison, seeds_for_effect
from pipeline.config import PipelineConfig, load_config
from pipeline.core.manifest import Manifest
from pipeline.core.storage import StageOutput
from pipeline.evaluate.harness import TASK

log = logging.getLogger(__name__)
REFERENCE = "reference"
TASK_NOTE = (
    "multiple choice made from the reference: the true continuation of a document cut near its middle among "
    "those of three others (chance 0.25); acc: the likeliest choice is the true one (lm-eval's rule), final "
    "checkpoint, mean and max - min over seeds; reported, not part of the verdict"
)
LOCAL_TASK_NOTE = (
    "an lm-eval multiple-choice task found on this machine, zero-shot, items built by lm-eval's own task code "
    "and scored with the checkpoint (acc by lm-eval's rule), final checkpoint, mean and max - min over seeds; "
    "reported, not part of the verdict"
)
RULE = (
    f"per document and seed, the base's loss minus the arm's (the same documents; the same seed's initial "
    f"weights); effect = their byte-weighted mean in bits per byte (positive: the arm is better), its variance "
    f"from seeds and documents (two-way analysis of variance), Student's t on the seeds' S - 1 degrees of "
    f"freedom; better / worse = p < {ALPHA} with a lower / higher loss, else within noise. Judged on the "
    f"reference only"
)
MOVED = 5  # documents shown per direction
STILL_FALLING = 0.01  # a curve whose last evaluation interval lowered the loss by over 1% was still learning


def judged(eval_set: str) -> bool:
    """Only the reference carries verdicts (module docstring)."""
    return eval_set == REFERENCE


def document_nats(result: dict[str, Any], eval_set: str) -> np.ndarray:
    """A training's score on an eval set: its final checkpoint's summed nats per document."""
    return np.asarray(result["points"][-1]["losses"][eval_set]["document_nats"], dtype=np.float64)


def paired(
    base: dict[int, dict[str, Any]], arm: dict[int, dict[str, Any]], eval_set: str, documents: dict[str, Any]
) -> PairedComparison | None:
    seeds = sorted(set(base) & set(arm))
    if len(seeds) < 2:
        return None
    return paired_comparison(
        np.stack([document_nats(base[seed], eval_set) for seed in seeds]),
        np.stack([document_nats(arm[seed], eval_set) for seed in seeds]),
        np.asarray(documents["bytes"]),
        np.asarray(documents["tokens"]),
    )


def moved_documents(
    base: dict[int, dict[str, Any]],
    arm: dict[int, dict[str, Any]],
    eval_set: str,
    documents: dict[str, Any],
    starts: list[str] | None,
) -> dict[str, list[dict[str, Any]]]:
    """The documents whose loss the arm lowered and raised most (bits per byte, mean over seeds)."""
    seeds = sorted(set(base) & set(arm))
    gain = np.mean(
        [document_nats(base[s], eval_set) - document_nats(arm[s], eval_set) for s in seeds], axis=0
    )
    per_byte = gain / np.asarray(documents["bytes"], dtype=np.float64) / math.log(2)
    order = np.argsort(per_byte)

    def shown(index: int) -> dict[str, Any]:
        entry: dict[str, Any] = {"document": int(index), "gain_bpb": float(per_byte[index])}
        if starts is not None and index < len(starts):
            entry["start"] = starts[index]
        return entry

    return {
        "helped": [shown(i) for i in order[::-1][:MOVED] if per_byte[i] > 0],
        "hurt": [shown(i) for i in order[:MOVED] if per_byte[i] < 0],
    }


def unigram_baselines(
    plan: Plan, config: PipelineConfig, arm: str, evaluation: dict[str, Any]
) -> dict[str, dict[str, float]]:
    """Per eval set, the cross-entropy of a unigram model of the arm's training tokens (add-half smoothed,
    pooled over its token outputs): what a proxy that learned only word counts would score."""
    from tokenizers import Tokenizer

    from pipeline.ablate.runner import eval_streams, tokenizer_file
    from pipeline.data.sequences import TokenStream
    from pipeline.data.shards import shard_prefixes
    from pipeline.tokenization.encoder import vocabulary_size

    vocabulary = vocabulary_size(Tokenizer.from_file(str(tokenizer_file(plan))))
    counts = np.zeros(vocabulary, dtype=np.float64)
    for ref in plan.arm_tokens(arm):
        if shard_prefixes(ref.path / "train"):
            stream = TokenStream(ref.path / "train")
            for start in range(0, stream.num_tokens, 1 << 24):
                chunk = stream.read(start, min(stream.num_tokens, start + (1 << 24)))
                counts += np.bincount(chunk, minlength=vocabulary)[:vocabulary]
    log_p = np.log((counts + 0.5) / (counts.sum() + 0.5 * vocabulary))
    baselines = {}
    for name, folders in eval_streams(plan, config).items():
        documents = evaluation["documents"].get(name)
        if documents is None:
            continue
        nats, seen = 0.0, 0
        for folder, count in zip(folders, documents["per_folder"], strict=True):
            stream = TokenStream(folder)
            for index in range(count):
                end = int(stream.document_ends[index])
                tokens = stream.read(
                    end - int(stream.document_lengths[index]) + 1, end
                )  # as scored: all but the first
                nats -= float(log_p[tokens].sum())
                seen += len(tokens)
        baselines[name] = {
            "loss": nats / seen if seen else float("nan"),
            "bpb": nats / math.log(2) / sum(documents["bytes"]),
        }
    return baselines


def summary_over_seeds(values: dict[str, float]) -> dict[str, Any]:
    numbers = list(values.values())
    return {"mean": fmean(numbers), "spread": max(numbers) - min(numbers), "per_seed": values}


def curve(results: list[dict[str, Any]], value) -> list[dict[str, float]]:
    by_tokens: dict[int, list[float]] = {}
    for result in results:
        for point in result["points"]:
            by_tokens.setdefault(point["tokens"], []).append(value(point))
    return [
        {"tokens": tokens, "mean": fmean(values), "min": min(values), "max": max(values)}
        for tokens, values in sorted(by_tokens.items())
    ]


def diagnosis(entry: dict[str, Any], base: dict[str, Any], eval_set: str) -> list[str]:
    """Why an arm did not win on ``eval_set``, from what was measured (not a guess)."""
    facts = []
    if entry["epochs"] and base["epochs"]:
        facts.append(f"it repeated its data {entry['epochs']:.2f} times, the base {base['epochs']:.2f}")
    if entry["share_kept"] is not None:
        facts.append(f"it kept {entry['documents']:,} documents ({entry['share_kept']:.1%} of the source)")
    unigram = entry["unigram"].get(eval_set)
    if unigram:
        facts.append(
            f"its loss {entry['eval'][eval_set]['mean']:.3f} nats is {unigram['loss'] - entry['eval'][eval_set]['mean']:.3f} "
            f"below the unigram model of its own data ({unigram['loss']:.3f})"
        )
    points = entry["curves"][eval_set]
    # The last checkpoint may sit a step after the one before it: compare with one well before the end.
    earlier = [p for p in points if p["tokens"] <= 0.9 * points[-1]["tokens"]] if points else []
    if earlier:
        drop = (earlier[-1]["mean"] - points[-1]["mean"]) / earlier[-1]["mean"]
        if drop > STILL_FALLING:
            facts.append(
                f"its loss was still falling at the end ({drop:.1%} over the last "
                f"{points[-1]['tokens'] - earlier[-1]['tokens']:,} tokens): a longer budget may separate the arms"
            )
    return facts


def summarise(
    plan: Plan, config: PipelineConfig, results: list[dict[str, Any]], source_documents: int | None
) -> dict[str, Any]:
    from pipeline.ablate.heldout import read_reference

    spec = plan.spec
    eval_sets = sorted({name for r in results for p in r["points"] for name in p["losses"]})
    tasks = sorted({name for r in results for p in r["points"] for name in p.get("accuracy", {})})
    by_arm: dict[str, dict[int, dict[str, Any]]] = {}
    for result in results:
        by_arm.setdefault(result["variant"], {})[int(result["seed"])] = result
    documents = results[0]["documents"]
    starts = [" ".join(text.split()[:10]) for text in read_reference(spec.reference, spec.max_eval_documents)]
    overrides = {variant.name: list(variant.overrides) for variant in spec.variants}
    arms: dict[str, Any] = {}
    unigrams: dict[tuple[str, ...], dict[str, dict[str, float]]] = {}  # the control trains the base's tokens

    def unigram_of(arm: str, mine: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
        key = tuple(str(ref.path) for ref in plan.arm_tokens(arm))
        if key not in unigrams:
            unigrams[key] = unigram_baselines(plan, config, arm, mine[0]) if mine else {}
        return unigrams[key]

    for arm in spec.arms:
        mine = [by_arm[arm][seed] for seed in sorted(by_arm.get(arm, {}))]
        tokenized = [ref.manifest() for ref in plan.arm_tokens(arm)]
        kept = sum(
            int(manifest.rows.get("train_documents", 0)) + int(manifest.rows.get("validation_documents", 0))
            for manifest in tokenized
        )
        scores: dict[str, Any] = {}
        curves: dict[str, list[dict[str, float]]] = {}

        for name in eval_sets:
            final = {str(r["seed"]): r["points"][-1]["losses"][name] for r in mine}
            scores[name] = {
                **summary_over_seeds({seed: value["loss"] for seed, value in final.items()}),
                "bpb": summary_over_seeds({seed: value["bpb"] for seed, value in final.items()}),
            }
            curves[name] = curve(mine, lambda point, name=name: point["losses"][name]["loss"])
        accuracy: dict[str, Any] = {}
        for name in tasks:
            accuracy[name] = summary_over_seeds(
                {str(r["seed"]): r["points"][-1]["accuracy"][name]["acc"] for r in mine}
            )
            curves[f"{name} accuracy"] = curve(mine, lambda point, name=name: point["accuracy"][name]["acc"])
        arms[arm] = {
            "control": arm == spec.control_name and spec.control,
            "overrides": overrides.get(arm, overrides.get(spec.base, [])),
            "tokens_seen": {str(r["seed"]): r["tokens_seen"] for r in mine},
            "train_tokens_available": mine[0]["train_tokens_available"] if mine else None,
            "epochs": fmean(r["epochs"] for r in mine) if mine and all(r["epochs"] for r in mine) else None,
            "documents": kept,
            "share_kept": kept / source_documents if source_documents else None,
            "snapshot": plan.arm_tokens(arm)[0].snapshot,
            "tokenize_outputs": [f"{ref.corpus}/{ref.snapshot}" for ref in plan.arm_tokens(arm)],
            "runs": {str(r["seed"]): r["run_id"] for r in mine},
            "eval": scores,
            "unigram": unigram_of(arm, mine),
            "accuracy": accuracy,
            "curves": curves,
            "vs_base": None,
            "moved": None,
            "diagnosis": None,
        }
    base = by_arm.get(spec.base, {})
    for arm, entry in arms.items():
        if arm == spec.base:
            continue
        versus = {}
        for name in eval_sets:
            tested = paired(base, by_arm.get(arm, {}), name, documents[name])
            if tested is None:
                continue
            row = tested.to_dict()
            row["judged"] = judged(name)
            if not judged(name):
                row["verdict"] = "not judged"
            row["seeds_for_this_effect"] = seeds_for_effect(tested, tested.effect_bpb)
            versus[name] = row
        entry["vs_base"] = versus
        entry["moved"] = {
            name: moved_documents(
                base, by_arm[arm], name, documents[name], starts if name == REFERENCE else None
            )
            for name in eval_sets
        }
        if versus.get(REFERENCE, {}).get("verdict") != "better":
            entry["diagnosis"] = diagnosis(entry, arms[spec.base], REFERENCE)
    control = arms.get(spec.control_name) if spec.control else None
    noise = None
    if control and control["vs_base"] and REFERENCE in control["vs_base"]:
        row = control["vs_base"][REFERENCE]
        noise = {
            "arm": spec.control_name,
            "effect_bpb": row["effect_bpb"],
            "low_bpb": row["low_bpb"],
            "high_bpb": row["high_bpb"],
            "p_value": row["p_value"],
            "held": row["verdict"] == "within noise",
        }
    return {
        "name": spec.name,
        "source": spec.to_dict()["source"],
        "source_described": spec.source.describe(),
        "base": spec.base,
        "control": spec.control_name if spec.control else None,
        "seeds": list(spec.seeds),
        "tokens": plan.tokens,
        "train_steps": plan.train_steps,
        "tokens_per_step": plan.tokens_per_step,
        "tokenizer": plan.tokenizer,
        "eval_sets": eval_sets,
        "judged_sets": [name for name in eval_sets if judged(name)],
        "documents": {name: documents[name]["documents"] for name in eval_sets},
        "tasks": {name: TASK_NOTE if name == TASK else LOCAL_TASK_NOTE for name in tasks},
        "rule": RULE,
        "alpha": ALPHA,
        "noise_check": noise,
        "variants": arms,
    }


def plot_curves(comparison: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = [*comparison["eval_sets"], *(f"{task} accuracy" for task in comparison.get("tasks", {}))]
    figure, axes = plt.subplots(1, len(sets), figsize=(6 * len(sets), 4.2), squeeze=False)
    for axis, name in zip(axes[0], sets, strict=True):
        for variant, entry in comparison["variants"].items():
            points = entry["curves"][name]
            tokens = [p["tokens"] for p in points]
            style = "--" if entry["control"] else "-"
            line = axis.plot(tokens, [p["mean"] for p in points], style, marker="o", label=variant)[0]
            axis.fill_between(
                tokens,
                [p["min"] for p in points],
                [p["max"] for p in points],
                color=line.get_color(),
                alpha=0.2,
            )
            unigram = entry["unigram"].get(name)
            if unigram and not entry["control"]:
                axis.axhline(unigram["loss"], color=line.get_color(), linestyle=":", linewidth=1)
        if name.endswith(" accuracy"):
            axis.set(title=name, xlabel="training tokens", ylabel="share of items right")
        else:
            axis.set(
                title=f"held-out loss: {name}", xlabel="training tokens", ylabel="cross-entropy (nats/token)"
            )
        axis.legend(fontsize=8)
    figure.suptitle(
        "mean over seeds; band: min to max over seeds; dotted: each variant's unigram baseline (word counts)"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def plot_effects(comparison: dict[str, Any], path: Path) -> None:
    """Each arm's effect against the base with its 95% interval, per eval set (a forest plot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = comparison["eval_sets"]
    names = [name for name, entry in comparison["variants"].items() if entry["vs_base"]]
    figure, axes = plt.subplots(1, len(sets), figsize=(6 * len(sets), 0.5 * len(names) + 2), squeeze=False)
    for axis, name in zip(axes[0], sets, strict=True):
        rows = [comparison["variants"][v]["vs_base"].get(name) for v in names]
        for position, row in enumerate(rows):
            if row is None:
                continue
            color = {"better": "tab:green", "worse": "tab:red"}.get(row["verdict"], "tab:gray")
            axis.errorbar(
                row["effect_bpb"],
                position,
                xerr=[[row["effect_bpb"] - row["low_bpb"]], [row["high_bpb"] - row["effect_bpb"]]],
                fmt="o",
                color=color,
                capsize=4,
            )
        axis.axvline(0, color="black", linewidth=0.8)
        axis.set_yticks(range(len(names)), names)
        judged_note = "" if judged(name) else " (not judged)"
        axis.set(
            title=f"{name}{judged_note}: gain over {comparison['base']}",
            xlabel="bits per byte, base minus arm (right: better); bar: 95% interval",
        )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _effect_cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "—"
    return (
        f"{row['verdict']}: {row['effect_bpb']:+.4f} bpb [{row['low_bpb']:+.4f}, {row['high_bpb']:+.4f}], "
        f"p = {row['p_value']:.3g}"
    )


def page(comparison: dict[str, Any], plots: list[Path]) -> str:
    from pipeline.quality.page import PAGE_STYLE, image_html, table_html

    sets = comparison["eval_sets"]
    tasks = list(comparison.get("tasks", {}))
    header = [
        "arm",
        *(f"{s} loss (mean ± spread)" for s in sets),
        *(f"{s} bits/byte" for s in sets),
        f"{REFERENCE} unigram baseline",
        *(f"{t} acc (mean ± spread)" for t in tasks),
        "tokens",
        "epochs",
        "documents",
        "kept",
    ]
    header += [f"vs {comparison['base']} ({s})" for s in sets]
    rows = []
    for name, entry in comparison["variants"].items():
        tokens = sorted(set(entry["tokens_seen"].values()))
        label = name + (
            " (base)" if name == comparison["base"] else " (A/A control)" if entry["control"] else ""
        )
        unigram = entry["unigram"].get(REFERENCE)
        rows.append(
            [
                label,
                *(f"{entry['eval'][s]['mean']:.4f} ± {entry['eval'][s]['spread']:.4f}" for s in sets),
                *(f"{entry['eval'][s]['bpb']['mean']:.4f}" for s in sets),
                f"{unigram['loss']:.4f} nats, {unigram['bpb']:.4f} bpb" if unigram else None,
                *(
                    f"{entry['accuracy'][t]['mean']:.3f} ± {entry['accuracy'][t]['spread']:.3f}"
                    for t in tasks
                ),
                ", ".join(f"{t:,}" for t in tokens),
                round(entry["epochs"], 2) if entry["epochs"] is not None else None,
                entry["documents"],
                f"{entry['share_kept']:.1%}" if entry["share_kept"] is not None else None,
                *(_effect_cell((entry["vs_base"] or {}).get(s)) if entry["vs_base"] else "—" for s in sets),
            ]
        )
    noise = comparison.get("noise_check")
    if noise is None:
        noise_html = "<p>No A/A control in this ablation (<code>control: false</code>).</p>"
    else:
        css = "pass" if noise["held"] else "warn"
        said = (
            "within noise, as it should be"
            if noise["held"]
            else "called different although it is the same recipe: this run's noise is larger than the test "
            "assumes; read its verdicts with care and add seeds"
        )
        noise_html = (
            f'<p class="{css}"><b>A/A control.</b> {html.escape(noise["arm"])}, the base trained again with each '
            f"seed's weights and another data order: {noise['effect_bpb']:+.4f} bpb "
            f"[{noise['low_bpb']:+.4f}, {noise['high_bpb']:+.4f}], p = {noise['p_value']:.3g}: {html.escape(said)}.</p>"
        )
    moved = []
    for name, entry in comparison["variants"].items():
        found = (entry.get("moved") or {}).get(REFERENCE)
        if not found:
            continue
        for direction in ("helped", "hurt"):
            for item in found[direction]:
                moved.append(
                    [name, direction, item["document"], f"{item['gain_bpb']:+.4f}", item.get("start", "")]
                )
    diagnoses = "".join(
        f"<p><b>{html.escape(name)}</b> is not better than {html.escape(comparison['base'])} on the reference: "
        + html.escape("; ".join(entry["diagnosis"]))
        + ".</p>"
        for name, entry in comparison["variants"].items()
        if entry.get("diagnosis") and not entry["control"]
    )
    overrides = [
        [name, "; ".join(entry["overrides"]) or "(the config as it is)"]
        for name, entry in comparison["variants"].items()
    ]
    title = html.escape(comparison["name"])
    return f"""<!DOCTYPE html><html><head><meta charset="utf-8">
<title>Ablation: {title}</title><style>{PAGE_STYLE}</style></head><body>
<h1>Ablation: {title}</h1>
<p>Source {html.escape(comparison["source_described"])}; every
arm trained on {comparison["tokens"]:,} tokens ({comparison["train_steps"]} steps) with seeds
{html.escape(str(comparison["seeds"]))} and tokenizer {html.escape(comparison["tokenizer"])}; scored on
{html.escape(", ".join(f"{n:,} {s} documents" for s, n in comparison["documents"].items()))}.</p>
<h2>Comparison</h2>{table_html(header, rows)}
{noise_html}
<p><b>Rule.</b> {html.escape(comparison["rule"])}. The base's validation split is reported, not judged: it is
drawn from what the base trains on.</p>
{diagnoses}
{"".join(f"<p><b>{html.escape(t)}.</b> {html.escape(note)}.</p>" for t, note in comparison.get("tasks", {}).items())}
<h2>Curves</h2>{"".join(image_html(path, wide=True) for path in plots)}
<h2>Documents that moved most</h2>
<p>Reference documents whose loss each arm lowered (helped) or raised (hurt) most against the base, in bits per
byte, mean over seeds.</p>{table_html(["arm", "", "document", "gain (bpb)", "starts"], moved)}
<h2>Variants</h2>{table_html(["arm", "overrides"], overrides)}
</body></html>
"""


def track(
    config: PipelineConfig, comparison: dict[str, Any], results: list[dict[str, Any]], folder: Path
) -> str | None:
    """A parent MLflow run for the ablation and one child per arm and seed; found again on a rerun."""
    from pipeline.tracking.mlflow_runs import ensure_experiment, mlflow_client

    try:
        client = mlflow_client(config)
        experiment = ensure_experiment(client, config)
        key = f"tags.`pretrain.ablation` = '{comparison['name']}'"
        found = client.search_runs([experiment], f"{key} and tags.`pretrain.ablation_role` = 'parent'")
        parent = (
            found[0].info.run_id
            if found
            else client.create_run(
                experiment,
                run_name=f"ablate {comparison['name']}",
                tags={"pretrain.ablation": comparison["name"], "pretrain.ablation_role": "parent"},
            ).info.run_id
        )
        client.log_param(parent, "base", comparison["base"])
        client.log_param(parent, "tokens", comparison["tokens"])
        children = {
            run.data.tags.get("pretrain.ablation_training"): run.info.run_id
            for run in client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{parent}'")
        }
        for result in results:
            if result["run_id"] in children:
                continue
            child = client.create_run(
                experiment,
                run_name=f"{result['variant']} seed {result['seed']}",
                tags={
                    "mlflow.parentRunId": parent,
                    "pretrain.ablation": comparison["name"],
                    "pretrain.ablation_training": result["run_id"],
                    "pretrain.train_mlflow_run": str(result.get("mlflow_run_id")),
                },
            ).info.run_id
            client.log_param(child, "variant", result["variant"])
            client.log_param(child, "seed", result["seed"])
            client.log_param(child, "train_path", result["train_path"])
            client.log_metric(child, "tokens_seen", result["tokens_seen"])
            client.log_metric(child, "epochs", result["epochs"] or 0.0)
            for point in result["points"]:
                for name, loss in point["losses"].items():
                    client.log_metric(child, f"eval_loss_{name}", loss["loss"], step=point["tokens"])
                    client.log_metric(child, f"eval_bpb_{name}", loss["bpb"], step=point["tokens"])
                for name, scored in point.get("accuracy", {}).items():
                    client.log_metric(child, f"eval_acc_{name}", scored["acc"], step=point["tokens"])
            client.set_terminated(child)
        for variant, entry in comparison["variants"].items():
            prefix = variant.replace("+", "_")  # MLflow names allow no '+'
            for name, score in entry["eval"].items():
                client.log_metric(parent, f"{prefix}.{name}.mean", score["mean"])
                client.log_metric(parent, f"{prefix}.{name}.spread", score["spread"])
                client.log_metric(parent, f"{prefix}.{name}.bpb", score["bpb"]["mean"])
            for name, row in (entry["vs_base"] or {}).items():
                for field in ("effect_bpb", "low_bpb", "high_bpb", "p_value"):
                    client.log_metric(parent, f"{prefix}.{name}.{field}", row[field])
            for name, score in entry.get("accuracy", {}).items():
                client.log_metric(parent, f"{prefix}.{name}.acc.mean", score["mean"])
                client.log_metric(parent, f"{prefix}.{name}.acc.spread", score["spread"])
        for name in ("comparison.json", "report.html"):
            client.log_artifact(parent, str(folder / name))
        client.set_terminated(parent)
        return str(parent)
    except Exception as exc:  # tracking is a record, not the result: warn unless required
        if config.tracking.required:
            raise
        log.warning("ablation not recorded in MLflow: %s", exc)
        return None


def compare(
    plan: Plan, results: list[dict[str, Any]], config_path: str | Path | None, overrides: list[str]
) -> Manifest:
    config = load_config(config_path, overrides)
    spec = plan.spec
    counted = [part.ref.manifest().rows.get("documents") for part in plan.parts]
    source_documents = None if None in counted else sum(int(count or 0) for count in counted)
    comparison = summarise(plan, config, results, source_documents)
    inputs = [ref for variant in spec.variants for ref in plan.final_tokens(variant.name)]
    output = ablation_ref(config, spec)
    with StageOutput(output, config, inputs) as out:
        (out.path / "plots").mkdir()
        plots = [out.path / "plots" / "curves.png", out.path / "plots" / "effects.png"]
        plot_curves(comparison, plots[0])
        plot_effects(comparison, plots[1])
        (out.path / "plan.json").write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
        (out.path / "comparison.json").write_text(json.dumps(comparison, indent=2) + "\n")
        (out.path / "report.html").write_text(page(comparison, plots))
        parent = track(config, comparison, results, out.path)
        verdicts = {
            name: {s: row["verdict"] for s, row in entry["vs_base"].items()}
            for name, entry in comparison["variants"].items()
            if entry["vs_base"]
        }
        return out.commit(
            rows={"variants": len(spec.variants), "arms": len(spec.arms), "trainings": len(results)},
            extra={
                "verdicts": verdicts,
                "tokens": plan.tokens,
                "mlflow_run_id": parent,
                "noise_check": comparison["noise_check"],
            },
        )
