"""`python -m pipeline.clean` / `pretrain clean`: extract, normalise, filter and de-duplicate a crawl in Spark.

Also runs under spark-submit: `spark-submit --master spark://host:7077 -m pipeline.clean ...` is not valid
Spark syntax, so submit the file: `spark-submit --master ... pipeline/clean/__main__.py --snapshot ...`.
"""

from __future__ import annotations

from pipeline.core.cli import resolve, run_cli, stage_parser
from pipeline.core.logs import setup_logging
from pipeline.core.storage import DatasetRef


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("pretrain clean", __doc__)
    config, snapshot = resolve(parser.parse_args(argv))
    setup_logging(config, "clean")
    from pipeline.clean.job import STAGE, run

    manifest = run(config, [DatasetRef.of(config, "crawl", snapshot)], DatasetRef.of(config, STAGE, snapshot))
    print(manifest.path)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
