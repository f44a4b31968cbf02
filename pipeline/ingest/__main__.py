"""`python -m pipeline.ingest` / `pretrain ingest`: existing corpora into the clean stage's input contract.

Reads Common Crawl WARC (HTML responses extracted as the crawl's pages are) and WET files with warcio, and
JSONL, Parquet or a Hugging Face dataset saved to disk (Arrow) with a configurable text column, in Spark;
bad records are quarantined in excluded/ with a reason, never fatal (docs/ingest.md). Then clean reads it: `pretrain clean` with `--input-stage` ingest.

  pretrain ingest --snapshot cc1 --source 'data/cc/*.warc.wet.gz'
  pretrain ingest --snapshot s3 --source corpus.jsonl --set ingest.id_column=doc_id
  pretrain ingest --snapshot hf --source my_dataset/    # a Hugging Face dataset's save_to_disk folder
  pretrain ingest --snapshot cc1      # again, no --source: re-read the files the snapshot's manifest names

Also runs under spark-submit: `spark-submit pipeline/ingest/__main__.py --snapshot cc1 --source ...`.
"""

from __future__ import annotations

import argparse
import json

from pipeline.core.cli import run_cli
from pipeline.core.proc import exit_now
from pipeline.entrypoint import stage_main


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--source",
        dest="sources",
        action="append",
        default=[],
        metavar="PATH",
        help="a file, folder, glob or URI to read (repeatable; same as --set ingest.sources=[...])",
    )
    parser.add_argument(
        "--format",
        choices=["auto", "warc", "wet", "jsonl", "parquet", "arrow"],
        help="source format (same as --set ingest.format=...; default auto: by extension)",
    )


def as_overrides(args: argparse.Namespace) -> list[str]:
    overrides = [f"ingest.sources={json.dumps(args.sources)}"] if args.sources else []
    return overrides + ([f"ingest.format={args.format}"] if args.format else [])


def main(argv: list[str] | None = None) -> int:
    return stage_main(
        argv,
        stage="ingest",
        description=__doc__,
        add_arguments=add_arguments,
        as_overrides=as_overrides,
    )


if __name__ == "__main__":
    exit_now(run_cli(main))  # without the interpreter's teardown: see pipeline.core.proc.exit_now
