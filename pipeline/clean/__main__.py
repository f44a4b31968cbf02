"""`python -m pipeline.clean` / `pretrain clean`: extract, normalise, filter and de-duplicate a crawl in Spark.

Also runs under spark-submit on a cluster:
`spark-submit --master spark://host:7077 pipeline/clean/__main__.py --snapshot 2026-11-29`.
"""

from __future__ import annotations

from pipeline.core.cli import run_cli, stage_main


def main(argv: list[str] | None = None) -> int:
    from pipeline.clean.job import run

    return stage_main(argv, stage="clean", description=__doc__, run=run, input_stages=("crawl",))


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
