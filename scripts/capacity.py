"""How many executor cores (and how much memory and shuffle space) each corpus stage needs for N documents
within a deadline, from the per-core throughput ``benchmarks/scale.py`` measured.

    .venv/bin/python scripts/capacity.py --documents 2.7e9 --deadline-hours 24     # a Common Crawl dump a day
    .venv/bin/python scripts/capacity.py --documents 5e7 --deadline-hours 4 --skew 2

The model (docs/scaling-out.md says what is measured and what is extrapolated):

* **Work.** A stage's CPU seconds (driver, JVM and Python workers together, so per-core speed is this
  machine's) split into a fixed part (JVM and worker start-up, session, model loading) and a part per
  document, from the two smallest sizes: per document = the difference of their CPU seconds over the
  difference of their sizes. With a third size, the per-document part's growth between the two largest is
  its exponent (never below 1); with two sizes the exponent is 1, and unmeasured. At N documents:
  fixed + (per-document part at the largest size) x (N / largest) ^ exponent.
* **Cores.** The stages run one after another; each gets a share of the deadline in proportion to its work.
  Cores = CPU seconds x skew / seconds available, rounded up. ``--skew`` (default 1.5) covers stragglers,
  uneven partitions and task retries; ``--core-speed`` scales for cores faster or slower than this machine's.
* **Memory.** Per executor core: the largest Python worker peak plus the JVM heap peak per local core at the
  largest size, with Spark's default 40% reserve on top; measured, not extrapolated. A task's memory
  follows its partition, and a dataset's files (so partitions) are ``spark.output_files`` in number: raise
  it with the corpus, or partitions grow with it (at 1M, 4 files made classify's cache spill to disk).
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


def cost_model(figures: dict, stage: str) -> tuple[float, float, float | None]:
    """(fixed CPU seconds, CPU seconds per document, exponent of the per-document part or None)."""
    sizes = figures["sizes"]
    cpu = [figures["per_size"][str(size)][stage]["cpu_s"] for size in sizes]
    per_document = (cpu[1] - cpu[0]) / (sizes[1] - sizes[0])
    if per_document <= 0:  # within the measurement's noise: all of it counted per document
        return 0.0, cpu[-1] / sizes[-1], None
    fixed = max(0.0, cpu[0] - per_document * sizes[0])
    if len(sizes) < 3:
        return fixed, per_document, None
    grown = (cpu[-1] - fixed) / (cpu[-2] - fixed)
    return fixed, per_document, math.log(grown) / math.log(sizes[-1] / sizes[-2])


def stage_needs(figures: dict, stage: str, documents: float, core_speed: float) -> dict:
    sizes = figures["sizes"]
    largest = sizes[-1]
    measured = figures["per_size"][str(largest)][stage]
    fixed, per_document, measured_exponent = cost_model(figures, stage)
    exponent = max(1.0, measured_exponent or 1.0)
    at_largest = max(measured["cpu_s"] - fixed, per_document * largest)
    cpu_s = (fixed + at_largest * (documents / largest) ** exponent) / core_speed
    peaks = measured["peak_mb"]
    per_core_mb = (peaks.get("worker", 0.0) + measured["jvm_heap_peak_mb"] / LOCAL_CORES) * MEMORY_RESERVE
    return {
        "measured_docs": largest,
        "measured_cpu_s": measured["cpu_s"],
        "fixed_cpu_s": round(fixed, 1),
        "docs_per_core_s": round(core_speed / per_document, 1),
        "exponent_measured": None if measured_exponent is None else round(measured_exponent, 3),
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
    header = f"{'stage':<14}{'fixed s':>8}{'docs/core-s':>12}{'exp.':>6}{'CPU h':>9}{'wall h':>8}{'cores':>7}"
    print(header + f"{'GB/core':>9}{'shuffle TB':>12}{'output TB':>11}")
    for name, s in result["stages"].items():
        print(
            f"{name:<14}{s['fixed_cpu_s']:>8.0f}{s['docs_per_core_s']:>12,.0f}{s['exponent_used']:>6.2f}"
            f"{s['cpu_hours']:>9,.0f}{s['wall_hours']:>8.2f}{s['cores']:>7,}{s['memory_per_core_gb']:>9.2f}"
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
