"""Quality stage cost at 1x and 4x corpus size with the same sample size.

    .venv/bin/python benchmarks/quality.py --quick   # 10,000 and 40,000 documents, sample 200: under 3 minutes
    .venv/bin/python benchmarks/quality.py           # 100,000 and 400,000 documents, sample 2,000 (the default)
    .venv/bin/python benchmarks/quality.py --quick --repeat 3   # on a busy machine: smallest time of 3 runs

The goal: the sample-based metrics (subjects, diversity, embeddings, pairwise cosine, k-means) cost the same
at both sizes, the Spark aggregations over every document (coverage: counts per host, length quantiles;
drawing the sample) grow linearly, and the driver's memory stays flat.

Input: benchmarks/clean.py's generated documents (prose, articles, lists, code, other languages, some junk;
seeded, one generator per document id), spread over 500 web hosts with Zipf weights, so both sizes have the
same hosts and the per-domain table the driver collects is the same size. They are published as a
decontaminate output with a manifest (what the quality stage reads by default); 4x is documents 0..4N-1, 1x
is 0..N-1.

Each size runs in its own process through the entrypoint a user runs (`python -m pipeline.quality`, its
`main` via `run_cli`), so its peak memory is its own. Measured:

* wall: the whole process (interpreter and imports, config, the stage, exit);
* stage: the quality stage's ``run()``, Spark session start included; and inside it, timed by wrapping the
  report module's functions in that process (report.py is not changed): ``coverage`` (Spark, every
  document), the sample metrics (``lexical_diversity``, ``collect_sample`` (embedding it in the workers),
  ``subject_view``, ``cosine_statistics``, ``cluster_entropy``, ``diversity.sample_diversity``: the sample
  only, once it is drawn) and the rest (drawing the sample, the funnel, the trends, plots, writing files);
* driver peak: the Python driver's own peak RSS (``getrusage(RUSAGE_SELF).ru_maxrss``), which counts neither
  Spark's JVM nor the Python workers the JVM starts (they embed the sample). Those two are reported beside
  it: the JVM's peak RSS (its kernel high-water mark, VmHWM) and the workers' largest total RSS at once, both
  sampled every 0.2 s from this process, so a peak shorter than that may be missed;
* CPU seconds of the whole process tree (sampled per process, as benchmarks/clean.py counts them): unlike
  wall time, they do not depend on what else the machine runs.

MLflow stage tracking is off (`tracking.stage_runs=false`): creating the tracking database would land in
the first run only. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# As in clean.py: the repository root, not this folder (whose tokenize.py shadows the standard library), first.
sys.path[:] = [str(ROOT)] + [e for e in sys.path if Path(e or os.curdir).resolve() != ROOT / "benchmarks"]

from benchmarks.clean import Sources, make_document  # noqa: E402
from benchmarks.smoke import add_smoke_flag  # noqa: E402

CORPUS_VERSION = 1  # bump when the documents or their layout change, so a cached input is rebuilt
HOSTS = 500
FILES = 16
SAMPLE_METRICS = (
    "lexical_diversity",
    "collect_sample",
    "subject_view",
    "cosine_statistics",
    "cluster_entropy",
    "diversity.sample_diversity",
)
# Names in pipeline.quality.report; a dotted one is a function of a module report calls through.
TIMED = ("run", "coverage", *SAMPLE_METRICS, "funnel", "write_tables", "page.write_page")
# Runs in the child process: time the report's functions, run the stage's own entrypoint, write the results.
CHILD = f"""
import json, os, resource, sys, time
import pipeline.quality.report as report
phases, high_water_kb = {{}}, {{}}
def vm_hwm_kb():
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("VmHWM:")).split()[1])
def timed(name, function):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - started
            high_water_kb[name] = vm_hwm_kb()  # the driver's peak RSS so far, when this step ended
    return wrapper
for name in {TIMED!r}:
    *owner_path, attribute = name.split(".")
    owner = report
    for part in owner_path:
        owner = getattr(owner, part)
    if hasattr(owner, attribute):
        setattr(owner, attribute, timed(name, getattr(owner, attribute)))
from pipeline.core.cli import run_cli
from pipeline.quality.__main__ import main
try:
    code = run_cli(main, sys.argv[1:])
finally:
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open(os.environ["BENCH_QUALITY_RESULT"], "w") as out:
        json.dump({{"driver_peak_kb": peak_kb, "phases": phases, "high_water_kb": high_water_kb}}, out)
sys.exit(code)
"""


def stage_overrides(data_root: Path, workers: int, sample_docs: int) -> list[str]:
    return [
        f"project.data_root={data_root}",
        f"spark.master=local[{workers}]",
        "spark.driver_memory=4g",
        f"spark.shuffle_partitions={workers * 4}",
        f"quality.sample_docs={sample_docs}",
        "tracking.stage_runs=false",
        "logging.console=false",
    ]


def build_documents(count: int, seed: int, data_root: Path, overrides: list[str]) -> str:
    """Publish ``count`` generated documents as the decontaminate output of snapshot ``docs-<count>``; reused
    when already there. Returns the snapshot."""
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.config import load_config
    from pipeline.core.storage import DatasetRef, StageOutput

    config = load_config(None, overrides, environ={})
    snapshot = f"docs-{count}"
    ref = DatasetRef.of(config, "decontaminate", snapshot)
    if ref.is_complete() and ref.manifest().extra.get("bench_corpus") == [CORPUS_VERSION, count, seed]:
        return snapshot
    sources = Sources()
    hosts = [f"site{i:03d}.example" for i in range(HOSTS)]
    weights = [1 / (rank + 1) for rank in range(HOSTS)]
    fetched = datetime.datetime(2026, 11, 1, tzinfo=datetime.UTC)
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("url", pa.string()),
            ("domain", pa.string()),
            ("fetch_time", pa.timestamp("us", tz="UTC")),
            ("text", pa.string()),
        ]
    )
    with StageOutput(ref, config, []) as out:
        (out.path / "documents").mkdir(parents=True)
        for part in range(FILES):
            rows = []
            for index in range(part, count, FILES):
                rng = random.Random(seed * 1_000_003 + index)
                host = rng.choices(hosts, weights)[0]
                rows.append({"id": f"{index:09d}", "url": f"https://{host}/{index}", "domain": host,
                             "fetch_time": fetched, "text": make_document(rng, sources)})  # fmt: skip
            pq.write_table(
                pa.Table.from_pylist(rows, schema=schema), out.path / "documents" / f"part-{part:03d}.parquet"
            )
        out.commit(rows={"documents": count}, extra={"bench_corpus": [CORPUS_VERSION, count, seed]})
    return snapshot


def _hwm_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class TreeSampler(threading.Thread):
    """Every 0.2 s: the JVM's high-water mark, the Spark workers' total RSS, each process's CPU seconds."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.stopped = threading.Event()
        self.jvm_peak_kb = 0
        self.workers_peak_kb = 0
        self.cpu: dict[int, float] = {}

    def run(self) -> None:
        import psutil

        root = psutil.Process(self.pid)
        while not self.stopped.wait(0.2):
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                return
            workers_kb = 0
            for process in tree:
                try:
                    times = process.cpu_times()
                    self.cpu[process.pid] = (
                        times.user + times.system + times.children_user + times.children_system
                    )
                    if process.pid == self.pid:
                        continue
                    if process.name() == "java":
                        self.jvm_peak_kb = max(self.jvm_peak_kb, _hwm_kb(process.pid))
                    elif "python" in process.name():
                        workers_kb += process.memory_info().rss // 1024
                except psutil.Error:
                    continue
            self.workers_peak_kb = max(self.workers_peak_kb, workers_kb)


def run_stage(snapshot: str, overrides: list[str], out: Path) -> dict:
    """One quality run in its own process; what it measured and what was measured around it."""
    result_file = out / f"result-{snapshot}.json"
    result_file.unlink(missing_ok=True)
    argv = [sys.executable, "-c", CHILD, "--snapshot", snapshot]
    for override in overrides:
        argv += ["--set", override]
    env = {**os.environ, "BENCH_QUALITY_RESULT": str(result_file), "PYTHONPATH": str(ROOT)}
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    started = time.perf_counter()
    child = subprocess.Popen(
        argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    sampler = TreeSampler(child.pid)
    sampler.start()
    output = child.communicate()[0]
    wall = time.perf_counter() - started
    sampler.stopped.set()
    sampler.join()
    if child.returncode != 0:
        raise SystemExit(f"the quality stage failed on {snapshot} ({child.returncode}):\n{output[-4000:]}")
    measured = json.loads(result_file.read_text())
    phases = measured["phases"]
    sample_metrics = sum(phases.get(name, 0.0) for name in SAMPLE_METRICS)
    return {
        "wall_s": wall,
        "stage_s": phases["run"],
        "coverage_s": phases.get("coverage", 0.0),
        "sample_metrics_s": sample_metrics,
        "rest_s": phases["run"] - phases.get("coverage", 0.0) - sample_metrics,
        "driver_peak_mb": measured["driver_peak_kb"] / 1024,
        "jvm_peak_mb": sampler.jvm_peak_kb / 1024,
        "workers_peak_mb": sampler.workers_peak_kb / 1024,
        "cpu_s": sum(sampler.cpu.values()),
        # the driver's peak RSS when each step ended, in the order they ran: which step raised it
        "driver_peak_after_mb": {
            name: round(kb / 1024, 1)
            for name, kb in sorted(measured["high_water_kb"].items(), key=lambda item: (item[1], item[0]))
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="10,000 and 40,000 documents, sample 200 (under 3 minutes)"
    )
    parser.add_argument(
        "--docs", type=int, default=None, help="documents at 1x (default 100,000; 4x is four times)"
    )
    parser.add_argument(
        "--sample", type=int, default=None, help="quality.sample_docs (default 2,000; --quick 200)"
    )
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--workers", type=int, default=2, help="Spark local[N]")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per size, alternating 1x and 4x: the smallest time and the largest peak of each (default 1)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "quality")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    docs = args.docs or (40 if args.smoke else 10_000 if args.quick else 100_000)
    sample = args.sample or (20 if args.smoke else 200 if args.quick else 2_000)
    args.out.mkdir(parents=True, exist_ok=True)
    overrides = stage_overrides(args.out / "data", args.workers, sample)

    snapshots = {
        factor: build_documents(docs * factor, args.seed, args.out / "data", overrides) for factor in (1, 4)
    }
    runs: dict[int, list[dict]] = {1: [], 4: []}
    for _ in range(args.repeat):
        for factor in (1, 4):
            runs[factor].append(run_stage(snapshots[factor], overrides, args.out))
            print(f"{factor}x: {docs * factor:,} documents, {runs[factor][-1]['wall_s']:.1f} s", flush=True)
    # On a shared machine others only ever slow a run down, so its smallest time is the closest to its own;
    # memory is not slowed, so the largest peak seen is reported.
    results = {
        factor: {
            **{
                k: (max if k.endswith("_mb") else min)(run[k] for run in done)
                for k in done[0]
                if k != "driver_peak_after_mb"
            },
            "driver_peak_after_mb": max(done, key=lambda run: run["driver_peak_mb"])["driver_peak_after_mb"],
        }
        for factor, done in runs.items()
    }

    load = os.getloadavg()[0]
    columns = ("wall_s", "stage_s", "coverage_s", "sample_metrics_s", "rest_s", "driver_peak_mb", "jvm_peak_mb",
               "workers_peak_mb", "cpu_s")  # fmt: skip
    print(
        f"\nquality stage, sample {sample:,} documents, Spark local[{args.workers}], {HOSTS} hosts, "
        f"{args.repeat} run(s) per size (smallest time, largest peak)"
    )
    print(f"{'size':>5}{'documents':>11}" + "".join(f"{name:>17}" for name in columns))
    for factor, result in results.items():
        print(f"{factor:>4}x{docs * factor:>11,}" + "".join(f"{result[name]:>17.1f}" for name in columns))
    growth = {name: results[4][name] / results[1][name] for name in columns if results[1][name]}
    print("4x / 1x" + " " * 9 + "".join(f"{growth.get(name, float('nan')):>17.2f}" for name in columns))
    for factor, result in results.items():
        steps = ", ".join(f"{name} {mb:.0f}" for name, mb in result["driver_peak_after_mb"].items())
        print(f"{factor}x driver peak RSS (MB) when each step ended: {steps}")
    print(
        "wall: the process; stage: run(), Spark session start included; coverage: Spark over every document; "
        "sample_metrics: lexical + embeddings + cosine + k-means on the sample; rest: drawing the sample, funnel, "
        "plots, files. driver_peak_mb: the Python driver only (getrusage); jvm and workers: sampled every 0.2 s, "
        f"not in the driver figure. 1-minute load average: {load:.1f}"
    )
    result = {
        "docs_1x": docs,
        "sample_docs": sample,
        "repeat": args.repeat,
        "time_growth_4x": round(growth["stage_s"], 2),
        "driver_peak_mb_growth_4x": round(growth["driver_peak_mb"], 2),
        "coverage_time_growth_4x": round(growth["coverage_s"], 2),
        "sample_metrics_time_growth_4x": round(growth["sample_metrics_s"], 2),
        "process_wall_growth_4x": round(growth["wall_s"], 2),
        "cpu_s_growth_4x": round(growth["cpu_s"], 2),
        "load_average": round(load, 1),
        "sizes": {
            f"{factor}x": {k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}
            for factor, r in results.items()
        },
    }
    (args.out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "sizes"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
