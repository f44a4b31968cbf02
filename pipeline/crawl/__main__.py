"""`python -m pipeline.crawl` / `pretrain crawl`: crawl seeds (default: the bundled sample site) into WARC."""

from __future__ import annotations

from pipeline.core.cli import resolve, run_cli, stage_parser
from pipeline.core.logs import setup_logging
from pipeline.core.storage import DatasetRef


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("pretrain crawl", __doc__)
    config, snapshot = resolve(parser.parse_args(argv))
    setup_logging(config, "crawl")
    from pipeline.crawl.stage import STAGE, run

    manifest = run(config, [], DatasetRef.of(config, STAGE, snapshot))
    print(manifest.path)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
