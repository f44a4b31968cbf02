"""How many executor cores (and how much memory and shuffle space) each corpus stage needs for N documents
within a deadline, from the per-core throughput ``benchmarks/scale.py`` measured.

    .venv/bin/python scripts/capacity.py --documents 2.7e9 --deadline-hours 24     # a Common Crawl dump a day
    .venv/bin/python scripts/capacity.py --documents 5e7 --deadline-hours 4 --skew 2

The model (docs/scaling-out.md says what is measured and what is extrapolated):

* **Work.** A stage's CPU seconds per document at the largest measured size (driver, JVM and Python
  workers together; on 2 cores, so per-core speed is this machine's), grown to N documents by the stage's
  measured cost exponent, never below 1 (an exponent under 1 at small sizes is start-up cost being amortised,
  not a promise).
* **Cores.** The stages run one after another; each gets a share of the deadline in proportion to its work.
  Cores = CPU seconds x skew / seconds available, rounded up. ``--skew`` (default 1.5) covers stragglers,
  uneven partitions and task retries; ``--core-speed`` scales for cores faster or slower than this machine's.
* **Memory.** Per executor core: the largest Python worker peak plus the JVM heap peak per local core at the
  largest size, with Spark's default 40% reserve on top; measured, not extrapolated (no stage's per-task
  memory grows with the corpus when partitions grow with it).
* **Shuffle and output.** Bytes per document at the largest size, times N.

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FIGURES = ROOT / "benchmarks" / "scale_figures.json"
LOCAL_CORES = 2  # the measurements ran on local[2]
MEMORY_RESERVE = 1.4


def stage_needs(figures: dict, stage: str, documents: float, core_speed: float) -> dict:
    sizes = figures["sizes"]
    largest = sizes[-1]
    measured = figures["per_size"][str(largest)][stage]
    exponent = max(1.0, figures[f"cpu_exponent_{stage}"])
    cpu_s = measured["cpu_s"] * (documents / largest) ** exponent / core_speed
    peaks = measured["peak_mb"]
    per_core_mb = (peaks.get("worker", 0.0) + measured["jvm_heap_peak_mb"] / LOCAL_CORES) * MEMORY_RESERVE
    return {
        "measured_docs": largest,
        "measured_cpu_s": measured["cpu_s"],
        "docs_per_core_s": round(largest / measured["cpu_s"] * core_speed, 1),
        "exponent_used": round(exponent, 3),
        "cpu_hours": cpu_s / 3600,
        "memory_per_core_gb": round(per_core_mb / 1024, 2),
        "shuffle_tb": measured["shuffle_mb"] / largest * documents / 2**20,
        "output_tb": measured["output_mb"] / largest * documents / 2**20,
    }


def plan(figures: dict, documents: float, deadline_hours: float, skew: float, core_speed: float) -> dict:
    stages = {stage: stage_needs(figures, stage, documents, core_speed) for stage in figures["stages"]}
    total_cpu_hours = sum(s["cpu_hours"] for s in stages.values())
    for needs in stages.values():
        hours = deadline_hours * needs["cpu_hours"] / total_cpu_hours  # its share of the deadline
        needs["wall_hours"] = round(hours, 2)
        needs["cores"] = math.ceil(needs["cpu_hours"] * skew / hours)
    return {
        "documents": documents,
        "deadline_hours": deadline_hours,
        "skew": skew,
        "core_speed": core_speed,
        "total_cpu_hours": round(total_cpu_hours, 1),
        # Every stage in turn on one pool: the pool needs the most any stage needs (they are equal by
        # construction, up to rounding), and memory for the hungriest stage's cores.
        "cores": max(s["cores"] for s in stages.values()),
        "memory_per_core_gb": max(s["memory_per_core_gb"] for s in stages.values()),
        "stages": stages,
    }


def show(result: dict) -> None:
    print(
        f"{result['documents']:,.0f} documents in {result['deadline_hours']:g} h "
        f"(skew {result['skew']:g}, core speed {result['core_speed']:g}x this machine's):"
    )
    header = (
        f"{'stage':<14}{'docs/core-s':>12}{'exp.':>7}{'CPU h':>11}{'wall h':>8}{'cores':>8}{'GB/core':>9}"
    )
    print(header + f"{'shuffle TB':>12}{'output TB':>11}")
    for name, s in result["stages"].items():
        print(
            f"{name:<14}{s['docs_per_core_s']:>12,.0f}{s['exponent_used']:>7.2f}{s['cpu_hours']:>11,.0f}"
            f"{s['wall_hours']:>8.2f}{s['cores']:>8,}{s['memory_per_core_gb']:>9.2f}"
            f"{s['shuffle_tb']:>12.2f}{s['output_tb']:>11.2f}"
        )
    print(
        f"total: {result['total_cpu_hours']:,.0f} CPU hours; a pool of {result['cores']:,} executor cores with "
        f"{result['memory_per_core_gb']:.2f} GB each runs the stages one after another within the deadline"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=float, required=True, help="corpus size, e.g. 2.7e9")
    parser.add_argument("--deadline-hours", type=float, required=True, help="time to run every corpus stage")
    parser.add_argument("--skew", type=float, default=1.5, help="safety factor for stragglers (default 1.5)")
    parser.add_argument("--core-speed", type=float, default=1.0, help="a core's speed against this machine's")
    parser.add_argument("--figures", type=Path, default=DEFAULT_FIGURES, help="benchmarks/scale.py's result")
    args = parser.parse_args(argv)
    if args.documents <= 0 or args.deadline_hours <= 0 or args.skew < 1 or args.core_speed <= 0:
        parser.error("documents and deadline must be positive, skew at least 1, core speed positive")
    if not args.figures.is_file():
        parser.error(
            f"no figures at {args.figures}: run benchmarks/scale.py (it writes them) or pass --figures"
        )
    figures = json.loads(args.figures.read_text())
    result = plan(figures, args.documents, args.deadline_hours, args.skew, args.core_speed)
    show(result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
