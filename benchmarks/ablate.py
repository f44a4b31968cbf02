"""Benchmark issue 33: the constructed-corpus ablation end to end, and whether the recipe wins.

The seeded corpus of tests/ablate/corpus.py (Wikipedia lead extracts mixed with navigation pages, repeated
lines, keyword spam, near-duplicates, random-character and templated pages and a French share) is ingested
(Spark, ``local[2]``), then `pretrain ablate` runs the variants ``none`` (no quality rules, no dedup),
``rules`` and ``rules+dedup`` with 2 seeds each: corpus stages in-process, one shared tokenizer, tiny proxies
trained through torchrun on the same token budget, every checkpoint scored on the held-out reference.

Prints ``recipe_margin_over_none`` (held-out reference loss of ``none`` minus that of ``rules+dedup``, in nats,
mean over seeds), ``seed_spread`` (the larger of the two variants' seed ranges: the noise floor) and
``wall_s``.

    .venv/bin/python benchmarks/ablate.py --quick     # 300 pages, 2 seeds, 50k tokens per training (the test's)
    .venv/bin/python benchmarks/ablate.py             # 1,500 pages, 3 seeds, 175k tokens per training

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this folder is sys.path[0]: the repository root replaces it, for the corpus builder in
# tests/ablate/corpus.py (not installed).
sys.path[0] = str(ROOT)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="300 pages, 2 seeds, 50k tokens per training")
    parser.add_argument("--pages", type=int, help="pages of the constructed corpus (overrides the mode's)")
    parser.add_argument("--tokens", type=int, help="tokens per training (overrides the mode's)")
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temporary folder)")
    args = parser.parse_args()

    from pipeline.ablate.runner import Progress, run_ablation
    from pipeline.ablate.spec import parse_spec
    from pipeline.config import load_config
    from pipeline.core.storage import DatasetRef
    from pipeline.ingest import job as ingest_job
    from tests.ablate.corpus import PROXY, TOKENS, build

    pages, seeds, tokens = (300, [0, 1], TOKENS) if args.quick else (1500, [0, 1, 2], 175_000)
    pages, tokens = args.pages or pages, args.tokens or tokens
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-ablate-"))
    started = time.monotonic()
    corpus = build(folder / "source", pages=pages)
    overrides = [
        f"project.data_root={folder / 'data'}",
        "spark.master=local[2]",
        "logging.console=false",
        f"ingest.sources=[{corpus.corpus}]",
        *PROXY,
    ]
    config = load_config(None, overrides)
    source = DatasetRef.of(config, "ingest", "bench")
    if not source.is_complete():
        ingest_job.run(config, [], source)
    spec = parse_spec(
        {
            "name": "bench",
            "source": {"snapshot": "bench"},
            "base": "none",
            "variants": ["none", "rules", "rules+dedup"],
            "reference": str(corpus.reference),
            "tokens": tokens,
            "seeds": seeds,
            "eval_points": 3,
        }
    )
    progress = Progress()
    manifest = run_ablation(spec, None, overrides, progress)
    wall = time.monotonic() - started
    comparison = json.loads((Path(manifest.path) / "comparison.json").read_text())
    variants = comparison["variants"]
    print(f"{'variant':<12} {'reference loss':>16} {'spread':>8} {'epochs':>7} {'docs':>5}  verdict vs none")
    for name, entry in variants.items():
        score = entry["eval"]["reference"]
        verdict = entry["verdict"]["reference"]["verdict"] if entry["verdict"] else "(base)"
        print(
            f"{name:<12} {score['mean']:>16.4f} {score['spread']:>8.4f} {entry['epochs']:>7.2f} "
            f"{entry['documents']:>5}  {verdict}"
        )
    none, recipe = variants["none"]["eval"]["reference"], variants["rules+dedup"]["eval"]["reference"]
    result = {
        "recipe_margin_over_none": round(none["mean"] - recipe["mean"], 4),
        "seed_spread": round(max(none["spread"], recipe["spread"]), 4),
        "wall_s": round(wall, 1),
        "tokens_per_training": comparison["tokens"],
        "trainings": len(progress.trainings_run),
        "stages_run": len(progress.stages_run),
        "epochs": {name: round(entry["epochs"], 3) for name, entry in variants.items()},
        "verdicts": {
            name: entry["verdict"]["reference"]["verdict"]
            for name, entry in variants.items()
            if entry["verdict"]
        },
        "quick": args.quick,
        "pages": pages,
        "comparison": str(Path(manifest.path) / "report.html"),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
