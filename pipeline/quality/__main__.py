"""`python -m pipeline.quality` / `pretrain quality`: a data-quality report on the finished (deduplicated)
documents: subjects, diversity, the drop funnel and the change since the previous snapshot. Writes
report.html, metrics.json and plots under <data_root>/<corpus>/quality/<snapshot>/.
"""

from __future__ import annotations

from pipeline.core.cli import run_cli
from pipeline.core.proc import exit_now
from pipeline.entrypoint import stage_main


def main(argv: list[str] | None = None) -> int:
    return stage_main(argv, stage="quality", description=__doc__)


if __name__ == "__main__":
    exit_now(run_cli(main))  # without the interpreter's teardown: see pipeline.core.proc.exit_now
