"""`python -m pipeline.dedup` / `pretrain dedup`: URL, exact and MinHash-LSH near-duplicate removal in Spark.

Reads clean/<snapshot>/documents/ and writes dedup/<snapshot>/ with documents/ (kept, same columns),
excluded/ (removed, plus drop_reason: url_duplicate, exact_duplicate, near_duplicate or null_text),
duplicates/ (id, cluster_id, representative_id, similarity, drop_reason for every cluster member) and
lsh_s_curve.png. Settings live under `dedup.` (threshold, ngram_size, num_perm or bands/rows, verify,
url_dedup, exact, near); see docs/dedup.md.

Also runs under spark-submit on a cluster:
`spark-submit --master spark://host:7077 pipeline/dedup/__main__.py --snapshot 2026-11-29`.
"""

from __future__ import annotations

import sys

from pipeline.core.cli import run_cli
from pipeline.core.proc import exit_now
from pipeline.entrypoint import stage_main


def main(argv: list[str] | None = None) -> int:
    from pipeline.dedup.job import DedupInputError

    try:
        return stage_main(argv, stage="dedup", description=__doc__)
    except DedupInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    exit_now(run_cli(main))  # without the interpreter's teardown: see pipeline.core.proc.exit_now
