"""Ingest + clean vs datatrove's reader + FineWeb chain, for WET and for Parquet input, same records, same cores.

    make bench-venv
    .venv-bench/bin/python benchmarks/ingest.py --quick    # 4,000 documents per format, under 3 minutes
    .venv-bench/bin/python benchmarks/ingest.py            # 50,000 documents per format

The records are benchmarks/clean.py's generated corpus (prose, boilerplate, repetition, code, other
languages, junk...) in its normalised form, written once as Common Crawl-style WET files (warcinfo, then
one ``conversion`` record per document, gzip per record, with warcio) and once as Parquet (id, url, text),
16 files each. Normalised, so both sides decide on the same characters (as in benchmarks/clean.py); ours
normalises again anyway, which is counted.

* ours: ``pretrain ingest`` then ``pretrain clean --input-stage ingest`` as stages (``job.run``: listing,
  checksums, the Spark reads, documents/ and excluded/ written byte-deterministically, manifests) on
  ``local[N]``, default config (recipe ``fineweb``).
* datatrove 0.10.1: ``LocalPipelineExecutor`` with N workers, one task per file: WarcReader or
  ParquetReader -> the FineWeb filters as its examples/fineweb.py configures them
  (``benchmarks.clean.fineweb_filters``) -> ParquetWriter, an exclusion writer per filter.

Reported per format and for both together: documents/s and text MB/s per core (wall clock), documents per
CPU second of each process tree, and the share of documents (matched by URL) on which both make the same
keep/drop decision. A document datatrove's reader does not yield counts as dropped by it ("not read": its
WarcReader keeps only records libmagic calls text/plain or text/html). The Spark session start and one
untimed warm-up run of both stages on 500 other WET documents are not counted for ours (reported); datatrove's
worker start-up is inside its time. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this folder is sys.path[0]: replace it by the repository root (benchmarks.clean,
# tests.conftest).
sys.path[:] = [str(ROOT)] + [e for e in sys.path if Path(e or os.curdir).resolve() != ROOT / "benchmarks"]

from benchmarks.clean import (  # noqa: E402
    SMOKE_DOCS,
    WARM_UP_DOCS,
    bench_config,
    build_corpus,
    compare,
    cpu_seconds_since,
    datatrove_chain,
    datatrove_decisions,
    our_decisions,
    process_cpu,
    run_datatrove_pipeline,
)
from benchmarks.smoke import add_smoke_flag, baseline_skipped  # noqa: E402

FORMATS = ("wet", "parquet")
INGEST_CORPUS_VERSION = 1  # bump when write_sources changes


def write_sources(normalized_dir: Path, folder: Path) -> dict:
    """clean.py's normalised corpus as WET files and as Parquet files, one of each per corpus file;
    reused when present. Returns the record count and the UTF-8 bytes of their texts."""
    import pyarrow.parquet as pq
    from warcio.warcwriter import WARCWriter

    done = folder / "_DONE"
    if done.exists():
        return json.loads(done.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    for fmt in FORMATS:
        (folder / fmt).mkdir(parents=True)
    records = text_bytes = 0
    for part in sorted(normalized_dir.glob("*.parquet")):
        table = pq.read_table(part, columns=["id", "url", "text", "fetch_time"])
        pq.write_table(table.select(["id", "url", "text"]), folder / "parquet" / part.name)
        name = f"CC-MAIN-bench-{part.stem}.warc.wet.gz"
        with open(folder / "wet" / name, "wb") as handle:
            writer = WARCWriter(handle, gzip=True)
            writer.write_record(writer.create_warcinfo_record(name, {"software": "benchmarks/ingest.py"}))
            for row in table.to_pylist():
                body = row["text"].encode("utf-8")
                date = row["fetch_time"].astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                record = writer.create_warc_record(
                    row["url"],
                    "conversion",
                    payload=io.BytesIO(body),
                    warc_content_type="text/plain",
                    warc_headers_dict={"WARC-Date": date},
                )
                writer.write_record(record)
                records += 1
                text_bytes += len(body)
    summary = {"records": records, "text_bytes": text_bytes}
    done.write_text(json.dumps(summary))
    return summary


def corpus(count: int, seed: int, out: Path) -> tuple[Path, dict]:
    _, normalized_dir = build_corpus(count, seed, out)
    folder = out / f"sources-v{INGEST_CORPUS_VERSION}-{count}-{seed}"
    return folder, write_sources(normalized_dir, folder)


# --- ours ----------------------------------------------------------------------------------------------


def run_ours(sources: Path, fmt: str, data_root: Path, workers: int) -> dict:
    """The ingest stage on ``sources/<fmt>`` and the clean stage on its output, as the CLI runs them."""
    from pipeline.clean import job as clean_job
    from pipeline.core.spark import spark_session
    from pipeline.core.storage import DatasetRef
    from pipeline.ingest import job as ingest_job

    config = bench_config(
        data_root, workers, f"ingest.sources={json.dumps([str(sources / fmt)])}", "ingest.id_column=id"
    )
    spark_session(config, "bench-ingest")  # started (or found) before the clock, as in clean.py
    ingest, clean = DatasetRef.of(config, "ingest", fmt), DatasetRef.of(config, "clean", fmt)
    begin, cpu_begin = time.perf_counter(), process_cpu()
    ingested = ingest_job.run(config, [], ingest)
    middle = time.perf_counter()
    cleaned = clean_job.run(config, [ingest], clean)
    seconds, cpu_seconds = time.perf_counter() - begin, cpu_seconds_since(cpu_begin)
    return {
        "seconds": seconds,
        "ingest_seconds": middle - begin,
        "cpu_seconds": cpu_seconds,
        "documents": ingested.counters["documents"],
        "quarantined": ingested.counters["excluded"],
        "kept": cleaned.counters["kept"],
        "decisions": {**quarantined(ingest.path), **our_decisions(clean.path, key="url")},
    }


def quarantined(ingest_path: Path) -> dict[str, str]:
    """url -> reason for the records the ingest stage quarantined (none expected here): dropped by ours."""
    import pyarrow.parquet as pq

    table = pq.read_table(ingest_path / "excluded", columns=["url", "drop_reason"])
    return {
        url: f"ingest.{reason}"
        for url, reason in zip(
            table.column("url").to_pylist(), table.column("drop_reason").to_pylist(), strict=True
        )
        if url
    }


# --- datatrove ---------------------------------------------------------------------------------------


def run_datatrove(sources: Path, fmt: str, out: Path, clean, workers: int) -> dict:
    from datatrove.pipeline.readers import ParquetReader, WarcReader

    shutil.rmtree(out, ignore_errors=True)
    if fmt == "wet":
        reader = WarcReader(str(sources / fmt), glob_pattern="*.warc.wet.gz")
    else:
        reader = ParquetReader(str(sources / fmt), text_key="text", id_key="id", glob_pattern="*.parquet")
    files = len(list((sources / fmt).iterdir()))
    timing = run_datatrove_pipeline(datatrove_chain(reader, out, clean), out, files, workers)
    return {**timing, "decisions": datatrove_decisions(out, key="url")}


# --- report ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="4,000 documents per format (under 3 minutes)")
    parser.add_argument("--docs", type=int, default=None, help="documents per format (default 50,000)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--workers", type=int, default=2, help="Spark local[N] and datatrove workers")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "ingest")
    parser.add_argument("--show", type=int, default=3, help="example URLs shown per disagreement kind")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    skipped = baseline_skipped("datatrove")
    if skipped and not args.smoke:
        parser.error("datatrove is missing: run `make bench-venv` and use .venv-bench/bin/python")
    count = args.docs or (SMOKE_DOCS if args.smoke else 4_000 if args.quick else 50_000)
    sources, summary = corpus(count, args.seed, args.out)
    data_root = args.out / "data"
    shutil.rmtree(data_root, ignore_errors=True)

    # First runs pay for JIT compilation and Python worker start-up: paid on other documents, reported.
    session_begin = time.perf_counter()
    from pipeline.core.spark import spark_session

    spark_session(bench_config(data_root, args.workers), "bench-ingest")
    session_seconds = time.perf_counter() - session_begin
    # Smoke mode has no warm-up: it only moves time out of the figures, which mean nothing there.
    warm_seconds = warm_cpu = 0.0
    if not args.smoke:
        warm_sources, _ = corpus(WARM_UP_DOCS, args.seed + 1, args.out)
        warm_begin, warm_cpu_begin = time.perf_counter(), process_cpu()
        run_ours(warm_sources, "wet", args.out / "warm-up", args.workers)  # the Parquet path has no other JIT
        warm_seconds, warm_cpu = time.perf_counter() - warm_begin, cpu_seconds_since(warm_cpu_begin)
        print(f"ours warm-up, {WARM_UP_DOCS} WET documents: {warm_seconds:.1f} s, {warm_cpu:.1f} CPU s")

    from pipeline.clean.config import CleanConfig

    results = {}
    for fmt in FORMATS:
        ours = run_ours(sources, fmt, data_root, args.workers)
        print(f"ours, {fmt}: {ours['seconds']:.1f} s (ingest {ours['ingest_seconds']:.1f} s)", flush=True)
        if skipped:
            results[fmt] = {"ours": ours}
            continue
        theirs = run_datatrove(sources, fmt, args.out / "datatrove" / fmt, CleanConfig(), args.workers)
        print(f"datatrove, {fmt}: {theirs['seconds']:.1f} s", flush=True)
        agreement, disagreements = compare(ours["decisions"], theirs["decisions"], unseen="not read")
        results[fmt] = {"ours": ours, "datatrove": theirs, "agreement": agreement, "disagree": disagreements}

    load = os.getloadavg()[0]
    mb = summary["text_bytes"] / 1e6
    docs = summary["records"]
    if skipped:
        ours_only: dict = {"docs_per_format": docs, "baseline": skipped}
        for fmt, part in results.items():
            ours = part["ours"]
            ours_only[fmt] = {
                "ours_docs_per_s": round(docs / ours["seconds"], 1),
                "ours_documents": ours["documents"],
                "ours_kept": ours["kept"],
                "ours_quarantined": ours["quarantined"],
            }
        print(json.dumps(ours_only))
        return 0
    print(f"\n{docs:,} documents ({mb:.1f} MB of text) per format, {args.workers} cores")
    header = f"{'':22}{'seconds':>9}{'docs/s':>9}{'MB/s/core':>11}{'CPU s':>8}{'docs/CPU s':>12}{'kept':>7}"
    print(header)
    for fmt, result in results.items():
        for name, run in (("ours", result["ours"]), ("datatrove 0.10.1", result["datatrove"])):
            kept = sum(rule is None for rule in run["decisions"].values())
            print(
                f"{fmt + ' ' + name:22}{run['seconds']:>9.1f}{docs / run['seconds']:>9.1f}"
                f"{mb / run['seconds'] / args.workers:>11.3f}{run['cpu_seconds']:>8.1f}"
                f"{docs / run['cpu_seconds']:>12.1f}{kept:>7}"
            )
    for fmt, result in results.items():
        ratio = result["datatrove"]["seconds"] / result["ours"]["seconds"]
        print(f"{fmt}: {ratio:.2f}x datatrove's docs/s; agreement {result['agreement']:.4%}")
        for (our_rule, their_reason), number in result["disagree"].most_common():
            examples = [
                url
                for url, rule in result["ours"]["decisions"].items()
                if (rule or "kept") == our_rule
                and (result["datatrove"]["decisions"].get(url, "not read") or "kept") == their_reason
            ][: args.show]
            print(f"  {number:6d}  ours={our_rule:40s} datatrove={their_reason:40s} e.g. {examples}")
    print(
        f"(not counted for ours: Spark session start {session_seconds:.1f} s, warm-up {warm_seconds:.1f} s / "
        f"{warm_cpu:.1f} CPU s; 1-minute load average: {load:.1f})"
    )

    def total(side: str, key: str) -> float:
        return sum(result[side][key] for result in results.values())

    ratio = total("datatrove", "seconds") / total("ours", "seconds")
    agreement = sum(result["agreement"] for result in results.values()) / len(results)
    result = {
        "docs_per_s_ratio_vs_datatrove": round(ratio, 2),
        "decision_agreement": round(agreement, 5),
        "docs_per_format": docs,
        "text_mb_per_format": round(mb, 1),
        "cores": args.workers,
        "docs_per_cpu_s_ratio_vs_datatrove": round(
            total("datatrove", "cpu_seconds") / total("ours", "cpu_seconds"), 2
        ),
        "load_average": round(load, 1),
    }
    for fmt, part in results.items():
        ours, theirs = part["ours"], part["datatrove"]
        result[fmt] = {
            "ours_docs_per_s": round(docs / ours["seconds"], 1),
            "datatrove_docs_per_s": round(docs / theirs["seconds"], 1),
            "ours_mb_per_s_per_core": round(mb / ours["seconds"] / args.workers, 3),
            "datatrove_mb_per_s_per_core": round(mb / theirs["seconds"] / args.workers, 3),
            "docs_per_s_ratio_vs_datatrove": round(theirs["seconds"] / ours["seconds"], 2),
            "docs_per_cpu_s_ratio_vs_datatrove": round(theirs["cpu_seconds"] / ours["cpu_seconds"], 2),
            "ours_ingest_s": round(ours["ingest_seconds"], 1),
            "ours_quarantined": ours["quarantined"],
            "decision_agreement": round(part["agreement"], 5),
        }
    (args.out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    if args.smoke:
        result["baseline"] = "datatrove"
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
