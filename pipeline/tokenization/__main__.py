"""`python -m pipeline.tokenization` / `pretrain tokenize`: train a BPE and encode clean documents into shards."""

from __future__ import annotations

from pipeline.core.cli import resolve, run_cli, stage_parser
from pipeline.core.logs import setup_logging
from pipeline.core.storage import DatasetRef


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("pretrain tokenize", __doc__)
    parser.add_argument(
        "--input-stage", default="clean", help="stage whose documents/ to tokenize (default: clean)"
    )
    args = parser.parse_args(argv)
    config, snapshot = resolve(args)
    setup_logging(config, "tokenize")
    from pipeline.tokenization.job import STAGE, run

    manifest = run(
        config, [DatasetRef.of(config, args.input_stage, snapshot)], DatasetRef.of(config, STAGE, snapshot)
    )
    print(manifest.path)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
