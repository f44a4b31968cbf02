"""Benchmark the dedup stage against datatrove's MinHash pipeline on one corpus with planted duplicates.

Reports, side by side in one run:
  1. precision and recall of both against exact ground truth at Jaccard 0.8 (same-cluster pairs: each
     removed document and the document kept for it), with datatrove using the same 5-grams and bands x rows;
  2. documents/s of both, end to end (process start to outputs written) on the same cores;
  3. peak memory of our Spark driver (Python process and JVM) as the corpus doubles.

Ground truth: every pair inside a planted family, plus every pair either system put in one cluster, gets its
exact Jaccard from Python sets (tests.dedup.synthetic.plain_jaccard); components of pairs >= 0.8 are the
true clusters. Unrelated documents are random Zipf text, so they never reach 0.8 (a random sample of pairs
is checked and its largest similarity printed).

    .venv/bin/python benchmarks/dedup.py --quick          # < 3 min on 2 cores
    .venv/bin/python benchmarks/dedup.py                  # 100k documents (and 25k, 50k for memory)

datatrove runs under .venv-bench/bin/python (`make bench-venv`); it never enters the main environment.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this folder is sys.path[0]: the repository root replaces it, for the planted corpus
# (tests/dedup/synthetic.py, not installed).
sys.path[:] = [str(ROOT)] + [e for e in sys.path if Path(e or os.curdir).resolve() != ROOT / "benchmarks"]

from benchmarks.measure import run_measured  # noqa: E402
from benchmarks.smoke import add_smoke_flag, baseline_skipped  # noqa: E402

SNAPSHOT = "bench"
LEVELS = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0)
THRESHOLD = 0.8
BANDS, ROWS = 16, 8  # what our default config derives for 0.8; datatrove gets the same


# ---------------------------------------------------------------------------------------------- datatrove


def run_datatrove(input_dir: str, work: str, workers: int, seed: int) -> None:
    """The four datatrove MinHash stages: signatures, buckets, clusters, filter (under .venv-bench)."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.readers import ParquetReader
    from datatrove.pipeline.writers import ParquetWriter
    from datatrove.utils.hashing import HashConfig

    # datatrove's default xxhash path passes str to xxhash 4.x, which raises; its sha1 path works.
    hashing = HashConfig(precision=64, hash_fc="sha1")
    config = MinhashConfig(
        n_grams=5, num_buckets=BANDS, hashes_per_bucket=ROWS, seed=seed, hash_config=hashing
    )
    work_dir = Path(work)

    def reader():
        return ParquetReader(input_dir, text_key="text", id_key="id", glob_pattern="*.parquet")

    signatures = LocalPipelineExecutor(
        [reader(), MinhashDedupSignature(str(work_dir / "signatures"), config=config)],
        tasks=workers,
        workers=workers,
        logging_dir=str(work_dir / "logs/signatures"),
    )
    buckets = LocalPipelineExecutor(
        [MinhashDedupBuckets(str(work_dir / "signatures"), str(work_dir / "buckets"), config=config)],
        tasks=BANDS,
        workers=workers,
        logging_dir=str(work_dir / "logs/buckets"),
        depends=signatures,
    )
    clusters = LocalPipelineExecutor(
        [
            MinhashDedupCluster(
                str(work_dir / "buckets"), str(work_dir / "clusters"), config=config, save_cluster_id=True
            )
        ],
        tasks=1,
        logging_dir=str(work_dir / "logs/clusters"),
        depends=buckets,
    )
    filtered = LocalPipelineExecutor(
        [
            reader(),
            MinhashDedupFilter(
                str(work_dir / "clusters"),
                exclusion_writer=ParquetWriter(str(work_dir / "removed"), expand_metadata=True),
                load_cluster_ids=True,
            ),
            ParquetWriter(str(work_dir / "kept"), expand_metadata=True),
        ],
        tasks=workers,
        workers=workers,
        logging_dir=str(work_dir / "logs/filter"),
        depends=clusters,
    )
    filtered.run()


def datatrove_clusters(work: Path) -> dict[str, str]:
    """id -> id of the document datatrove kept for its cluster, for every document in a cluster."""
    import pyarrow.parquet as pq

    by_cluster: dict[int, list[tuple[str, bool]]] = {}
    for kind in ("kept", "removed"):
        for path in sorted((work / kind).glob("*.parquet")):
            table = pq.read_table(path, columns=["id", "minhash_cluster_id"])
            for doc, cluster in zip(
                table["id"].to_pylist(), table["minhash_cluster_id"].to_pylist(), strict=True
            ):
                if cluster is not None and cluster != -1:
                    by_cluster.setdefault(cluster, []).append((doc, kind == "kept"))
    representative = {}
    for members in by_cluster.values():
        kept = [doc for doc, is_kept in members if is_kept]
        if len(kept) != 1:
            raise RuntimeError(f"datatrove kept {len(kept)} documents of one cluster")
        representative.update({doc: kept[0] for doc, _ in members})
    return representative


# ----------------------------------------------------------------------------------------------- measuring


# ---------------------------------------------------------------------------------------------- the corpus


def write_corpus(n_docs: int, seed: int, data_root: Path, files: int):
    """Publish a planted corpus as a clean-stage output under data_root; return it."""
    import pyarrow.parquet as pq

    from pipeline.config import load_config
    from pipeline.core.storage import DatasetRef, StageOutput
    from tests.dedup.synthetic import planted_corpus

    corpus = planted_corpus(n_docs, seed, levels=LEVELS, copy_fraction=0.3)
    table = corpus.table()
    config = load_config(None, [f"project.data_root={data_root}"], environ={})
    with StageOutput(DatasetRef.of(config, "clean", SNAPSHOT), config, []) as out:
        folder = out.path / "documents"
        folder.mkdir()
        size = -(-table.num_rows // files)
        for index in range(files):
            pq.write_table(table.slice(index * size, size), folder / f"part-{index:05d}.parquet")
        out.commit(rows={"documents": table.num_rows})
    return corpus, DatasetRef.of(config, "clean", SNAPSHOT).path / "documents"


class GroundTruth:
    """Exact Jaccard on demand, cached; components of pairs >= THRESHOLD among the pairs looked at."""

    def __init__(self, corpus) -> None:
        from tests.dedup.synthetic import plain_shingles

        self.shingles = {row["id"]: plain_shingles(row["text"]) for row in corpus.rows}
        self.similarity: dict[tuple[str, str], float] = {}
        self.parent: dict[str, str] = {}

    def jaccard(self, a: str, b: str) -> float:
        key = (a, b) if a < b else (b, a)
        if key not in self.similarity:
            sa, sb = self.shingles[a], self.shingles[b]
            union = sa | sb
            self.similarity[key] = len(sa & sb) / len(union) if union else 1.0
            if self.similarity[key] >= THRESHOLD:
                self._union(a, b)
        return self.similarity[key]

    def _find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def _union(self, a: str, b: str) -> None:
        ra, rb = self._find(a), self._find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)

    def component(self, x: str) -> str:
        return self._find(x)

    def add_families(self, planted) -> None:
        family: dict[str, str] = {}

        def find(x):
            while family.get(x, x) != x:
                x = family[x]
            return x

        for copy, source, _ in planted:
            family[find(copy)] = find(source)
        groups: dict[str, list[str]] = {}
        for doc in {d for pair in planted for d in pair[:2]}:
            groups.setdefault(find(doc), []).append(doc)
        for members in groups.values():
            for i, a in enumerate(members):
                for b in members[i + 1 :]:
                    self.jaccard(a, b)

    def score(self, representative: dict[str, str]) -> tuple[float, float]:
        """Same-cluster precision and recall of a system's (document -> kept document) map."""
        for doc, rep in representative.items():
            if doc != rep:
                self.jaccard(doc, rep)
        predicted = [(doc, rep) for doc, rep in representative.items() if doc != rep]
        correct = sum(self.component(doc) == self.component(rep) for doc, rep in predicted)
        members: dict[str, list[str]] = {}
        for doc in list(self.parent):
            members.setdefault(self.component(doc), []).append(doc)
        truth = [
            (doc, root) for root, group in members.items() if len(group) > 1 for doc in group if doc != root
        ]
        found = sum(representative.get(doc, doc) == representative.get(root, root) for doc, root in truth)
        return (correct / len(predicted) if predicted else 1.0), (found / len(truth) if truth else 1.0)


def our_clusters(data_root: Path) -> dict[str, str]:
    import pyarrow.parquet as pq

    path = next(data_root.glob(f"*/dedup/{SNAPSHOT}/duplicates"))
    table = pq.read_table(path, columns=["id", "representative_id", "drop_reason"]).to_pylist()
    return {row["id"]: row["representative_id"] for row in table if row["drop_reason"] != "url_duplicate"}


def run_ours(data_root: Path, workers: int, log_path: Path) -> dict:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    command = [
        sys.executable,
        "-m",
        "pipeline.dedup",
        "--snapshot",
        SNAPSHOT,
        "--set",
        f"project.data_root={data_root}",
        "--set",
        f"spark.master=local[{workers}]",
        "--set",
        f"spark.shuffle_partitions={max(4, 4 * workers)}",
        "--set",
        "logging.console=false",
    ]
    measured = run_measured(command, log_path, env)
    manifest = json.loads(next(data_root.glob(f"*/dedup/{SNAPSHOT}/manifest.json")).read_text())
    measured["stage_s"] = manifest["duration_s"]
    measured["step_seconds"] = manifest["extra"]["step_seconds"]
    measured["counters"] = manifest["counters"]
    return measured


def plot_memory(points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    sizes = [p["docs"] for p in points]
    for kind in ("driver", "jvm", "worker"):
        axes.plot(sizes, [p["peak_mb"].get(kind, 0) for p in points], marker="o", label=f"{kind} peak")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("documents")
    axes.set_ylabel("peak resident memory (MB)")
    axes.set_title("dedup stage: peak memory as the corpus doubles")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="8k documents (and 4k for memory): < 3 min")
    parser.add_argument("--docs", type=int, help="documents in the main corpus (default 100000, quick 8000)")
    parser.add_argument("--workers", type=int, default=2, help="cores for both systems (default 2)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/out/dedup", help="work folder (wiped)")
    parser.add_argument(
        "--bench-python", default=str(ROOT / ".venv-bench/bin/python"), help="datatrove's python"
    )
    parser.add_argument("--datatrove-run", nargs=2, metavar=("INPUT", "WORK"), help=argparse.SUPPRESS)
    add_smoke_flag(parser)
    args = parser.parse_args(argv)

    if args.datatrove_run:
        run_datatrove(*args.datatrove_run, workers=args.workers, seed=args.seed)
        return 0

    from tqdm import tqdm

    docs = args.docs or (200 if args.smoke else 8_000 if args.quick else 100_000)
    # One doubling in quick mode (each size costs a JVM start), two in the full run, none in smoke mode.
    sizes = [docs] if args.smoke else [docs // 2, docs] if args.quick else [docs // 4, docs // 2, docs]
    skipped = None
    if args.smoke and not Path(args.bench_python).exists():
        # Smoke mode runs datatrove wherever it imports, or says it did not.
        skipped = baseline_skipped("datatrove")
        args.bench_python = sys.executable
    elif not Path(args.bench_python).exists():
        raise SystemExit(f"{args.bench_python} not found: run `make bench-venv` first")
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    print(f"dedup benchmark: {docs} documents, {args.workers} cores, memory at {sizes}", flush=True)

    memory_points, main_run, corpus = [], None, None
    progress = tqdm(sizes, desc="our stage per corpus size", unit="run")
    for size in progress:
        root = args.out / f"ours-{size}"
        corpus_at_size, _ = write_corpus(size, args.seed, root, files=max(2, args.workers))
        result = run_ours(root, args.workers, args.out / f"ours-{size}.log")
        memory_points.append({"docs": size, **result})
        progress.set_postfix(docs=size, wall_s=round(result["wall_s"], 1))
        if size == docs:
            main_run, corpus = result, corpus_at_size
            ours = our_clusters(root)
            input_dir = next(root.glob(f"*/clean/{SNAPSHOT}/documents"))

    if skipped:
        print(json.dumps({"docs": docs, "docs_per_s": round(docs / main_run["wall_s"], 1),
                          "counters": main_run["counters"], "baseline": skipped}))  # fmt: skip
        return 0
    work = args.out / "datatrove"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [args.bench_python, __file__, "--workers", str(args.workers), "--seed", str(args.seed)]
    datatrove = run_measured(
        [*command, "--datatrove-run", str(input_dir), str(work)], args.out / "datatrove.log", env
    )
    theirs = datatrove_clusters(work)

    truth = GroundTruth(corpus)
    truth.add_families(corpus.planted)
    rng = random.Random(args.seed)
    ids = list(truth.shingles)
    background = max(truth.jaccard(*rng.sample(ids, 2)) for _ in range(2000))
    our_precision, our_recall = truth.score(ours)
    their_precision, their_recall = truth.score(theirs)
    # Scoring adds the pairs each system proposed to the truth; score both again on the final truth.
    our_precision, our_recall = truth.score(ours)
    their_precision, their_recall = truth.score(theirs)

    our_rate = docs / main_run["wall_s"]
    their_rate = docs / datatrove["wall_s"]
    growth = {
        kind: round(
            memory_points[-1]["peak_mb"].get(kind, 0) / max(memory_points[-2]["peak_mb"].get(kind, 1), 1), 3
        )
        if len(memory_points) > 1
        else None
        for kind in ("driver", "jvm", "worker")
    }
    plot_memory(memory_points, args.out / "memory.png")
    shutil.copy(next((args.out / f"ours-{docs}").glob(f"*/dedup/{SNAPSHOT}/lsh_s_curve.png")), args.out)

    print()
    print(f"corpus: {docs} documents, {len(corpus.planted)} planted copies at Jaccard levels {LEVELS}")
    print(f"largest Jaccard among 2000 random unrelated pairs: {background:.3f}")
    print(f"LSH: {BANDS} bands x {ROWS} rows for both; ours verifies candidates with the exact Jaccard")
    print()
    print(f"{'':28}{'ours (Spark)':>16}{'datatrove':>16}{'ratio':>10}")
    print(f"{'precision @0.8':28}{our_precision:>16.4f}{their_precision:>16.4f}")
    print(f"{'recall @0.8':28}{our_recall:>16.4f}{their_recall:>16.4f}")
    print(f"{'wall s (end to end)':28}{main_run['wall_s']:>16.1f}{datatrove['wall_s']:>16.1f}")
    print(f"{'docs/s':28}{our_rate:>16.0f}{their_rate:>16.0f}{our_rate / their_rate:>10.2f}")
    print(
        f"{'peak MB main process':28}{main_run['peak_mb'].get('driver', 0):>16.0f}{datatrove['peak_mb'].get('driver', 0):>16.0f}"
    )
    print(f"ours from Python start to commit: {main_run['stage_s']:.1f}s; steps {main_run['step_seconds']}")
    print()
    print(f"{'docs':>10}{'wall s':>10}{'driver MB':>12}{'JVM MB':>10}{'worker MB':>12}")
    for point in memory_points:
        peak = point["peak_mb"]
        print(
            f"{point['docs']:>10}{point['wall_s']:>10.1f}{peak.get('driver', 0):>12.0f}{peak.get('jvm', 0):>10.0f}{peak.get('worker', 0):>12.0f}"
        )
    print(f"peak memory growth for the last doubling: {growth}  (plot: {args.out / 'memory.png'})")
    summary = {
        "precision": round(our_precision, 4),
        "recall": round(our_recall, 4),
        "docs_per_s_ratio_vs_datatrove": round(our_rate / their_rate, 3),
        "docs": docs,
        "docs_per_s": round(our_rate, 1),
        "datatrove_docs_per_s": round(their_rate, 1),
        "datatrove_precision": round(their_precision, 4),
        "datatrove_recall": round(their_recall, 4),
        "driver_peak_mb_growth_per_doubling": growth["driver"],
        "jvm_peak_mb_growth_per_doubling": growth["jvm"],
    }
    (args.out / "results.json").write_text(json.dumps({**summary, "memory": memory_points}, indent=2))
    if args.smoke:
        summary["baseline"] = "datatrove"
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
