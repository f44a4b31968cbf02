"""Crawl stage: seeds in, WARC files and a Parquet fetch index out."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from pipeline.core.config import PipelineConfig
from pipeline.core.manifest import Manifest
from pipeline.core.proc import run_streaming
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.crawl.crawler import CrawlSpec
from pipeline.crawl.site_server import serve_folder

log = logging.getLogger(__name__)
STAGE = "crawl"


def spider_settings(config: PipelineConfig) -> dict:
    crawl = config.crawl
    return {
        "USER_AGENT": crawl.user_agent,
        "DOWNLOAD_DELAY": crawl.download_delay,
        "CONCURRENT_REQUESTS_PER_DOMAIN": crawl.concurrent_requests_per_domain,
        "DOWNLOAD_TIMEOUT": crawl.download_timeout,
        "DOWNLOAD_MAXSIZE": crawl.download_maxsize,
    }


def crawl_stats(index_folder: Path) -> tuple[int, dict]:
    table = pq.read_table(index_folder)
    rows = table.to_pylist()
    fetched = sum(1 for row in rows if row["status"] == 200)
    counters = {
        "fetched": fetched,
        "requests": len(rows),
        "by_status": dict(Counter(str(row["status"]) for row in rows if row["status"] is not None)),
        "by_reason": dict(Counter(row["failure_reason"] for row in rows if row["failure_reason"])),
        "by_domain": dict(Counter(row["domain"] for row in rows)),
        "bytes_fetched": sum(row["content_length"] or 0 for row in rows),
    }
    return len(rows), counters


def run(config: PipelineConfig, inputs: list[DatasetRef], output: DatasetRef) -> Manifest:
    seeds = list(config.crawl.seeds)
    with StageOutput(output, config, inputs) as out, contextlib.ExitStack() as stack:
        if config.crawl.use_sample_site:
            base_url = stack.enter_context(serve_folder())
            seeds.append(f"{base_url}/index.html")
            log.info("serving the bundled sample site at %s for this crawl", base_url)
        spec = CrawlSpec(
            seeds=seeds,
            output=str(out.path),
            max_pages=config.crawl.max_pages,
            max_depth=config.crawl.max_depth,
            settings=spider_settings(config),
        )
        spec_path = out.path / "crawl_spec.json"
        spec.write(spec_path)
        log.info("crawling %d seed(s), at most %d pages", len(seeds), config.crawl.max_pages)
        run_streaming([sys.executable, "-m", "pipeline.crawl.crawler", str(spec_path)], logger=log)
        spec_path.unlink()
        requests, counters = crawl_stats(out.path / "index")
        log.info("crawl done: %d pages fetched of %d requests", counters["fetched"], requests)
        return out.commit(rows={"index": requests, "pages": counters["fetched"]}, counters=counters)
