"""`python -m pipeline.clean` / `pretrain clean`: extract, normalise, language-identify, quality-filter
(Gopher, C4, FineWeb rules) and PII-redact a crawl in Spark; kept pages go to documents/, dropped ones to
excluded/ with the rule that dropped them (docs/clean.md).

Also runs under spark-submit on a cluster:
`spark-submit --master spark://host:7077 pipeline/clean/__main__.py --snapshot 2026-11-29`.
"""

from __future__ import annotations

from pipeline.core.cli import run_cli
from pipeline.core.proc import exit_now
from pipeline.entrypoint import stage_main


def main(argv: list[str] | None = None) -> int:
    return stage_main(argv, stage="clean", description=__doc__)


if __name__ == "__main__":
    exit_now(run_cli(main))  # without the interpreter's teardown: see pipeline.core.proc.exit_now
