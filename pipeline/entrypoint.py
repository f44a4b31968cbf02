"""What every stage entrypoint shares: its arguments, its start-up, and one-line errors.

Each ``python -m pipeline.<package>`` (and so `pretrain <stage>` and spark-submit) goes through
``stage_main``: the stage's inputs default to what the registry (``pipeline.stages``) says it reads, the
config is resolved and validated before any work starts, and the run is recorded in MLflow.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from pipeline.config import PipelineConfig, load_config
from pipeline.core.arguments import ArgumentParser
from pipeline.core.lineage_events import stage_run_events
from pipeline.core.locks import OutputLock
from pipeline.core.logs import setup_logging
from pipeline.core.spark import input_read_errors
from pipeline.core.storage import DatasetRef, validate_snapshot
from pipeline.stages import STAGES
from pipeline.stages import stage as registered_stage


def stage_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = ArgumentParser(
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


def add_input_stage_argument(parser: argparse.ArgumentParser, stage: str) -> None:
    """``--input-stage`` for a stage that reads one other stage, defaulting to the registry's."""
    default = registered_stage(stage).default_input
    if default is not None:
        # A registered stage's name only: the value becomes a folder under the data root.
        parser.add_argument(
            "--input-stage",
            default=default,
            choices=[entry.name for entry in STAGES if entry.name != stage],
            metavar="STAGE",
            help=f"stage whose output to read (default: {default})",
        )


def default_snapshot() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d")


def resolve(args: argparse.Namespace) -> tuple[PipelineConfig, str]:
    config = load_config(args.config, args.overrides)
    snapshot = validate_snapshot(args.snapshot or default_snapshot())
    return config, snapshot


def start_logging(config: PipelineConfig, component: str, rank: int | None = None) -> Path:
    """ECS log files and the console, plus the in-process Elasticsearch shipper when configured."""
    log_file = setup_logging(config, component, rank=rank)
    if config.logging.ship_in_process:
        # Optional: ship to Elasticsearch from this process too (`pretrain ship-logs` is the other way).
        from pipeline.logshipping.log_shipper import start_background_shipper

        start_background_shipper(config)
    return log_file


def announce_data_root(config: PipelineConfig, stage: str, snapshot: str) -> None:
    """One line on stderr before any work, so nobody wonders where the output went."""
    print(f"{stage} {snapshot}: data root {config.project.data_root}", file=sys.stderr, flush=True)


def input_run(config: PipelineConfig, snapshot: str, inputs: list[DatasetRef]) -> str | None:
    """The run a per-run stage writes by default: the run it reads (the report of a training run is
    filed under that run's id)."""
    return inputs[0].run if inputs else None


def stage_main(
    argv: list[str] | None,
    *,
    stage: str,
    description: str,
    run: Callable | None = None,
    component: str | None = None,
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    as_overrides: Callable[[argparse.Namespace], list[str]] | None = None,
    name_run: Callable[[PipelineConfig, str, list[DatasetRef]], str | None] = input_run,
    resolve_inputs: Callable[[PipelineConfig, str, str], list[DatasetRef]] | None = None,
) -> int:
    """The shared body of every `python -m pipeline.<package>` entrypoint.

    Parses --config/--set/--snapshot (and --input-stage, defaulting to the stage the registry says it
    reads), sets up logging, calls the stage's ``run(config, inputs, output)`` (the registry's; a test may
    pass its own) inside an MLflow stage run
    (``pipeline.tracking.mlflow_runs``) and prints the published output folder. A stage's own options
    (``add_arguments``) are shorthands for config keys (``as_overrides``), under any explicit ``--set``.
    A stage that keeps one output per run writes the run ``name_run(config, snapshot, inputs)`` says,
    which the config then names. ``resolve_inputs(config, snapshot, input_stage)``, when given, says
    what the stage reads instead (training: every snapshot of a declared mixture).
    """
    parser = stage_parser(f"pretrain {stage}", description)
    add_input_stage_argument(parser, stage)
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args(argv)
    if run is None:
        run = registered_stage(stage).run_function()  # after --help, which needs none of Spark or torch
    if as_overrides is not None:
        args.overrides = [*as_overrides(args), *args.overrides]
    config, snapshot = resolve(args)
    announce_data_root(config, stage, snapshot)
    reads = registered_stage(stage).reads
    input_stages = [args.input_stage, *reads[1:]] if reads else []
    # A missing input fails here, in a second, before Spark, torchrun or an MLflow run start.
    inputs: list[DatasetRef] = resolve_inputs(config, snapshot, input_stages[0]) if resolve_inputs else []
    for name in input_stages[1:] if resolve_inputs else input_stages:
        # The per-run outputs a stage reads are those of one training run: the run of its first input.
        same_run = inputs[0].run if inputs and config.keeps_runs(name) else None
        inputs.append(DatasetRef.of(config, name, snapshot, same_run).require())
    start_logging(config, component or stage)
    if config.keeps_runs(stage):
        config = config.with_run(name_run(config, snapshot, inputs))
    output = DatasetRef.of(config, stage, snapshot)
    if output.run is not None:
        print(f"{stage} {snapshot}: run {output.run}", file=sys.stderr, flush=True)
    # One writer per output, from before Spark or MLflow start to the end (StageOutput takes it again).
    with OutputLock(output.path, what=output.what):
        # One nested MLflow run per stage execution; a tracking failure warns unless tracking.required.
        from pipeline.tracking.mlflow_runs import track_stage

        # OpenLineage START/COMPLETE/FAIL when the client is configured (and no client otherwise). The MLflow
        # run starts beside the stage's work, but before training's ranks, which log into it.
        background = registered_stage(stage).runner != "torchrun"
        with (
            stage_run_events(config, stage, snapshot, inputs, output) as lineage,
            track_stage(config, stage, snapshot, inputs, background=background) as tracking,
            input_read_errors(inputs),
        ):
            manifest = run(config, inputs, output)
            tracking.record(manifest)
            lineage(manifest)
    print(manifest.path)
    return 0
