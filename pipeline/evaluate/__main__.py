"""`python -m pipeline.evaluate` / `pretrain evaluate`: what a training run's model learned.

Reads train/<snapshot>/<run>/ (its final checkpoint) and the validation split of the token shards it trained
on, and writes evaluate/<snapshot>/<run>/: the held-out loss and perplexity overall, per source host and per
language (metrics.json, plots/), and the greedy continuations of evaluate.prompts (generations.json).
"""

from __future__ import annotations

from pipeline.core.cli import run_cli
from pipeline.core.proc import exit_now
from pipeline.entrypoint import stage_main


def main(argv: list[str] | None = None) -> int:
    return stage_main(argv, stage="evaluate", description=__doc__)


if __name__ == "__main__":
    exit_now(run_cli(main))  # without the interpreter's teardown: see pipeline.core.proc.exit_now
