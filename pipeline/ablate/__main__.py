"""`pretrain ablate`: does this recipe, or this one change to it, give a better model?

Runs the corpus stages once per variant (a variant is config overrides for clean, dedup, classify,
decontaminate; outputs identical between variants are made once and shared), tokenizes every variant with one
tokenizer, trains the same proxy model on every variant for the same number of tokens with each seed, scores
every checkpoint on the same held-out reference text, and writes the comparison to
<data_root>/<corpus>/ablate/<name>/ (report.html, comparison.json, plots/) and MLflow. Details:
docs/ablations.md.

examples:
  pretrain ablate --snapshot 2026-11-29 --reference ref.jsonl --tokens 200000 \\
      --variant none --variant rules --variant rules+dedup --set model.preset=tiny --dry-run
  pretrain ablate --spec ablation.yaml          # name, source, variants, seeds, tokens, reference (YAML)
  pretrain ablate --mixture '[{corpus: web, snapshots: last:2, weight: 3}, {corpus: books}]' ...

A variant named like a preset (none, rules, rules+dedup) without overrides takes the preset's; add overrides
with --variant NAME:KEY=VALUE (repeatable). A rerun skips finished stage outputs and trainings.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from pipeline.ablate.spec import PRESETS, AblationSpec, parse_spec
from pipeline.core.arguments import ArgumentParser
from pipeline.core.cli import run_cli
from pipeline.core.config import ConfigError, read_yaml_file


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="pretrain ablate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spec", type=Path, help="ablation YAML (pipeline/ablate/spec.py shows the keys)")
    parser.add_argument("--name", help="the ablation's name: its folder and MLflow run (default: ablation)")
    parser.add_argument("--snapshot", help="the source snapshot (the corpus stages' input)")
    parser.add_argument(
        "--mixture",
        metavar="YAML",
        help="instead of --snapshot, a weighted mixture of corpora and snapshots as data.mixture declares one, "
        "e.g. '[{corpus: web, snapshots: last:2, weight: 3}, {corpus: books}]'",
    )
    parser.add_argument(
        "--source-stage", choices=["ingest", "crawl"], help="what the source is (default ingest)"
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME[:KEY=VALUE]",
        help=f"a variant, or one override of it (repeatable); presets: {', '.join(PRESETS)}",
    )
    parser.add_argument("--base", help="the variant the others are compared with (default: the first)")
    parser.add_argument("--reference", type=Path, help="held-out reference text: JSONL with 'text', or .txt")
    parser.add_argument("--tokens", type=int, help="the token budget of every training")
    parser.add_argument("--seeds", help="comma-separated seeds, at least two (default 0,1,2)")
    parser.add_argument(
        "--control",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="train the base again with another data order, an A/A control that shows this ablation's own "
        "noise floor (default: on)",
    )
    parser.add_argument("--eval-points", type=int, help="held-out evaluations during training (default 4)")
    parser.add_argument("--tokenizer", help="a stored tokenizer for every variant (default: train one)")
    parser.add_argument(
        "--task",
        dest="tasks",
        action="append",
        default=[],
        metavar="NAME",
        help="an lm-eval multiple-choice task present on this machine, scored too (repeatable)",
    )
    parser.add_argument("--task-folder", type=Path, help="a folder of your own lm-eval task YAMLs")
    parser.add_argument("--config", "-c", metavar="YAML", help="pipeline config (proxy model, training, ...)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the plan: stages to run or reuse, trainings"
    )
    return parser


def spec_from_arguments(args: argparse.Namespace) -> AblationSpec:
    data: dict[str, Any] = dict(read_yaml_file(args.spec)) if args.spec else {}
    source = data.get("source") or {}
    source = {"snapshot": source} if isinstance(source, str) else dict(source)
    if args.snapshot and args.mixture:
        raise ConfigError("--snapshot or --mixture: the source is one snapshot or a mixture, not both")
    if args.snapshot:
        source.pop("mixture", None)
        source["snapshot"] = args.snapshot
    if args.mixture:
        source.pop("snapshot", None)
        try:
            source["mixture"] = yaml.safe_load(args.mixture)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--mixture: not YAML: {exc}") from None
    if args.source_stage:
        source["stage"] = args.source_stage
    if source:
        data["source"] = source
    if args.variant:
        variants: dict[str, list[str] | None] = {}
        for item in args.variant:
            name, sep, override = item.partition(":")
            if sep and "=" not in override:
                raise ConfigError(f"--variant {item!r}: NAME or NAME:KEY=VALUE")
            entry = variants.setdefault(name, None)
            if sep:
                variants[name] = [*(entry or PRESETS.get(name, [])), override]
        data["variants"] = variants
    for key in ("name", "base", "tokens", "eval_points", "tokenizer", "control"):
        if getattr(args, key) is not None:
            data[key] = getattr(args, key)
    if args.reference:
        data["reference"] = str(args.reference.resolve())
    if args.tasks:
        data["tasks"] = args.tasks
    if args.task_folder:
        data["task_folder"] = str(args.task_folder.resolve())
    if args.seeds:
        try:
            data["seeds"] = [int(seed) for seed in args.seeds.split(",") if seed.strip()]
        except ValueError:
            raise ConfigError(f"--seeds: comma-separated whole numbers, not {args.seeds!r}") from None
    return parse_spec(data, args.spec.parent if args.spec else Path())


def main(argv: list[str] | None = None) -> int:
    from pipeline.ablate.plan import make_plan
    from pipeline.ablate.runner import run_ablation

    args = build_parser().parse_args(argv)
    spec = spec_from_arguments(args)
    if args.dry_run:
        print(make_plan(spec, args.config, args.overrides).describe())
        return 0
    manifest = run_ablation(spec, args.config, args.overrides)
    for variant, verdicts in manifest.extra["verdicts"].items():
        shown = ", ".join(f"{name}: {word}" for name, word in verdicts.items())
        print(f"{variant} vs {spec.base}: {shown}", file=sys.stderr)
    noise = manifest.extra.get("noise_check")
    if noise and not noise["held"]:
        print(
            f"warning: the A/A control {noise['arm']} came out different from {spec.base} (p = "
            f"{noise['p_value']:.3g}): this run's noise exceeds what the test assumes; add seeds",
            file=sys.stderr,
        )
    print(manifest.path)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
