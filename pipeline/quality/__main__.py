"""`python -m pipeline.quality` / `pretrain quality`: a data-quality report (coverage, diversity, embeddings)."""

from __future__ import annotations

from pipeline.core.cli import run_cli, stage_main


def main(argv: list[str] | None = None) -> int:
    from pipeline.quality.report import run

    return stage_main(argv, stage="quality", description=__doc__, run=run, input_stages=("clean",))


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
