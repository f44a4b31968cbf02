"""Tokens/s of the Spark tokenize stage vs raw HF tokenizers encode_batch, same text, same cores, one process.

    .venv/bin/python benchmarks/tokenize_shards.py --quick      # ~20M characters, within 3 minutes on 2 cores
    .venv/bin/python benchmarks/tokenize_shards.py              # ~80M characters

The text is real: Python sources and docs of the installed packages (a seeded sample of site-packages), written
as a clean-stage Parquet dataset. The stage runs end to end (count, sample + train the BPE, Spark job that reads
Parquet, encodes with mapInArrow and writes shards, commit); its manifest times each step. The raw baseline
then encodes the same texts as one in-memory list with the tokenizer the stage trained, on as many Rayon
threads as Spark has cores, before and after the stage (the mean is used, to even out load from elsewhere).

The headline ratio divides the Spark encode job's tokens/s (read Parquet -> encode -> write shards) by raw
``encode_batch``'s; the JSON also holds the whole stage's ratio and the ratio against ``encode_batch_fast``,
the offsets-free variant the stage itself calls. Wall-clock ratios are only fair on an otherwise idle machine:
under load, the kernel shares the CPU per thread, and the Spark side runs more threads (JVM + one Python
worker per core) than the raw side's Rayon pool. So the same figures are also given per CPU-second (this
process and all its descendants: the Spark JVM and its Python workers), which load does not skew.
The last line printed is the JSON object.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this folder is sys.path[0]; the repository root goes first so that benchmarks.clean imports.
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import random  # noqa: E402
import sysconfig  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from hashlib import sha1  # noqa: E402

from benchmarks.clean import cpu_seconds_since, process_cpu  # noqa: E402
from benchmarks.smoke import add_smoke_flag  # noqa: E402
from pipeline.core.progress import STEP_FIELD  # noqa: E402

TEXT_SUFFIXES = (".py", ".md", ".rst", ".txt")
RAW_METHODS = ("encode_batch", "encode_batch_fast")


def real_texts(target_chars: int, seed: int = 0) -> list[str]:
    """A seeded sample of text files from site-packages (1 KB - 256 KB each), up to target_chars in total."""
    root = Path(sysconfig.get_paths()["purelib"])
    paths = sorted(
        p
        for p in root.rglob("*")
        if p.suffix in TEXT_SUFFIXES and p.is_file() and 1024 <= p.stat().st_size <= 262_144
    )
    random.Random(seed).shuffle(paths)
    texts, total = [], 0
    for path in paths:
        text = path.read_bytes().decode("utf-8", "replace")
        if not text.strip():
            continue
        texts.append(text)
        total += len(text)
        if total >= target_chars:
            break
    return texts


def write_clean_dataset(config, snapshot: str, texts: list[str], files: int):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.core.storage import DatasetRef, StageOutput

    ref = DatasetRef.of(config, "clean", snapshot)
    ids = [sha1(f"bench-{i}".encode()).hexdigest() for i in range(len(texts))]
    with StageOutput(ref, config) as out:
        (out.path / "documents").mkdir()
        for part in range(files):
            table = pa.table({"id": ids[part::files], "text": texts[part::files]})
            pq.write_table(table, out.path / "documents" / f"part-{part:05d}.parquet", compression="zstd")
        out.commit(rows={"documents": len(texts)})
    return ref


def raw_encode(tokenizer, texts: list[str], method: str) -> tuple[int, float, float]:
    """(tokens, wall seconds, CPU seconds) of one raw encode call over the whole list."""
    encode = getattr(tokenizer, method)
    cpu, started = process_cpu(), time.perf_counter()
    encodings = encode(texts, add_special_tokens=False)
    elapsed, cpu = time.perf_counter() - started, cpu_seconds_since(cpu)
    return sum(len(encoding.ids) for encoding in encodings), elapsed, cpu


class StepMarks(logging.Handler):
    """The CPU seconds of every process when each of the stage's steps ends (its StepClock log records)."""

    def __init__(self) -> None:
        super().__init__()
        self.marks = {"start": process_cpu()}

    def emit(self, record: logging.LogRecord) -> None:
        step = getattr(record, STEP_FIELD, None)
        if step is not None:
            self.marks[step] = process_cpu()


def run_stage(job, config, clean, output) -> tuple:
    """(manifest, wall seconds of the whole stage, CPU seconds of its encode job, CPU seconds in all)."""
    listener = StepMarks()
    stage_log = logging.getLogger(job.__name__)
    level = stage_log.level
    stage_log.addHandler(listener)
    stage_log.setLevel(logging.INFO)  # the step records are INFO
    started = time.perf_counter()
    try:
        manifest = job.run(config, [clean], output)
    finally:
        stage_log.removeHandler(listener)
        stage_log.setLevel(level)
    wall = time.perf_counter() - started
    marks = listener.marks
    # Per process between the two marks (see benchmarks.clean.cpu_seconds_since for why not two totals).
    before = marks["train_tokenizer"]
    encode_cpu = sum(seconds - before.get(pid, 0.0) for pid, seconds in marks["encode"].items())
    return manifest, wall, encode_cpu, cpu_seconds_since(marks["start"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="~20M characters instead of ~80M (< 3 min on 2 cores)"
    )
    add_smoke_flag(parser)
    parser.add_argument(
        "--chars", type=int, default=None, help="characters of text to encode (overrides --quick)"
    )
    parser.add_argument(
        "--cores", type=int, default=2, help="Spark local[N] cores = raw Rayon threads (default 2)"
    )
    parser.add_argument("--vocab-size", type=int, default=None, help="default 16,384 (--smoke 512)")
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON result to this file")
    args = parser.parse_args(argv)
    target = args.chars or (200_000 if args.smoke else 20_000_000 if args.quick else 80_000_000)
    vocab_size = args.vocab_size or (512 if args.smoke else 16_384)

    # The driver's Rayon pool (raw baseline, BPE training) gets as many threads as Spark has cores; the
    # stage sets its workers' own count (tokenize.threads_per_task), whatever this says.
    os.environ["RAYON_NUM_THREADS"] = str(args.cores)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from tokenizers import Tokenizer

    from pipeline.config import load_config
    from pipeline.core.spark import spark_session
    from pipeline.core.storage import DatasetRef
    from pipeline.tokenization import job

    texts = real_texts(target)
    chars = sum(map(len, texts))
    print(f"text: {len(texts)} files from site-packages, {chars / 1e6:.1f}M characters", file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="bench-tokenize-") as root:
        config = load_config(
            None,
            [
                f"project.data_root={root}/data",
                f"spark.master=local[{args.cores}]",
                f"tokenize.num_shards={args.cores}",
                f"bpe.vocab_size={vocab_size}",
                "bpe.sample_docs=2000",
                "logging.console=false",
            ],
            environ={},
        )
        clean = write_clean_dataset(config, "bench", texts, files=8)
        spark = spark_session(config, "bench-tokenize")
        spark.range(1).count()  # session start is not the stage's cost

        output = DatasetRef.of(config, "tokenize", "bench")
        # stage -> raw (with the tokenizer the stage trained) -> stage again, so load from elsewhere on the
        # machine touches both sides alike; each side's figure is the mean over its runs.
        stages = [run_stage(job, config, clean, output)]
        tokenizer = Tokenizer.from_file(str(output.path / "tokenizer.json"))
        tokenizer.encode_special_tokens = True  # as the stage encodes
        raw = {method: [raw_encode(tokenizer, texts, method) for _ in range(2)] for method in RAW_METHODS}
        stages.append(run_stage(job, config, clean, output))

    manifest = stages[0][0]
    documents = manifest.rows["train_documents"] + manifest.rows["validation_documents"]
    tokens = (
        sum(manifest.counters["tokens"].values()) - documents
    )  # without the end-of-text the stage appends
    mean = lambda values: sum(values) / len(values)  # noqa: E731
    encode_wall = mean([stage[0].extra["seconds"]["encode"] for stage in stages])
    spark_rate, spark_cpu_rate = tokens / encode_wall, tokens / mean([stage[2] for stage in stages])
    whole_rate, whole_cpu_rate = (
        tokens / mean([stage[1] for stage in stages]),
        tokens / mean([s[3] for s in stages]),
    )
    raw_rate = {method: mean([n / wall for n, wall, _ in runs]) for method, runs in raw.items()}
    raw_cpu_rate = {method: mean([n / cpu for n, _, cpu in runs]) for method, runs in raw.items()}
    figures = {
        "tokens_per_s_ratio_vs_raw": round(spark_rate / raw_rate["encode_batch"], 3),
        "ratio_vs_raw_encode_batch_fast": round(spark_rate / raw_rate["encode_batch_fast"], 3),
        "whole_stage_ratio_vs_raw": round(whole_rate / raw_rate["encode_batch"], 3),
        "cpu_ratio_vs_raw": round(spark_cpu_rate / raw_cpu_rate["encode_batch"], 3),
        "cpu_ratio_vs_raw_encode_batch_fast": round(spark_cpu_rate / raw_cpu_rate["encode_batch_fast"], 3),
        "spark_encode_tokens_per_s": round(spark_rate),
        "whole_stage_tokens_per_s": round(whole_rate),
        "raw_encode_batch_tokens_per_s": round(raw_rate["encode_batch"]),
        "raw_encode_batch_fast_tokens_per_s": round(raw_rate["encode_batch_fast"]),
        "spark_encode_tokens_per_cpu_s": round(spark_cpu_rate),
        "whole_stage_tokens_per_cpu_s": round(whole_cpu_rate),
        "raw_encode_batch_tokens_per_cpu_s": round(raw_cpu_rate["encode_batch"]),
        "raw_encode_batch_fast_tokens_per_cpu_s": round(raw_cpu_rate["encode_batch_fast"]),
        "tokens": tokens,
        "raw_tokens": raw["encode_batch"][0][0],
        "documents": documents,
        "characters": chars,
        "cores": args.cores,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "stage_seconds": manifest.extra["seconds"],
        "quick": bool(args.quick),
    }
    rows = [
        ("raw encode_batch (in-memory list)", raw_rate["encode_batch"], raw_cpu_rate["encode_batch"]),
        ("raw encode_batch_fast", raw_rate["encode_batch_fast"], raw_cpu_rate["encode_batch_fast"]),
        ("Spark job: Parquet -> encode -> shards", spark_rate, spark_cpu_rate),
        ("whole stage incl. BPE training", whole_rate, whole_cpu_rate),
    ]
    base, base_cpu = raw_rate["encode_batch"], raw_cpu_rate["encode_batch"]
    print(f"\n{'':40s} {'tokens/s':>11s} {'ratio':>6s} {'tokens/CPU-s':>13s} {'ratio':>6s}")
    for name, rate, cpu_rate in rows:
        print(f"{name:40s} {rate:11,.0f} {rate / base:6.2f} {cpu_rate:13,.0f} {cpu_rate / base_cpu:6.2f}")
    print(f"stage steps (s): {manifest.extra['seconds']}; load average {figures['load_average_1m']}")
    line = json.dumps(figures)
    if args.json:
        args.json.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
