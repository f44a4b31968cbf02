"""`python -m pipeline.classify` / `pretrain classify`: score every document with the configured classifiers
(fastText .bin files, embedding classifiers, models `pretrain train_classifier` made) in Spark and keep a
threshold or a top fraction per model.

Reads dedup/<snapshot>/documents/ and writes classify/<snapshot>/ with documents/ (kept, plus a
score_<name> column per model), excluded/ (dropped, with their scores and drop_reason classifier:<name>) and
plots/scores_<name>.png (score histogram per language, with the cut). Settings live under `classify.models`;
with none the documents pass through unchanged. See docs/filtering.md.

Example: --set 'classify.models=[{name: dclm, path: /models/openhermes_reddit_eli5_vs_rw_v2_bigram_200k_train.bin,
label: __label__hq, top_fraction: 0.1}]'

Also runs under spark-submit on a cluster:
`spark-submit --master spark://host:7077 pipeline/classify/__main__.py --snapshot 2026-11-29`.
"""

from __future__ import annotations

import sys

from pipeline.core.cli import run_cli
from pipeline.core.proc import exit_now
from pipeline.entrypoint import stage_main


def main(argv: list[str] | None = None) -> int:
    from pipeline.classify.job import ClassifyInputError

    try:
        return stage_main(argv, stage="classify", description=__doc__)
    except ClassifyInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    exit_now(run_cli(main))  # without the interpreter's teardown: see pipeline.core.proc.exit_now
