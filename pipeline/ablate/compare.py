"""The comparison of an ablation: per variant and eval set, the mean and spread of the held-out loss over seeds,
tokens, epochs, documents and share kept; loss curves over tokens; a verdict per variant against the base.
Written as ``comparison.json``, ``report.html`` (+ ``plots/``) under ``<root>/<corpus>/ablate/<name>/``, and
recorded in MLflow as a parent run with one child run per variant and seed.

**The verdict rule.** For each eval set, a variant's score is its final held-out loss averaged over seeds, its
spread the range (max - min) of that loss over seeds. The noise floor of a comparison is the larger of the two
spreads. A variant is *better* than the base when its mean loss is lower by more than the noise floor, *worse*
when higher by more, and *within noise* otherwise. With two seeds this is a coarse floor; more seeds tighten it.
"""

from __future__ import annotations

import html
import json
import logging
from pathlib import Path
from statistics import fmean
from typing import Any

from pipeline.ablate.plan import Plan, ablation_ref
from pipeline.config import PipelineConfig, load_config
from pipeline.core.manifest import Manifest
from pipeline.core.storage import StageOutput
from pipeline.evaluate.harness import TASK

log = logging.getLogger(__name__)
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
    "score = final held-out loss, mean over seeds; spread = max - min over seeds; noise floor = the larger "
    "spread of the variant and the base; better / worse = mean loss lower / higher than the base's by more "
    "than the noise floor, else within noise"
)


def verdict(base: dict[str, float], other: dict[str, float]) -> dict[str, Any]:
    noise = max(base["spread"], other["spread"])
    gain = base["mean"] - other["mean"]
    word = "better" if gain > noise else "worse" if -gain > noise else "within noise"
    return {"gain_over_base": gain, "noise_floor": noise, "verdict": word}


def summarise(plan: Plan, results: list[dict[str, Any]], source_documents: int | None) -> dict[str, Any]:
    spec = plan.spec
    eval_sets = sorted({name for r in results for p in r["points"] for name in p["losses"]})
    tasks = sorted({name for r in results for p in r["points"] for name in p.get("accuracy", {})})
    variants: dict[str, Any] = {}
    for variant in spec.variants:
        mine = [r for r in results if r["variant"] == variant.name]
        tokenized = [ref.manifest() for ref in plan.final_tokens(variant.name)]
        documents = sum(
            int(manifest.rows.get("train_documents", 0)) + int(manifest.rows.get("validation_documents", 0))
            for manifest in tokenized
        )
        scores: dict[str, Any] = {}
        curves: dict[str, list[dict[str, float]]] = {}
        for name in eval_sets:
            final = {str(r["seed"]): r["points"][-1]["losses"][name]["loss"] for r in mine}
            values = list(final.values())
            scores[name] = {"mean": fmean(values), "spread": max(values) - min(values), "per_seed": final}
            by_tokens: dict[int, list[float]] = {}
            for r in mine:
                for point in r["points"]:
                    by_tokens.setdefault(point["tokens"], []).append(point["losses"][name]["loss"])
            curves[name] = [
                {"tokens": tokens, "mean": fmean(losses), "min": min(losses), "max": max(losses)}
                for tokens, losses in sorted(by_tokens.items())
            ]
        accuracy: dict[str, Any] = {}
        for name in tasks:
            final = {str(r["seed"]): r["points"][-1]["accuracy"][name]["acc"] for r in mine}
            values = list(final.values())
            accuracy[name] = {"mean": fmean(values), "spread": max(values) - min(values), "per_seed": final}
            by_tokens = {}
            for r in mine:
                for point in r["points"]:
                    by_tokens.setdefault(point["tokens"], []).append(point["accuracy"][name]["acc"])
            curves[f"{name} accuracy"] = [
                {"tokens": tokens, "mean": fmean(values), "min": min(values), "max": max(values)}
                for tokens, values in sorted(by_tokens.items())
            ]
        variants[variant.name] = {
            "overrides": list(variant.overrides),
            "tokens_seen": {str(r["seed"]): r["tokens_seen"] for r in mine},
            "train_tokens_available": mine[0]["train_tokens_available"] if mine else None,
            "epochs": fmean(r["epochs"] for r in mine) if mine else None,
            "documents": documents,
            "share_kept": documents / source_documents if source_documents else None,
            "snapshot": plan.final_tokens(variant.name)[0].snapshot,
            "tokenize_outputs": [f"{ref.corpus}/{ref.snapshot}" for ref in plan.final_tokens(variant.name)],
            "runs": {str(r["seed"]): r["run_id"] for r in mine},
            "eval": scores,
            "accuracy": accuracy,
            "curves": curves,
        }
    base = variants[spec.base]
    for name, entry in variants.items():
        entry["verdict"] = (
            {s: verdict(base["eval"][s], entry["eval"][s]) for s in eval_sets} if name != spec.base else None
        )
    return {
        "name": spec.name,
        "source": spec.to_dict()["source"],
        "source_described": spec.source.describe(),
        "base": spec.base,
        "seeds": list(spec.seeds),
        "tokens": plan.tokens,
        "train_steps": plan.train_steps,
        "tokens_per_step": plan.tokens_per_step,
        "tokenizer": plan.tokenizer,
        "eval_sets": eval_sets,
        "tasks": {name: TASK_NOTE if name == TASK else LOCAL_TASK_NOTE for name in tasks},
        "rule": RULE,
        "variants": variants,
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
            line = axis.plot(tokens, [p["mean"] for p in points], marker="o", label=variant)[0]
            axis.fill_between(
                tokens,
                [p["min"] for p in points],
                [p["max"] for p in points],
                color=line.get_color(),
                alpha=0.2,
            )
        if name.endswith(" accuracy"):
            axis.set(title=name, xlabel="training tokens", ylabel="share of items right")
        else:
            axis.set(
                title=f"held-out loss: {name}", xlabel="training tokens", ylabel="cross-entropy (nats/token)"
            )
        axis.legend(fontsize=8)
    figure.suptitle("mean over seeds; band: min to max over seeds")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def plot_final(comparison: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = comparison["eval_sets"]
    names = list(comparison["variants"])
    figure, axes = plt.subplots(1, len(sets), figsize=(6 * len(sets), 0.5 * len(names) + 2), squeeze=False)
    for axis, name in zip(axes[0], sets, strict=True):
        scores = [comparison["variants"][v]["eval"][name] for v in names]
        axis.barh(
            names[::-1],
            [s["mean"] for s in scores[::-1]],
            xerr=[[s["spread"] / 2 for s in scores[::-1]], [s["spread"] / 2 for s in scores[::-1]]],
            color="tab:blue",
        )
        low = min(s["mean"] - s["spread"] for s in scores)
        axis.set_xlim(left=max(0.0, low - 0.1 * abs(low)))
        axis.set(title=f"final held-out loss: {name}", xlabel="nats/token (bar: seed range)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def page(comparison: dict[str, Any], plots: list[Path]) -> str:
    from pipeline.quality.page import PAGE_STYLE, image_html, table_html

    sets = comparison["eval_sets"]
    tasks = list(comparison.get("tasks", {}))
    header = [
        "variant",
        *(f"{s} loss (mean ± spread)" for s in sets),
        *(f"{t} acc (mean ± spread)" for t in tasks),
        "tokens",
        "epochs",
        "documents",
        "kept",
    ]
    header += [f"vs base ({s})" for s in sets]
    rows = []
    for name, entry in comparison["variants"].items():
        tokens = sorted(set(entry["tokens_seen"].values()))
        rows.append(
            [
                name + (" (base)" if name == comparison["base"] else ""),
                *(f"{entry['eval'][s]['mean']:.4f} ± {entry['eval'][s]['spread']:.4f}" for s in sets),
                *(
                    f"{entry['accuracy'][t]['mean']:.3f} ± {entry['accuracy'][t]['spread']:.3f}"
                    for t in tasks
                ),
                ", ".join(f"{t:,}" for t in tokens),
                round(entry["epochs"], 2) if entry["epochs"] is not None else None,
                entry["documents"],
                f"{entry['share_kept']:.1%}" if entry["share_kept"] is not None else None,
                *(
                    f"{entry['verdict'][s]['verdict']} ({entry['verdict'][s]['gain_over_base']:+.4f} vs "
                    f"noise {entry['verdict'][s]['noise_floor']:.4f})"
                    if entry["verdict"]
                    else "—"
                    for s in sets
                ),
            ]
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
variant trained on {comparison["tokens"]:,} tokens ({comparison["train_steps"]} steps) with seeds
{html.escape(str(comparison["seeds"]))} and tokenizer {html.escape(comparison["tokenizer"])}.</p>
<h2>Comparison</h2>{table_html(header, rows)}
<p><b>Rule.</b> {html.escape(comparison["rule"])}.</p>
{"".join(f"<p><b>{html.escape(t)}.</b> {html.escape(note)}.</p>" for t, note in comparison.get("tasks", {}).items())}
<h2>Curves</h2>{"".join(image_html(path, wide=True) for path in plots)}
<h2>Variants</h2>{table_html(["variant", "overrides"], overrides)}
</body></html>
"""


def track(
    config: PipelineConfig, comparison: dict[str, Any], results: list[dict[str, Any]], folder: Path
) -> str | None:
    """A parent MLflow run for the ablation and one child per variant and seed; found again on a rerun."""
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
                for name, scored in point.get("accuracy", {}).items():
                    client.log_metric(child, f"eval_acc_{name}", scored["acc"], step=point["tokens"])
            client.set_terminated(child)
        for variant, entry in comparison["variants"].items():
            for name, score in entry["eval"].items():
                key = f"{variant.replace('+', '_')}.{name}"  # MLflow names allow no '+'
                client.log_metric(parent, f"{key}.mean", score["mean"])
                client.log_metric(parent, f"{key}.spread", score["spread"])
            for name, score in entry.get("accuracy", {}).items():
                key = f"{variant.replace('+', '_')}.{name}.acc"
                client.log_metric(parent, f"{key}.mean", score["mean"])
                client.log_metric(parent, f"{key}.spread", score["spread"])
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
    comparison = summarise(plan, results, source_documents)
    inputs = [ref for variant in spec.variants for ref in plan.final_tokens(variant.name)]
    output = ablation_ref(config, spec)
    with StageOutput(output, config, inputs) as out:
        (out.path / "plots").mkdir()
        plots = [out.path / "plots" / "curves.png", out.path / "plots" / "final_loss.png"]
        plot_curves(comparison, plots[0])
        plot_final(comparison, plots[1])
        (out.path / "plan.json").write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
        (out.path / "comparison.json").write_text(json.dumps(comparison, indent=2) + "\n")
        (out.path / "report.html").write_text(page(comparison, plots))
        parent = track(config, comparison, results, out.path)
        verdicts = {
            name: {s: v["verdict"] for s, v in entry["verdict"].items()}
            for name, entry in comparison["variants"].items()
            if entry["verdict"]
        }
        return out.commit(
            rows={"variants": len(spec.variants), "trainings": len(results)},
            extra={"verdicts": verdicts, "tokens": plan.tokens, "mlflow_run_id": parent},
        )
