"""`python -m pipeline.report` / `pretrain report`: record a training run in MLflow and register its model.

Reads a training run, train/<snapshot>/<run>/ (checkpoints, metrics.jsonl; the latest complete run unless
train.run_id names one), and completes its MLflow run: params, metrics, plots, sample generations, the
model, and a Model Registry version (tracking.register_model). Writes report/<snapshot>/<run>/mlflow_run.json.
"""

from __future__ import annotations

from pipeline.core.cli import run_cli
from pipeline.core.proc import exit_now
from pipeline.entrypoint import stage_main


def main(argv: list[str] | None = None) -> int:
    return stage_main(argv, stage="report", description=__doc__)


if __name__ == "__main__":
    exit_now(run_cli(main))  # without the interpreter's teardown: see pipeline.core.proc.exit_now
