"""`python -m pipeline.train` / `pretrain train`: train the model on a snapshot's token shards.

Under torchrun this is the per-rank entrypoint. Run directly, it launches torchrun itself with
train.nproc_per_node processes, so `pretrain train --snapshot demo` is all a user types.
"""

from __future__ import annotations

import os

from pipeline.core.cli import resolve, run_cli, stage_parser
from pipeline.core.logs import setup_logging
from pipeline.core.storage import DatasetRef


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("pretrain train", __doc__)
    parser.add_argument(
        "--input-stage", default="tokenize", help="stage holding the token shards (default: tokenize)"
    )
    args = parser.parse_args(argv)
    config, snapshot = resolve(args)
    if "LOCAL_RANK" in os.environ:
        setup_logging(config, "train", rank=int(os.environ.get("RANK", 0)))
        from pipeline.train.trainer import train

        train(config, snapshot, args.input_stage)
        return 0
    setup_logging(config, "train-launcher")
    from pipeline.train.launch import run
    from pipeline.train.trainer import STAGE

    manifest = run(
        config, [DatasetRef.of(config, args.input_stage, snapshot)], DatasetRef.of(config, STAGE, snapshot)
    )
    print(manifest.path)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
