"""`python -m pipeline.crawl` / `pretrain crawl`: crawl seeds (default: the bundled sample site) into WARC."""

from __future__ import annotations

from pipeline.core.cli import run_cli, stage_main


def main(argv: list[str] | None = None) -> int:
    from pipeline.crawl.stage import run

    return stage_main(argv, stage="crawl", description=__doc__, run=run, input_stages=())


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
