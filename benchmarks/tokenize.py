"""Tokens/s of the Spark tokenize stage vs raw HF tokenizers encode_batch, same text, same cores, one process.

    .venv/bin/python benchmarks/tokenize.py --quick      # ~20M characters, within 3 minutes on 2 cores
    .venv/bin/python benchmarks/tokenize.py              # ~80M characters

The text is real: Python sources and docs of the installed packages (a seeded sample of site-packages), written
as a clean-stage Parquet dataset. The stage runs end to end (count, sample + train the BPE, Spark job that reads
Parquet, encodes with mapInArrow and writes shards, commit); its manifest times each step. The raw baseline
then encodes the same texts as one in-memory list with the tokenizer the stage trained, on as many Rayon
threads as Spark has cores, before and after the stage (the mean is used, to even out load from elsewhere).

The headline ratio divides the Spark encode job's tokens/s (read Parquet -> encode -> write shards) by raw
``encode_batch``'s; the JSON also holds the whole stage's ratio and the ratio against ``encode_batch_fast``,
the offsets-free variant the stage itself calls. The last line printed is that JSON object.
"""

# Run as `python benchmarks/tokenize.py`, this script's folder is sys.path[0], so this file would shadow the
# standard library's `tokenize` (which linecache, inspect, and through them pyspark, torch and tqdm import).
# Drop the folder before any other import. Only sys and os are loaded yet, and neither imports tokenize.
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _HERE]
_early = sys.modules.get("tokenize")
if _early is not None and os.path.dirname(os.path.abspath(getattr(_early, "__file__", "") or "")) == _HERE:
    raise SystemExit("benchmarks/tokenize.py was imported as the stdlib `tokenize`; run it as a script")

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import sysconfig  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from hashlib import sha1  # noqa: E402
from pathlib import Path  # noqa: E402

TEXT_SUFFIXES = (".py", ".md", ".rst", ".txt")


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


def raw_tokens_per_s(tokenizer, texts: list[str], method: str) -> tuple[float, int]:
    encode = getattr(tokenizer, method)
    started = time.perf_counter()
    encodings = encode(texts, add_special_tokens=False)
    elapsed = time.perf_counter() - started
    tokens = sum(len(encoding.ids) for encoding in encodings)
    return tokens / elapsed, tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="~20M characters instead of ~80M (< 3 min on 2 cores)"
    )
    parser.add_argument(
        "--chars", type=int, default=None, help="characters of text to encode (overrides --quick)"
    )
    parser.add_argument(
        "--cores", type=int, default=2, help="Spark local[N] cores = raw Rayon threads (default 2)"
    )
    parser.add_argument("--vocab-size", type=int, default=16_384)
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON result to this file")
    args = parser.parse_args(argv)
    target = args.chars or (20_000_000 if args.quick else 80_000_000)

    # The driver's Rayon pool (raw baseline, BPE training) gets as many threads as Spark has cores; the
    # stage sets its workers' own count (tokenize.threads_per_task), whatever this says.
    os.environ["RAYON_NUM_THREADS"] = str(args.cores)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from tokenizers import Tokenizer

    from pipeline.core.config import load_config
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
                f"tokenizer.vocab_size={args.vocab_size}",
                "tokenizer.sample_docs=2000",
                "logging.console=false",
            ],
            environ={},
        )
        clean = write_clean_dataset(config, "bench", texts, files=8)
        spark = spark_session(config, "bench-tokenize")
        spark.range(1).count()  # session start is not the stage's cost

        output = DatasetRef.of(config, "tokenize", "bench")
        results = {}
        # stage -> raw (with the tokenizer the stage trained) -> stage again, so load from elsewhere on the
        # machine touches both sides alike.
        started = time.perf_counter()
        manifest = job.run(config, [clean], output)
        stage_seconds = time.perf_counter() - started
        tokenizer = Tokenizer.from_file(str(output.path / "tokenizer.json"))
        tokenizer.encode_special_tokens = True  # as the stage encodes
        for method in ("encode_batch", "encode_batch_fast"):
            rates = []
            for _ in range(2):
                rate, raw_tokens = raw_tokens_per_s(tokenizer, texts, method)
                rates.append(rate)
            results[method] = sum(rates) / len(rates)
        started = time.perf_counter()
        manifest_again = job.run(config, [clean], output)
        stage_seconds = (stage_seconds + time.perf_counter() - started) / 2
        encode_seconds = (manifest.extra["seconds"]["encode"] + manifest_again.extra["seconds"]["encode"]) / 2

    stage_tokens = sum(manifest.counters["tokens"].values())
    documents = manifest.rows["train_documents"] + manifest.rows["validation_documents"]
    text_tokens = stage_tokens - documents  # without the end-of-text the stage appends
    spark_rate = text_tokens / encode_seconds
    whole_rate = text_tokens / stage_seconds
    figures = {
        "tokens_per_s_ratio_vs_raw": round(spark_rate / results["encode_batch"], 3),
        "ratio_vs_raw_encode_batch_fast": round(spark_rate / results["encode_batch_fast"], 3),
        "whole_stage_ratio_vs_raw": round(whole_rate / results["encode_batch"], 3),
        "spark_encode_tokens_per_s": round(spark_rate),
        "whole_stage_tokens_per_s": round(whole_rate),
        "raw_encode_batch_tokens_per_s": round(results["encode_batch"]),
        "raw_encode_batch_fast_tokens_per_s": round(results["encode_batch_fast"]),
        "tokens": text_tokens,
        "raw_tokens": raw_tokens,
        "documents": documents,
        "characters": chars,
        "cores": args.cores,
        "stage_seconds": manifest.extra["seconds"],
        "quick": bool(args.quick),
    }
    rows = [
        ("raw encode_batch (in-memory list)", results["encode_batch"], 1.0),
        (
            "raw encode_batch_fast",
            results["encode_batch_fast"],
            results["encode_batch_fast"] / results["encode_batch"],
        ),
        ("Spark job: Parquet -> encode -> shards", spark_rate, figures["tokens_per_s_ratio_vs_raw"]),
        ("whole stage incl. BPE training", whole_rate, figures["whole_stage_ratio_vs_raw"]),
    ]
    print(f"\n{'':40s} {'tokens/s':>12s} {'vs raw':>8s}")
    for name, rate, ratio in rows:
        print(f"{name:40s} {rate:12,.0f} {ratio:8.2f}")
    print(f"stage steps (s): {manifest.extra['seconds']}")
    line = json.dumps(figures)
    if args.json:
        args.json.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
