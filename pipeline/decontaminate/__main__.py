"""`python -m pipeline.decontaminate` / `pretrain decontaminate`: drop (or cut) documents that share a word
n-gram (13 normalised words by default) with an evaluation set, in Spark.

Reads classify/<snapshot>/documents/ and writes decontaminate/<snapshot>/ with documents/ (kept; in mode cut,
with the matched spans cut out) and excluded/ (drop_reason contaminated:<set>, contamination_set,
contamination_ngram: the first shared n-gram, contamination_matches). Sets live under `decontaminate.sets`:
this corpus's held-out documents of other snapshots (the default), lm-evaluation-harness tasks present
locally, JSONL/Parquet/.txt files. With no evaluation n-gram the documents pass through. See
docs/filtering.md.

Example: --set 'decontaminate.sets=[{name: mmlu, path: /evals/mmlu.jsonl, fields: [question, answer]}]'

Also runs under spark-submit on a cluster:
`spark-submit --master spark://host:7077 pipeline/decontaminate/__main__.py --snapshot 2026-11-29`.
"""

from __future__ import annotations

from pipeline.core.cli import run_cli
from pipeline.core.proc import exit_now
from pipeline.entrypoint import stage_main


def main(argv: list[str] | None = None) -> int:
    return stage_main(argv, stage="decontaminate", description=__doc__)


if __name__ == "__main__":
    exit_now(run_cli(main))  # without the interpreter's teardown: see pipeline.core.proc.exit_now
