"""`python -m pipeline.crawl` / `pretrain crawl`: polite, resumable Scrapy crawls into WARC + a Parquet index.

Without --shard/--merge: the whole crawl of the snapshot (every shard, then the merge when
crawl.num_shards > 1), published as <data_root>/<corpus>/crawl/<snapshot>/.
Run it again after a kill to resume where it stopped.

Sharded (one process per shard, e.g. one Airflow task each):
  pretrain crawl --snapshot S --shard I --num-shards N    crawl shard I into crawl-shards/S.shard-I-of-N/
  pretrain crawl --snapshot S --merge --num-shards N      publish crawl/S/ from the N shards
"""

from __future__ import annotations

from pipeline.core.cli import run_cli
from pipeline.core.lineage_events import stage_run_events
from pipeline.core.proc import exit_now
from pipeline.entrypoint import announce_data_root, resolve, stage_parser, start_logging


def main(argv: list[str] | None = None) -> int:
    from pipeline.core.storage import DatasetRef

    parser = stage_parser("pretrain crawl", __doc__)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--shard", type=int, metavar="I", help="crawl only shard I (0-based) of --num-shards")
    group.add_argument(
        "--merge", action="store_true", help="merge the published shards into crawl/<snapshot>"
    )
    parser.add_argument(
        "--num-shards",
        type=int,
        metavar="N",
        help="shards by registered domain (same as --set crawl.num_shards=N; default from the config)",
    )
    args = parser.parse_args(argv)
    if args.num_shards is not None:
        args.overrides = [*args.overrides, f"crawl.num_shards={args.num_shards}"]
    config, snapshot = resolve(args)

    from pipeline.crawl import stage
    from pipeline.crawl.sharding import check_shard, shard_ref

    if args.shard is not None:
        check_shard(args.shard, config.crawl.num_shards)
    announce_data_root(config, stage.STAGE, snapshot)
    start_logging(config, "crawl")
    output = DatasetRef.of(config, stage.STAGE, snapshot)
    shard = None if args.shard is None else shard_ref(config, snapshot, args.shard)
    # OpenLineage events as every stage_main stage sends them, when configured.
    with stage_run_events(config, stage.STAGE, snapshot, [], shard or output) as lineage:
        if args.merge:
            manifest = stage.merge_shards(config, output)
        elif shard is not None:
            manifest = stage.crawl_shard(config, shard, args.shard, config.crawl.num_shards)
        else:
            manifest = stage.run(config, [], output)
        lineage(manifest)
    print(manifest.path)
    return 0


if __name__ == "__main__":
    exit_now(run_cli(main))  # without the interpreter's teardown: see pipeline.core.proc.exit_now
