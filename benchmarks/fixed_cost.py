"""What a stage costs on a small snapshot before it does any work: each stage process beside Spark's own floor.

    .venv/bin/python benchmarks/fixed_cost.py --quick     # one pass each way, ~3-4 minutes on 2 idle cores
    .venv/bin/python benchmarks/fixed_cost.py             # 3 passes each way; medians

On the bundled sample site (the demo's snapshot), in one run:

- the Spark floor, cold: a process that starts a local session (``pipeline.core.spark.spark_session``, the
  stages' own settings) and runs one trivial job; and warm: the same attached to a Spark Connect server;
- every process of the demo's chain (crawl, each Spark stage in registry order, train, export, evaluate,
  report), each run as `python -m <stage package>` the way `pretrain <stage>` runs it;
- the Spark stages again with ``SPARK_REMOTE`` naming a warm server this run starts
  (``pipeline.core.spark_connect``), on the same snapshot crawled into a data root of its own.

Headline figures: ``stage_over_spark_floor_max`` (the slowest cold Spark stage over the cold floor; the goal is
at most 2), ``warm_stage_s_max`` (the slowest Spark stage through the warm server; the goal is under 5 s) and
``demo_chain_s`` (the sum of the chain's processes as ``make demo`` runs them: the Spark stages attached to the
warm server it starts, the others as they are; the goal is under 90 s; ``demo_chain_cold_s``: every Spark stage
with a JVM of its own, as ``pretrain demo --cold`` runs them). The floors are measured
``passes`` times between the stages, so load from elsewhere shows as their spread (``*_spread``). The last line
printed is the JSON object.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402

from benchmarks.measure import run_measured  # noqa: E402
from benchmarks.smoke import add_smoke_flag  # noqa: E402
from pipeline.stages import downstream, stage  # noqa: E402

SNAPSHOT = "sample"
FLOOR_CODE = """
import sys
from pipeline.config import load_config
from pipeline.core.spark import spark_session
config = load_config(None, sys.argv[1:])
spark = spark_session(config, "spark-floor")
assert spark.range(1).count() == 1
spark.stop()
"""


def chain() -> list[str]:
    """The demo's chain, crawl to report, with the quality report (the ecosystem issue puts it in the demo)."""
    return ["crawl", *(entry.name for entry in downstream("crawl"))]


def spark_stages() -> list[str]:
    return [name for name in chain() if stage(name).runner == "spark"]


class Runner:
    def __init__(self, folder: Path, overrides: list[str]) -> None:
        self.folder = folder
        self.overrides = overrides  # beside each run's own data root
        self.logs = folder / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.count = 0

    def environment(self, remote: str | None) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("SPARK_REMOTE",) and not k.startswith("PRETRAIN__")
        }
        env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
        if remote is not None:
            env["SPARK_REMOTE"] = remote
        return env

    def run(self, name: str, argv: list[str], remote: str | None = None) -> float:
        self.count += 1
        log = self.logs / f"{self.count:02d}-{name}.log"
        return run_measured([sys.executable, *argv], log, env=self.environment(remote))["wall_s"]

    def floor(self, remote: str | None) -> float:
        return self.run("floor", ["-c", FLOOR_CODE, *self.overrides], remote)

    def stage(self, name: str, data_root: str, remote: str | None = None) -> float:
        """``name`` on the snapshot under ``data_root``: one data root per pass, so that no pass sees another's
        outputs (decontaminate's held-out set is every tokenize output's validation documents)."""
        argv = ["-m", stage(name).package, "--snapshot", SNAPSHOT]
        for override in [f"project.data_root={self.folder / data_root}", *self.overrides]:
            argv += ["--set", override]
        return self.run(name, argv, remote)


def spread(values: list[float]) -> float:
    return round(max(values) - min(values), 2) if len(values) > 1 else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one pass each way")
    parser.add_argument("--passes", type=int, default=3, help="passes each way without --quick (medians)")
    parser.add_argument("--keep", type=Path, help="keep the data root and the logs here")
    add_smoke_flag(parser)
    args = parser.parse_args()
    passes = 1 if (args.quick or args.smoke) else args.passes

    from pipeline.config import load_config
    from pipeline.core.spark_connect import connect_server

    folder = args.keep or Path(tempfile.mkdtemp(prefix="fixed-cost-"))
    overrides = ["logging.console=false"]
    if args.smoke:  # the same chain, two training steps
        overrides.append("train.steps=2")
    runner = Runner(folder, overrides)
    cold_floors: list[float] = []
    warm_floors: list[float] = []
    cold: dict[str, list[float]] = {}
    warm: dict[str, list[float]] = {}
    later: dict[str, list[float]] = {}
    try:
        for index in range(passes):
            data_root = f"cold-{index}"
            cold_floors.append(runner.floor(None))
            cold.setdefault("crawl", []).append(runner.stage("crawl", data_root))
            for name in spark_stages():
                cold.setdefault(name, []).append(runner.stage(name, data_root))
                print(f"cold {name}: {cold[name][-1]:.1f} s", file=sys.stderr, flush=True)
            for name in chain()[chain().index("tokenize") + 1 :]:
                later.setdefault(name, []).append(runner.stage(name, data_root))
                print(f"{name}: {later[name][-1]:.1f} s", file=sys.stderr, flush=True)
        with connect_server(folder / "spark-connect", config=load_config(None, overrides)) as server:
            runner.floor(server.url)  # the server's first session warms its JVM; not a user's cost
            for index in range(passes):
                data_root = f"warm-{index}"
                runner.stage("crawl", data_root)
                warm_floors.append(runner.floor(server.url))
                for name in spark_stages():
                    warm.setdefault(name, []).append(runner.stage(name, data_root, server.url))
                    print(f"warm {name}: {warm[name][-1]:.1f} s", file=sys.stderr, flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)

    median = {name: round(statistics.median(values), 2) for name, values in {**cold, **later}.items()}
    warm_median = {name: round(statistics.median(values), 2) for name, values in warm.items()}
    cold_floor = statistics.median(cold_floors)
    warm_floor = statistics.median(warm_floors)
    over_floor = {name: round(median[name] / cold_floor, 2) for name in spark_stages()}
    result = {
        "passes": passes,
        "spark_floor_cold_s": round(cold_floor, 2),
        "spark_floor_cold_spread": spread(cold_floors),
        "spark_floor_warm_s": round(warm_floor, 2),
        "spark_floor_warm_spread": spread(warm_floors),
        "stage_cold_s": {name: median[name] for name in spark_stages()},
        "stage_warm_s": warm_median,
        "stage_over_spark_floor": over_floor,
        "stage_over_spark_floor_max": max(over_floor.values()),
        "warm_stage_s_max": max(warm_median.values()),
        "chain_s": {name: median[name] for name in chain() if name in median},
        "demo_chain_s": round(sum(warm_median.get(name, median.get(name, 0.0)) for name in chain()), 1),
        "demo_chain_cold_s": round(sum(median[name] for name in chain() if name in median), 1),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
