"""How many Spark jobs each Spark stage runs on the bundled sample snapshot.

    .venv/bin/python benchmarks/spark_jobs.py            # ~2-3 minutes on 2 idle cores
    .venv/bin/python benchmarks/spark_jobs.py --quick    # the same: the sample is the smallest input already

On a small snapshot a stage's time is mostly its chain of small Spark jobs (each one a few hundred
milliseconds of scheduling, more through a Spark Connect server), so the count is the figure to cut; unlike a
time, it is the same on a busy machine. The sample site is crawled, then every Spark stage of the demo's chain
runs in this process, one session for all (``pipeline.core.spark.counted_jobs`` around each), with the
stages' default config: ingest (reading the crawl's WARC files), clean, dedup, classify, decontaminate,
quality and tokenize. The last line printed is the JSON object ``{"jobs": {stage: count}, "total": ...}``.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

SNAPSHOT = "sample"
# The Spark stages in the demo's order; ingest reads the crawl's WARC files beside the chain.
STAGES = ("ingest", "clean", "dedup", "classify", "decontaminate", "quality", "tokenize")


def count_stage_jobs(data_root: Path, overrides: list[str]) -> dict[str, int]:
    from pipeline.config import load_config
    from pipeline.core.spark import counted_jobs, spark_session
    from pipeline.core.storage import DatasetRef
    from pipeline.stages import stage

    config = load_config(None, [f"project.data_root={data_root}", "logging.console=false", *overrides])
    crawl = DatasetRef.of(config, "crawl", SNAPSHOT)
    stage("crawl").run_function()(config, [], crawl)
    spark = spark_session(config, "spark-jobs")  # every stage's spark_session gets this one
    jobs: dict[str, int] = {}
    for name in STAGES:
        entry = stage(name)
        stage_config = config
        if name == "ingest":
            stage_config = load_config(
                None,
                [
                    f"project.data_root={data_root}",
                    "logging.console=false",
                    f"ingest.sources=[{crawl.path / 'warc'}]",
                    *overrides,
                ],
            )
        inputs = [DatasetRef.of(stage_config, read, SNAPSHOT) for read in entry.reads]
        with counted_jobs(spark) as count:
            entry.run_function()(stage_config, inputs, DatasetRef.of(stage_config, name, SNAPSHOT))
        jobs[name] = count.jobs
        print(f"{name}: {count.jobs} Spark jobs", file=sys.stderr, flush=True)
    return jobs


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="the same run (the sample is already small)")
    parser.add_argument("--keep", type=Path, help="keep the data root here")
    parser.add_argument("--set", action="append", default=[], help="a config override, key=value")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="spark-jobs-"))
    try:
        jobs = count_stage_jobs(folder / "data", args.set)
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps({"jobs": jobs, "total": sum(jobs.values())}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
