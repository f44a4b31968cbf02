"""`python -m pipeline.train` / `pretrain train`: train the model on a snapshot's token shards.

Under torchrun this is the per-rank entrypoint. Run directly, it launches torchrun itself with
train.nproc_per_node processes, so `pretrain train --snapshot demo` is all a user types.
"""

from __future__ import annotations

import os

from pipeline.core.cli import resolve, run_cli, stage_main, stage_parser
from pipeline.core.logs import setup_logging


def main(argv: list[str] | None = None) -> int:
    if "LOCAL_RANK" not in os.environ:
        from pipeline.train.launch import run

        return stage_main(
            argv,
            stage="train",
            description=__doc__,
            run=run,
            input_stages=("tokenize",),
            component="train-launcher",
        )
    parser = stage_parser("pretrain train", __doc__)
    parser.add_argument("--input-stage", default="tokenize")
    args = parser.parse_args(argv)
    config, snapshot = resolve(args)
    setup_logging(config, "train", rank=int(os.environ.get("RANK", 0)))
    from pipeline.train.trainer import train

    train(config, snapshot, args.input_stage)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
