"""Crawl throughput against the local test site at 1, 4 and 16 concurrent requests, and where the time goes.

Runs the real crawler process (Scrapy + WARC + journal) on a generated site served from this process on
127.0.0.1, once per concurrency, then once more at the highest concurrency under cProfile. Pages/s and
MB/s are measured over the crawl itself (Scrapy's elapsed time from spider open to close); process
start-up and the stage's index build are reported separately. On a shared machine wall-clock rates
follow the machine's load, so the crawler's CPU time per page (start-up excluded) is printed too.

    .venv/bin/python benchmarks/crawl.py --quick
"""

from __future__ import annotations

# Run as a script, this folder is sys.path[0]: the repository root replaces it, for the test site
# (tests/crawl/testsite.py, not installed).
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [e for e in sys.path if os.path.abspath(e or os.curdir) != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import pstats  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from benchmarks.smoke import add_smoke_flag  # noqa: E402
from pipeline.crawl.crawler import JOB_DIR, SPEC_NAME, CrawlSpec  # noqa: E402
from pipeline.crawl.index import index_table, write_index  # noqa: E402
from pipeline.crawl.journal import read_journal  # noqa: E402
from tests.crawl.testsite import TestSite  # noqa: E402

# Where a function's own time goes, by the file it lives in (first match wins).
BUCKETS = [
    ("Python start-up (imports)", ("<frozen importlib", "marshal", "_imp.", "{built-in method _imp")),
    ("WARC writing (warcio, gzip, digests)", ("warcio", "pipeline/crawl/warc.py", "gzip.py", "zlib", "hashlib", "_hashlib")),
    ("journal (JSON lines)", ("pipeline/crawl/journal.py", "json/")),
    ("link extraction (lxml, parsel)", ("lxml", "parsel", "linkextractors", "cssselect")),
    ("frontier (canonical URLs, sites)", ("pipeline/crawl/frontier.py", "pipeline/documents/urls.py", "w3lib", "tldextract", "idna")),
    ("HTTP client (Twisted)", ("twisted/web", "twisted/internet", "twisted/protocols", "twisted/python", "zope")),
    ("Scrapy engine, middlewares, signals", ("scrapy", "pydispatch", "pipeline/crawl/middlewares.py", "pipeline/crawl/spiders.py", "pipeline/crawl/crawler.py")),
    ("socket and selector syscalls", ("selectors.py", "socket.py", "{method 'recv'", "{method 'send'", "{method 'poll'")),
]  # fmt: skip


def crawl_once(
    site: TestSite, folder: Path, concurrency: int, profile: Path | None = None, max_pages: int | None = None
) -> dict:
    (folder / JOB_DIR).mkdir(parents=True)
    site.max_in_flight = 0
    spec = CrawlSpec(
        seeds=[site.url("/index.html")],
        output=str(folder),
        max_pages=max_pages or site.pages + 10,
        max_depth=3,
        settings={
            "CONCURRENT_REQUESTS": concurrency,
            "CONCURRENT_REQUESTS_PER_DOMAIN": concurrency,
            "DOWNLOAD_DELAY": 0,
            "AUTOTHROTTLE_ENABLED": False,
            "CRAWL_ALLOWED_PRIVATE_HOSTS": ["127.0.0.1"],
            "LOG_LEVEL": "WARNING",
            "CRAWL_PROGRESS_INTERVAL": 0,
        },
    )
    spec.write(folder / JOB_DIR / SPEC_NAME)
    command = [sys.executable]
    if profile is not None:
        command += ["-m", "cProfile", "-o", str(profile)]
    command += ["-m", "pipeline.crawl.crawler", str(folder / JOB_DIR / SPEC_NAME)]
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_cpu, started = time.process_time(), time.perf_counter()
    subprocess.run(command, check=True)
    wall = time.perf_counter() - started
    server_cpu = time.process_time() - server_cpu  # this process only serves the site meanwhile
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    crawler_cpu = (children.ru_utime - children_before.ru_utime) + (
        children.ru_stime - children_before.ru_stime
    )
    stats = json.loads(next((folder / JOB_DIR).glob("stats.a*.json")).read_text())["stats"]

    index_started = time.perf_counter()
    state = read_journal(folder / JOB_DIR)
    table = index_table(state.rows("page"))
    write_index(table, folder / "index" / "bench.parquet")
    index_s = time.perf_counter() - index_started

    pages = sum(1 for row in state.rows("page") if row["status"] == 200)
    body_bytes = sum(row["content_length"] for row in state.rows("page"))
    elapsed = float(stats["elapsed_time_seconds"])
    return {
        "concurrency": concurrency,
        "pages": pages,
        "mb": body_bytes / 1e6,
        "crawl_s": elapsed,
        "wall_s": wall,
        "index_s": index_s,
        "server_cpu_s": server_cpu,
        "crawler_cpu_s": crawler_cpu,  # whole process, start-up included: a figure the machine's load barely moves
        "pages_per_s": pages / elapsed,
        "mb_per_s": body_bytes / 1e6 / elapsed,
        "max_in_flight": site.max_in_flight,
        "warc_mb": sum(p.stat().st_size for p in (folder / "warc").glob("*.warc.gz")) / 1e6,
    }


def where_time_goes(profile: Path, top: int = 12) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    stats = pstats.Stats(str(profile))
    total = sum(entry[2] for entry in stats.stats.values())  # own time of every function

    def bucket_of(filename: str, line: int, name: str) -> str:
        where = f"{filename}:{line}({name})"
        return next((label for label, keys in BUCKETS if any(key in where for key in keys)), "other")

    buckets: dict[str, float] = {}
    functions = []
    for (filename, line, name), (_, _, own, _, callers) in stats.stats.items():
        functions.append((f"{filename}:{line}({name})".replace(str(Path(sys.prefix)), "<venv>"), own))
        if filename == "~" and callers:  # a C builtin (zlib.compress, socket.send): charge whoever called it
            called = sum(entry[2] for entry in callers.values()) or 1.0
            for caller, entry in callers.items():
                label = bucket_of(*caller)
                buckets[label] = buckets.get(label, 0.0) + own * entry[2] / called
        else:
            label = bucket_of(filename, line, name)
            buckets[label] = buckets.get(label, 0.0) + own
    shares = sorted(
        ((label, seconds / total) for label, seconds in buckets.items()), key=lambda item: -item[1]
    )
    functions.sort(key=lambda item: -item[1])
    return shares, [(where, seconds / total) for where, seconds in functions[:top]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small site: well under 3 minutes on 2 cores")
    add_smoke_flag(parser)
    parser.add_argument("--pages", type=int, help="pages on the site (default 2000, --quick 400, --smoke 20)")
    parser.add_argument("--page-kb", type=int, default=16, help="size of each page (default 16 KB)")
    parser.add_argument("--concurrency", default=None, help="comma-separated (default 1,4,16; --smoke 1,16)")
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile run")
    args = parser.parse_args(argv)
    pages = args.pages or (20 if args.smoke else 400 if args.quick else 2000)
    concurrency = args.concurrency or ("1,16" if args.smoke else "1,4,16")
    levels = [int(level) for level in concurrency.split(",")]

    results = []
    with TestSite(pages=pages, links_per_page=3, page_bytes=args.page_kb * 1024, bad_cases=False) as site:
        for page in range(pages):  # generate pages up front: the server should cost as little as possible
            site.page(page)
        work = Path(tempfile.mkdtemp(prefix="crawl-bench-"))
        try:
            # Start-up (imports, reactor) costs the same whatever the crawl: measure it on a one-page crawl.
            startup_cpu = crawl_once(site, work / "startup", 1, max_pages=1)["crawler_cpu_s"]
            print(f"crawler start-up: {startup_cpu:.2f} CPU-s (one-page crawl)")
            for level in levels:
                result = crawl_once(site, work / f"c{level}", level)
                result["pages_per_cpu_s"] = result["pages"] / max(result["crawler_cpu_s"] - startup_cpu, 1e-3)
                results.append(result)
                print(
                    f"concurrency {level:>3}: {result['pages']} pages, {result['mb']:.1f} MB in {result['crawl_s']:.2f} s"
                    f" -> {result['pages_per_s']:.0f} pages/s, {result['mb_per_s']:.1f} MB/s"
                    f"  (process wall {result['wall_s']:.1f} s, crawler CPU {result['crawler_cpu_s']:.1f} s,"
                    f" server CPU {result['server_cpu_s']:.1f} s, index build {result['index_s']:.2f} s,"
                    f" at most {result['max_in_flight']} requests at the server at once;"
                    f" {result['pages_per_cpu_s']:.0f} pages per crawler CPU-second after start-up)",
                    flush=True,
                )
            if not args.no_profile:
                profile = work / "crawl.prof"
                crawl_once(site, work / "profiled", levels[-1], profile=profile)
                shares, functions = where_time_goes(profile)
                print(
                    f"\nwhere the crawler's CPU time goes at concurrency {levels[-1]} (cProfile, own time):"
                )
                for label, share in shares:
                    print(f"  {share:6.1%}  {label}")
                print("top functions:")
                for where, share in functions:
                    print(f"  {share:6.1%}  {where}")
        finally:
            shutil.rmtree(work, ignore_errors=True)

    base = results[0]
    print(
        "\nspeed-up over concurrency",
        base["concurrency"],
        ":",
        ", ".join(f"c{r['concurrency']} x{r['pages_per_s'] / base['pages_per_s']:.2f}" for r in results),
    )
    by_level = {r["concurrency"]: r for r in results}
    top = by_level.get(16, results[-1])
    figures = {"pages_per_s_c16": round(top["pages_per_s"], 1), "mb_per_s_c16": round(top["mb_per_s"], 2)}
    for r in results:
        figures[f"pages_per_s_c{r['concurrency']}"] = round(r["pages_per_s"], 1)
        figures[f"mb_per_s_c{r['concurrency']}"] = round(r["mb_per_s"], 2)
        figures[f"pages_per_cpu_s_c{r['concurrency']}"] = round(r["pages_per_cpu_s"], 1)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
