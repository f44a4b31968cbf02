"""Arguments every stage entrypoint shares: config file, overrides, snapshot."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import UTC, datetime

from pipeline.core.config import ConfigError, PipelineConfig, load_config
from pipeline.core.storage import MissingInputError, validate_snapshot


def stage_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "config precedence: defaults < --config YAML < PRETRAIN__SECTION__KEY env vars < --set\n"
            "example: %(prog)s --snapshot 2026-11-29 --set project.corpus=web --set spark.master=local[4]"
        ),
    )
    parser.add_argument("--config", "-c", metavar="YAML", help="config file (default: built-in defaults)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key, e.g. train.steps=100 (repeatable)",
    )
    parser.add_argument(
        "--snapshot",
        default=None,
        help="snapshot name; default: today's UTC date (Airflow passes its logical date)",
    )
    return parser


def default_snapshot() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d")


def resolve(args: argparse.Namespace) -> tuple[PipelineConfig, str]:
    config = load_config(args.config, args.overrides)
    snapshot = validate_snapshot(args.snapshot or default_snapshot())
    return config, snapshot


def stage_main(
    argv: list[str] | None,
    *,
    stage: str,
    description: str,
    run: Callable,
    input_stages: tuple[str, ...] = (),
    component: str | None = None,
) -> int:
    """The shared body of every `python -m pipeline.<stage>` entrypoint.

    Parses --config/--set/--snapshot (and --input-stage when the stage reads one input), sets up logging,
    calls ``run(config, inputs, output)`` inside an MLflow stage run (``pipeline.tracking.mlflow_runs``)
    and prints the published output folder.
    """
    from pipeline.core.logs import setup_logging
    from pipeline.core.storage import DatasetRef

    parser = stage_parser(f"pretrain {stage}", description)
    if len(input_stages) == 1:
        parser.add_argument(
            "--input-stage",
            default=input_stages[0],
            help=f"stage whose output to read (default: {input_stages[0]})",
        )
    args = parser.parse_args(argv)
    config, snapshot = resolve(args)
    if len(input_stages) == 1:
        input_stages = (args.input_stage,)
    setup_logging(config, component or stage)
    inputs = [DatasetRef.of(config, name, snapshot) for name in input_stages]
    # One nested MLflow run per stage execution; a tracking failure warns unless tracking.required.
    from pipeline.tracking.mlflow_runs import track_stage

    with track_stage(config, stage, snapshot, inputs) as tracking:
        manifest = run(config, inputs, DatasetRef.of(config, stage, snapshot))
        tracking.record(manifest)
    print(manifest.path)
    return 0


def run_cli(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Turn expected failures into one clear line and exit status 2 instead of a traceback."""
    try:
        return main(argv)
    except (ConfigError, MissingInputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
