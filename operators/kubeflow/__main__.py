"""Print the job the Kubernetes launcher would create for a snapshot (YAML, validated): a TrainJob, or a
PyTorchJob with the setting "api": "pytorchjob-v1"."""

from __future__ import annotations

import argparse
import json
import sys

import yaml

from operators.kubeflow.job_parts import KubernetesJobSettings
from operators.kubeflow.trainjob import render_job
from pipeline.core.lineage import Lineage
from pipeline.entrypoint import add_input_stage_argument, resolve, stage_parser


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the embedded config, the container script) as readable `|` blocks."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _text)


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("python -m operators.kubeflow", __doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--name", default="pretrain-train-example", help="job name (default: %(default)s)")
    add_input_stage_argument(parser, "train")
    parser.add_argument(
        "--settings",
        default="{}",
        metavar="JSON",
        help='Kubernetes settings, e.g. \'{"image": "registry/pretrain:1", "namespace": "ml", '
        '"api": "pytorchjob-v1"}\'',
    )
    args = parser.parse_args(argv)
    config, snapshot = resolve(args)
    settings = KubernetesJobSettings().merged(json.loads(args.settings))
    job = render_job(
        config,
        name=args.name,
        snapshot=snapshot,
        input_stage=args.input_stage,
        settings=settings,
        lineage=Lineage.from_env(),
    )
    yaml.dump(job, sys.stdout, Dumper=_BlockDumper, sort_keys=False, width=110)
    return 0


if __name__ == "__main__":
    from pipeline.core.cli import run_cli

    raise SystemExit(run_cli(main))
