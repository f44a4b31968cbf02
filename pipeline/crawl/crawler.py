"""The Scrapy side of one crawl shard, run in its own process (Twisted's reactor cannot restart).

``python -m pipeline.crawl.crawler JOB/spec.json`` recovers the shard's job folder (journal + WARC),
crawls what is left, and exits 0 only when the spider finished; the parent (pipeline.crawl.stage)
then builds the Parquet index from the journal and publishes the shard.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from pipeline.core.proc import die_with_parent
from pipeline.crawl.frontier import Frontier
from pipeline.crawl.journal import Journal, JournalState, recover
from pipeline.crawl.warc import Exchange, WarcStore
from pipeline.documents.urls import host_of, registered_domain

log = logging.getLogger("pipeline.crawl.crawler")
JOB_DIR = "_job"
SPEC_NAME = "spec.json"
LOCK_NAME = "lock"


@dataclass
class CrawlSpec:
    """Everything the crawler process needs; written by the stage into the shard's job folder."""

    seeds: list[str]
    output: str
    shard: str = "shard-00000-of-00001"
    spider: str = "seed"
    max_pages: int = 200
    max_depth: int = 3
    warc_max_bytes: int = 1 << 30
    settings: dict[str, Any] = field(default_factory=dict)
    parent_pid: int | None = None

    @classmethod
    def read(cls, path: str | Path) -> CrawlSpec:
        return cls(**json.loads(Path(path).read_text()))

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2, sort_keys=True))

    def identity(self) -> dict[str, Any]:
        """What must not change for a killed crawl to be resumed rather than restarted."""
        return {"seeds": sorted(self.seeds), "shard": self.shard, "spider": self.spider}

    @property
    def sites(self) -> set[str]:
        return {registered_domain(seed) for seed in self.seeds}

    @property
    def job_dir(self) -> Path:
        return Path(self.output) / JOB_DIR


class ShardLock:
    """An exclusive flock on the shard's job folder, so two crawlers never write one shard.

    The kernel drops it when its holder dies, however it dies.
    """

    def __init__(self, job_dir: Path) -> None:
        job_dir.mkdir(parents=True, exist_ok=True)
        self.path = job_dir / LOCK_NAME
        self.handle: TextIO | None = None

    def acquire(self, wait_s: float) -> ShardLock:
        self.handle = handle = open(self.path, "a+")  # noqa: SIM115 - closed in release()
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    holder = self.path.read_text().strip() or "unknown"
                    handle.close()
                    raise RuntimeError(
                        f"another crawler (pid {holder}) is still writing {self.path.parent.parent}; "
                        "wait for it or kill it, then rerun"
                    ) from None
                time.sleep(0.2)
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        return self

    def release(self) -> None:
        if self.handle is not None and not self.handle.closed:
            fcntl.flock(self.handle, fcntl.LOCK_UN)
            self.handle.close()

    def __enter__(self) -> ShardLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


@dataclass
class CrawlSession:
    """The shard's state shared by the spider, the middlewares and the pipeline of one crawler process."""

    spec: CrawlSpec
    state: JournalState
    journal: Journal
    warc: WarcStore
    frontier: Frontier
    attempt: int
    stored: int = 0
    failed: int = 0
    fatal: BaseException | None = None

    @classmethod
    def open(cls, spec: CrawlSpec) -> CrawlSession:
        output = Path(spec.output)
        state = recover(spec.job_dir, output)
        attempt = state.attempts + 1
        journal = Journal(spec.job_dir)
        journal.attempt(attempt, pid=os.getpid(), started=datetime.now(UTC).isoformat(timespec="seconds"))
        warc = WarcStore(
            output,
            spec.shard,
            attempt,
            spec.warc_max_bytes,
            info={
                "software": "pretrain-pipeline crawler (Scrapy + warcio)",
                "format": "WARC File Format 1.0",
                "http-header-user-agent": str(spec.settings.get("USER_AGENT", "")),
                "robots": "obey",
                "isPartOf": spec.shard,
            },
        )
        frontier = Frontier(spec.sites, spec.max_pages, spec.max_depth, journal, state)
        return cls(spec, state, journal, warc, frontier, attempt)

    def close(self) -> None:
        self.warc.close()
        self.journal.close()


def _header_pairs(headers) -> list[tuple[str, str]]:
    return [
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, values in headers.items()
        for value in values
    ]


class WarcJournalPipeline:
    """Stores each page response as WARC records, then journals its outcome (one index row per URL)."""

    def __init__(self, crawler) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler)

    @property
    def session(self) -> CrawlSession:
        return self.crawler.spider.session

    def process_item(self, item, spider=None):
        from scrapy.utils.defer import deferred_from_coro

        try:
            self._record(item)
        except Exception as exc:
            # Losing a record silently is worse than stopping: stop, exit non-zero, resume later.
            self.session.fatal = exc
            log.exception("cannot store a crawl record; stopping the crawl")
            deferred_from_coro(self.crawler.engine.close_spider_async(reason="storage_error"))
            raise
        return item

    def _record(self, item: dict[str, Any]) -> None:
        session = self.session
        response = item.get("response")
        request = response.request if response is not None else item["request"]
        meta = request.meta
        now = datetime.now(UTC)
        reason = item.get("failure_reason")
        frontier_url = meta.get("frontier_url", request.url)
        url = response.url if response is not None else request.url
        row = {
            "url": url,
            "original_url": frontier_url if frontier_url != url else None,
            "domain": host_of(url),
            "registered_domain": registered_domain(url),
            "depth": meta.get("depth", 0),
            "status": None,
            "content_type": None,
            "content_length": 0,
            "fetch_time": now.isoformat(),
            "warc_file": None,
            "warc_offset": None,
            "warc_length": None,
            "failure_reason": reason,
            "redirects": len(meta.get("redirect_urls", ())),
            "retries": meta.get("retry_times", 0),
            "ip_address": None,
            "shard": session.spec.shard,
        }
        source = response if response is not None else item.get("partial")
        if source is not None:
            content_type = source.headers.get(b"Content-Type")
            row["content_type"] = content_type.decode("latin-1") if content_type else None
        end = None
        if response is not None and item["kind"] == "page":
            location = session.warc.write(
                Exchange(
                    url=response.url,
                    status=response.status,
                    headers=_header_pairs(response.headers),
                    body=response.body,
                    fetched_at=now,
                    request_method=request.method,
                    request_headers=_header_pairs(request.headers),
                    request_body=request.body or b"",
                    protocol=response.protocol or "HTTP/1.1",
                    ip_address=str(response.ip_address) if response.ip_address else None,
                )
            )
            row.update(
                status=response.status,
                content_length=len(response.body),
                warc_file=location.warc_file,
                warc_offset=location.offset,
                warc_length=location.length,
                ip_address=str(response.ip_address) if response.ip_address else None,
            )
            end = (location.warc_file, location.end)
        elif response is not None:
            row.update(status=response.status, content_length=len(response.body))
        session.journal.done(meta["frontier_key"], item["kind"], row, end, item.get("links"))
        if item["kind"] == "page":
            if end is not None and reason is None:
                session.stored += 1
            elif reason is not None:
                session.failed += 1

    def close_spider(self, spider=None) -> None:
        self.session.close()


def scrapy_settings(spec: CrawlSpec) -> dict[str, Any]:
    """Scrapy settings: the stage's (politeness, limits) on top of what this crawler's design needs."""
    here = "pipeline.crawl.middlewares"
    base = "scrapy.downloadermiddlewares"
    settings = {
        "ROBOTSTXT_OBEY": True,
        "HTTPERROR_ALLOW_ALL": True,  # 404/500 pages reach the spider, are stored and counted
        "TELNETCONSOLE_ENABLED": False,
        "REMOTE_CONTROL_ENABLED": False,  # no listening port on a crawl worker
        "STATS_DUMP": False,  # the stage records the stats in the manifest instead
        "LOG_LEVEL": "INFO",
        "LOGSTATS_INTERVAL": 0,
        "LOG_VERSIONS": [],  # no dependency listing at every start
        "LOG_FORMAT": "%(levelname)s %(name)s: %(message)s",  # the stage's log line stamps the time once
        "TWISTED_DNS_RESOLVER": f"{here}.GuardedResolver",
        # Scrapy 2.19's downloader, under the default asyncio reactor, starts every queued request of a slot
        # at once (the transfer is registered only when the scheduled task first runs), so
        # CONCURRENT_REQUESTS_PER_DOMAIN is not enforced. Under the epoll reactor it is.
        "TWISTED_REACTOR": "twisted.internet.epollreactor.EPollReactor",
        "DUPEFILTER_CLASS": "scrapy.dupefilters.BaseDupeFilter",  # the Frontier de-duplicates
        "DEPTH_LIMIT": 0,  # the Frontier limits depth, and counts what it skips
        "DEPTH_PRIORITY": 0,
        "SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue",
        "URLLENGTH_LIMIT": 0,
        "ITEM_PIPELINES": {"pipeline.crawl.crawler.WarcJournalPipeline": 100},
        "EXTENSIONS": {
            f"{here}.ResponseLimits": 0,
            f"{here}.ProgressLog": 0,
            "scrapy.extensions.throttle.AutoThrottle": None,
            f"{here}.PoliteAutoThrottle": 0,
        },
        "DOWNLOADER_MIDDLEWARES": {
            f"{here}.AddressGuardMiddleware": 40,
            f"{base}.robotstxt.RobotsTxtMiddleware": None,
            f"{here}.RobotsPolicyMiddleware": 100,
            f"{base}.retry.RetryMiddleware": None,
            f"{here}.BackoffRetryMiddleware": 550,
            f"{base}.redirect.MetaRefreshMiddleware": None,
            f"{here}.FrontierMetaRefreshMiddleware": 580,
            f"{base}.redirect.RedirectMiddleware": None,
            f"{here}.FrontierRedirectMiddleware": 600,
        },
        "CRAWL_PROGRESS_INTERVAL": 10.0,
        "CRAWL_MAX_CRAWL_DELAY": 30.0,
        "CRAWL_RETRY_BACKOFF": 1.0,
        "CRAWL_RETRY_BACKOFF_MAX": 60.0,
        "CRAWL_SEED": 0,
        "CRAWL_ALLOWED_CONTENT_TYPES": ["text/html", "application/xhtml+xml"],
        "CRAWL_ALLOWED_PRIVATE_HOSTS": [],
        "CRAWL_HOST_ADDRESSES": {},
    }
    settings.update(spec.settings)
    return settings


def crawl(spec: CrawlSpec) -> int:
    from scrapy.crawler import CrawlerProcess

    from pipeline.crawl.spiders import SeedSpider, SitemapCrawlSpider

    process = CrawlerProcess(settings=scrapy_settings(spec))  # also sets up logging
    for name in ("scrapy.middleware", "scrapy.utils.log", "scrapy.crawler", "scrapy.addons"):
        logging.getLogger(name).setLevel(logging.WARNING)  # start-up listings, not crawl news
    lock = ShardLock(spec.job_dir).acquire(wait_s=30)
    session = CrawlSession.open(spec)
    if session.attempt > 1:
        log.info("attempt %d of shard %s: resuming", session.attempt, spec.shard)
    spider_class = SitemapCrawlSpider if spec.spider == "sitemap" else SeedSpider
    crawler = process.create_crawler(spider_class)
    process.crawl(crawler, session=session)
    process.start()
    session.close()  # idempotent; the pipeline closes it at spider close
    stats = crawler.stats.get_stats()
    finish_reason = stats.get("finish_reason")
    (spec.job_dir / f"stats.a{session.attempt:03d}.json").write_text(
        json.dumps({"finish_reason": finish_reason, "stats": stats}, default=str, sort_keys=True)
    )
    lock.release()
    if session.fatal is not None or finish_reason != "finished":
        log.error("crawl of %s did not finish (%s); rerun to resume it", spec.shard, finish_reason)
        return 3
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(
            "usage: python -m pipeline.crawl.crawler JOB/spec.json  (started by `pretrain crawl`)",
            file=sys.stderr,
        )
        return 2
    spec = CrawlSpec.read(argv[0])
    if spec.parent_pid is not None:
        # SIGKILL this crawler when the stage process that started it dies, so no orphan keeps writing.
        die_with_parent(spec.parent_pid)
    return crawl(spec)


if __name__ == "__main__":
    sys.exit(main())
