"""`python -m pipeline.tracking` / `pretrain report`: record a training snapshot as an MLflow run."""

from __future__ import annotations

from pipeline.core.cli import resolve, run_cli, stage_parser
from pipeline.core.logs import setup_logging
from pipeline.core.storage import DatasetRef


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("pretrain report", __doc__)
    config, snapshot = resolve(parser.parse_args(argv))
    setup_logging(config, "report")
    from pipeline.tracking.mlflow_report import STAGE, run

    manifest = run(config, [DatasetRef.of(config, "train", snapshot)], DatasetRef.of(config, STAGE, snapshot))
    print(manifest.extra["mlflow_run_id"])
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
