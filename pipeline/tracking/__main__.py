"""`python -m pipeline.tracking` / `pretrain report`: record a training snapshot as an MLflow run."""

from __future__ import annotations

from pipeline.core.cli import run_cli, stage_main


def main(argv: list[str] | None = None) -> int:
    from pipeline.tracking.mlflow_report import run

    return stage_main(argv, stage="report", description=__doc__, run=run, input_stages=("train",))


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
