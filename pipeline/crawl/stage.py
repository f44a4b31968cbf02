"""Crawl stage: seeds in, WARC files and a Parquet fetch index out, one shard or all of them.

- ``crawl_shard``: one shard's crawl in a child process (pipeline.crawl.crawler), into a resumable
  staging folder: a killed crawl is resumed by running the same command again;
- ``merge_shards``: the shards' outputs become the snapshot's one ``crawl`` dataset that clean reads;
- ``run``: the stage contract; a whole crawl (every shard, then the merge when there are several).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import PipelineConfig
from pipeline.core.manifest import Manifest
from pipeline.core.proc import run_streaming
from pipeline.core.storage import DatasetRef, MissingInputError, StageFailure, StageOutput
from pipeline.crawl.crawler import JOB_DIR, LOCK_NAME, SPEC_NAME, CrawlSpec, ShardLock
from pipeline.crawl.index import INDEX_SCHEMA, add_counts, crawl_counters, index_table, write_index
from pipeline.crawl.journal import JournalState, read_journal
from pipeline.crawl.safety import REFUSED_REASON
from pipeline.crawl.sharding import shard_name, shard_of, shard_ref, split_seeds
from pipeline.crawl.site_server import serve_folder
from pipeline.documents.urls import host_of, registered_domain

log = logging.getLogger(__name__)
STAGE = "crawl"
SAMPLE_HOST = "127.0.0.1"
LOCK_WAIT_S = 60.0  # an orphan of a killed stage dies with it (PDEATHSIG); give it time to go


def spider_settings(config: PipelineConfig, sample_site: str | None = None) -> dict[str, Any]:
    """Scrapy settings from the config's crawl section; ``sample_site``: ``host:port`` of the bundled site
    this crawl serves."""
    crawl = config.crawl
    settings: dict[str, Any] = {
        "USER_AGENT": crawl.user_agent,
        "DOWNLOAD_DELAY": crawl.download_delay,
        "AUTOTHROTTLE_ENABLED": crawl.autothrottle,
        "AUTOTHROTTLE_START_DELAY": max(crawl.download_delay, 1.0),
        "AUTOTHROTTLE_MAX_DELAY": crawl.autothrottle_max_delay,
        "AUTOTHROTTLE_TARGET_CONCURRENCY": crawl.autothrottle_target_concurrency,
        "CONCURRENT_REQUESTS": crawl.concurrent_requests,
        "CONCURRENT_REQUESTS_PER_DOMAIN": crawl.concurrent_requests_per_domain,
        "DOWNLOAD_TIMEOUT": crawl.download_timeout,
        "DNS_TIMEOUT": crawl.download_timeout,
        "DOWNLOAD_MAXSIZE": crawl.download_maxsize,
        "DOWNLOAD_WARNSIZE": min(crawl.download_maxsize, 32 * 1024 * 1024),
        "RETRY_TIMES": crawl.retry_times,
        "RETRY_HTTP_CODES": list(crawl.retry_http_codes),
        "RETRY_GIVE_UP_LOG_LEVEL": "INFO",  # a page that stays at 500 is an outcome we count, not an error
        "REDIRECT_MAX_TIMES": crawl.max_redirects,
        "CRAWL_MAX_CRAWL_DELAY": crawl.max_crawl_delay,
        "CRAWL_RETRY_BACKOFF": crawl.retry_backoff_s,
        "CRAWL_RETRY_BACKOFF_MAX": crawl.retry_backoff_max_s,
        "CRAWL_ALLOWED_CONTENT_TYPES": list(crawl.allowed_content_types),
        "CRAWL_ALLOWED_PRIVATE_HOSTS": list(crawl.allowed_private_hosts),
        "CRAWL_ALLOW_WIDE_PRIVATE_NETWORKS": crawl.allow_wide_private_networks,
        "CRAWL_HOST_ADDRESSES": dict(crawl.host_addresses),
        "CRAWL_SEED": config.project.seed,
        "LOG_LEVEL": "DEBUG" if config.logging.level == "DEBUG" else "INFO",
    }
    if sample_site:
        # Our own server on loopback: allow its port only, and skip delays meant to spare other people's
        # servers. Another service on this machine stays refused.
        settings["CRAWL_ALLOWED_PRIVATE_HOSTS"] = [*settings["CRAWL_ALLOWED_PRIVATE_HOSTS"], sample_site]
        settings.update(DOWNLOAD_DELAY=0.0, AUTOTHROTTLE_ENABLED=False)
    return settings


def _discard_unfinished(folder: Path) -> None:
    """Empty a resumable staging folder, keeping only the lock file we hold."""
    for child in folder.iterdir():
        if child.name == JOB_DIR:
            for item in child.iterdir():
                if item.name != LOCK_NAME:
                    shutil.rmtree(item) if item.is_dir() else item.unlink()
        elif child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()


@contextlib.contextmanager
def _sample_site(previous: CrawlSpec | None):
    """Serve the bundled site, on the port of the killed attempt when possible so its URLs still match."""
    port = 0
    if previous is not None:
        sample = [seed for seed in previous.seeds if seed.startswith(f"http://{SAMPLE_HOST}:")]
        if sample:
            port = int(sample[0].split(":")[2].split("/")[0])
    with contextlib.ExitStack() as stack:
        try:
            base_url = stack.enter_context(serve_folder(port=port))
        except OSError:  # taken by now: a fresh port, and the unfinished crawl starts over
            base_url = stack.enter_context(serve_folder())
        yield base_url


def check_index(table: pa.Table, folder: Path) -> None:
    """Refuse to publish an index that points outside its WARC files or lists a URL twice."""
    urls = table.column("url")
    if len(urls.unique()) != table.num_rows:
        raise RuntimeError(f"{folder}: the fetch index lists a URL twice; not publishing")
    sizes: dict[str, int] = {}
    stored = table.filter(table.column("warc_file").is_valid())
    for warc_file, offset, length in zip(
        stored.column("warc_file").to_pylist(),
        stored.column("warc_offset").to_pylist(),
        stored.column("warc_length").to_pylist(),
        strict=True,
    ):
        if warc_file not in sizes:
            path = folder / warc_file
            sizes[warc_file] = path.stat().st_size if path.is_file() else -1
        if offset + length > sizes[warc_file]:
            raise RuntimeError(f"{folder}: index row points past the end of {warc_file}; not publishing")


def _never_finished(state: JournalState, shard: str) -> list[dict[str, Any]]:
    """Rows for URLs queued but without an outcome after a finished crawl: none unless Scrapy dropped a
    request without calling its errback; listed with a reason rather than lost."""
    rows = []
    for entry in state.pending():
        if entry.kind != "page":
            continue
        log.warning("%s: %s was queued but never finished", shard, entry.url)
        rows.append(
            {
                "url": entry.url,
                "domain": host_of(entry.url),
                "registered_domain": registered_domain(entry.url),
                "depth": entry.depth,
                "content_length": 0,
                "fetch_time": datetime.now(UTC),
                "failure_reason": "not_fetched",
                "redirects": 0,
                "retries": 0,
                "shard": shard,
            }
        )
    return rows


def _journal_counters(state: JournalState) -> dict[str, Any]:
    """What the index does not show: links found and skipped, sitemaps read, attempts."""
    links: dict[str, int] = {}
    for event in state.done.values():
        if event.get("links") and event["kind"] == "page":
            links = add_counts(links, event["links"])
    sitemaps = state.rows("sitemap")
    sitemap_reasons: dict[str, int] = {}
    for row in sitemaps:
        if row["failure_reason"]:
            sitemap_reasons[row["failure_reason"]] = sitemap_reasons.get(row["failure_reason"], 0) + 1
    counters = {"links": dict(sorted(links.items())), "attempts": state.attempts}
    if sitemaps:
        counters["sitemaps"] = {
            "requests": len(sitemaps),
            "fetched": sum(1 for row in sitemaps if row["status"] == 200 and not row["failure_reason"]),
            "by_reason": sitemap_reasons,
        }
    return counters


def crawl_shard(config: PipelineConfig, output: DatasetRef, shard: int = 0, num_shards: int = 1) -> Manifest:
    """Crawl one shard's seeds into ``output`` (published atomically); rerunning resumes a killed crawl."""
    name = shard_name(shard, num_shards)
    seeds = split_seeds(config.crawl.seeds, num_shards)[shard]
    serve_sample = config.crawl.use_sample_site and shard_of(SAMPLE_HOST, num_shards) == shard
    with StageOutput(output, config, [], resumable=True) as out, contextlib.ExitStack() as stack:
        job = out.path / JOB_DIR
        lock = ShardLock(job).acquire(wait_s=LOCK_WAIT_S)
        spec_path = job / SPEC_NAME
        previous = CrawlSpec.read(spec_path) if spec_path.exists() else None
        sample_address = None  # host:port of the bundled site, the one private address this crawl may fetch
        if serve_sample:
            base_url = stack.enter_context(_sample_site(previous))
            sample_address = base_url.split("://", 1)[1].rstrip("/")
            sample_seed = "/sitemap.xml" if config.crawl.spider == "sitemap" else "/index.html"
            seeds = [*seeds, base_url + sample_seed]
            log.info("serving the bundled sample site at %s for this crawl", base_url)
        spec = CrawlSpec(
            seeds=seeds,
            output=str(out.path),
            shard=name,
            spider=config.crawl.spider,
            max_pages=config.crawl.max_pages,
            max_depth=config.crawl.max_depth,
            warc_max_bytes=config.crawl.warc_max_bytes,
            settings=spider_settings(config, sample_site=sample_address),
            parent_pid=os.getpid(),
        )
        if previous is not None:
            if not config.crawl.resume:
                log.warning("%s: crawl.resume is off; discarding the unfinished crawl", name)
                _discard_unfinished(out.path)
            elif previous.identity() != spec.identity():
                log.warning("%s: seeds or spider changed since the unfinished crawl; starting over", name)
                _discard_unfinished(out.path)
            else:
                log.info("%s: resuming the unfinished crawl in %s", name, out.path)
        spec.write(spec_path)
        lock.release()  # the crawler process takes it for as long as it writes
        if seeds:
            log.info("%s: crawling %d seed(s), at most %d pages", name, len(seeds), spec.max_pages)
            run_streaming([sys.executable, "-m", "pipeline.crawl.crawler", str(spec_path)], logger=log)
        else:
            log.info("%s: no seed belongs to this shard; publishing an empty index", name)
        lock.acquire(wait_s=LOCK_WAIT_S)
        state = read_journal(job)
        table = index_table([*state.rows("page"), *_never_finished(state, name)])
        check_index(table, out.path)
        write_index(table, out.path / "index" / f"{name}.parquet")
        counters = {**crawl_counters(table), **_journal_counters(state), "shards": 1}
        if hosts := refused_hosts(table):
            counters["refused_hosts"] = hosts
        if num_shards == 1:
            check_not_empty(config, output.snapshot, counters)  # the journal stays: a rerun resumes
        attempts = [_attempt_summary(path) for path in sorted(job.glob("stats.a*.json"))]
        shutil.rmtree(job)  # the journal's content is now the index; the lock goes with it
        lock.release()
        log.info("%s: %s", name, crawl_summary(counters, config.crawl.max_pages))
        return out.commit(
            rows={"index": counters["requests"], "pages": counters["fetched"]},
            counters=counters,
            extra={"shard": name, "seeds": seeds, "spider": config.crawl.spider, "attempts": attempts},
        )


def crawl_summary(counters: dict[str, Any], max_pages: int) -> str:
    """The crawl's last line: what it fetched and stored, why the rest failed, and whether the page limit cut
    it short (the manifest alone used to say so, in its link counts)."""
    reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(counters["by_reason"].items()))
    line = (
        f"{counters['requests']} URLs requested: {counters['fetched']} pages fetched (HTTP 200), "
        f"{counters['stored']} responses stored in WARC; failures: {reasons or 'none'}"
    )
    unfollowed = counters.get("links", {}).get("page_limit", 0)
    if unfollowed:
        line += (
            f". The page limit was reached (crawl.max_pages={max_pages}): {unfollowed} more links were not "
            f"followed; raise it with --set crawl.max_pages=<pages>"
        )
    return line


def refused_hosts(table) -> list[str]:
    """Hosts whose requests were refused for a private or loopback address (the index's rows)."""
    rows = zip(table.column("url").to_pylist(), table.column("failure_reason").to_pylist(), strict=True)
    return sorted({host_of(url) for url, reason in rows if reason == REFUSED_REASON})


def check_not_empty(config: PipelineConfig, snapshot: str, counters: dict[str, Any]) -> None:
    """A crawl that stored no page fails with its reasons and the setting that would fix the commonest one,
    unless crawl.allow_empty says it may publish."""
    if counters["fetched"] > 0 or config.crawl.allow_empty:
        return
    reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(counters["by_reason"].items()))
    hosts = counters.get("refused_hosts", [])
    if hosts:
        advice = (
            f"{', '.join(hosts)} resolved to a private or loopback address, which the crawl refuses unless "
            f"allow-listed: --set crawl.allowed_private_hosts='[{', '.join(hosts)}]'"
        )
    else:
        advice = "Check the seeds and the log above, or set crawl.allow_empty=true to publish an empty crawl"
    raise StageFailure(
        f"the crawl of snapshot {snapshot!r} stored no page: {counters['requests']} URL(s) tried"
        f"{'; ' + reasons if reasons else ''}. {advice}"
    )


def _attempt_summary(path: Path) -> dict[str, Any]:
    import json

    data = json.loads(path.read_text())
    stats = data.get("stats", {})
    keep = (
        "downloader/request_count",
        "downloader/response_bytes",
        "retry/count",
        "robotstxt/request_count",
        "robotstxt/crawl_delay_honoured",
        "robotstxt/crawl_delay_capped",
    )
    return {
        "attempt": int(path.name.split(".")[1][1:]),
        "finish_reason": data.get("finish_reason"),
        **{key: stats[key] for key in keep if key in stats},
        "elapsed_time_seconds": stats.get("elapsed_time_seconds"),
    }


def _link_or_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)  # published files never change, so sharing the inode is safe
    except OSError:
        shutil.copy2(source, target)


def merge_shards(config: PipelineConfig, output: DatasetRef) -> Manifest:
    """Publish the snapshot's ``crawl`` dataset from its ``crawl.num_shards`` published shards."""
    num_shards = config.crawl.num_shards
    refs = [shard_ref(config, output.snapshot, shard) for shard in range(num_shards)]
    missing = [shard for shard, ref in enumerate(refs) if not ref.is_complete()]
    if missing:
        shown = ", ".join(map(str, missing[:20])) + (" ..." if len(missing) > 20 else "")
        raise MissingInputError(
            f"cannot merge the crawl of snapshot {output.snapshot!r}: {len(missing)} of {num_shards} shard(s) "
            f"not published (shard {shown}); run `pretrain crawl --snapshot {output.snapshot} --shard I "
            f"--num-shards {num_shards}` for each"
        )
    with StageOutput(output, config, refs) as out:
        counters: dict[str, Any] = {}
        per_shard = {}
        for ref in refs:
            manifest = ref.manifest()
            for relative in manifest.files:
                if relative.startswith(("warc/", "index/")):
                    _link_or_copy(ref.path / relative, out.path / relative)
            shard_counters = dict(manifest.counters)
            shard_counters.pop("attempts", None)
            counters = add_counts(counters, shard_counters)
            per_shard[manifest.extra.get("shard", ref.snapshot)] = {
                key: manifest.counters.get(key, 0)
                for key in ("requests", "fetched", "failed", "bytes_fetched")
            } | {"attempts": manifest.counters.get("attempts", 0)}
        index = pq.read_table(out.path / "index", schema=INDEX_SCHEMA)
        check_index(index, out.path)
        counters["per_shard"] = per_shard
        if hosts := refused_hosts(index):
            counters["refused_hosts"] = hosts
        check_not_empty(config, output.snapshot, counters)
        log.info("merged %d shard(s): %s", num_shards, crawl_summary(counters, config.crawl.max_pages))
        return out.commit(
            rows={"index": counters["requests"], "pages": counters["fetched"]},
            counters=counters,
            extra={"shards": list(per_shard)},
        )


def run(config: PipelineConfig, inputs: list[DatasetRef], output: DatasetRef) -> Manifest:
    """The whole crawl of a snapshot: one shard straight into ``output``, or every shard then the merge.

    With several shards, a rerun after a failure keeps the shards already published and crawls the
    rest; a rerun of a snapshot that was published crawls every shard again and replaces it.
    """
    num_shards = config.crawl.num_shards
    if num_shards == 1:
        return crawl_shard(config, output, 0, 1)
    fresh = output.is_complete()
    for shard in range(num_shards):
        ref = shard_ref(config, output.snapshot, shard)
        if ref.is_complete() and not fresh:
            log.info("shard %d of %d is already published; keeping it", shard, num_shards)
            continue
        crawl_shard(config, ref, shard, num_shards)
    return merge_shards(config, output)
