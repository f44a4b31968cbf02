"""The two spiders: follow same-site links from seeds, or fetch what sitemaps list.

Both queue URLs only through the shard's Frontier (canonical de-duplication, same registered domain,
depth and page limits, journaled) and hand every outcome, page or failure, to the WARC/journal pipeline
as an item, so each queued URL ends as exactly one index row.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import scrapy
from scrapy.exceptions import (
    CannotResolveHostError,
    DownloadCancelledError,
    DownloadConnectionRefusedError,
    DownloadFailedError,
    DownloadTimeoutError,
    IgnoreRequest,
    ResponseDataLossError,
    StopDownload,
)
from scrapy.http import Response, TextResponse
from scrapy.linkextractors import IGNORED_EXTENSIONS, LinkExtractor
from scrapy.spiders import SitemapSpider
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.url import url_has_any_extension
from twisted.internet.error import TimeoutError as TxTimeoutError
from twisted.python.failure import Failure

from pipeline.crawl.journal import Entry
from pipeline.crawl.middlewares import REFUSED_HOSTS, CrawlRefusal
from pipeline.crawl.safety import REFUSED_REASON
from pipeline.documents.content import looks_binary

if TYPE_CHECKING:
    from pipeline.crawl.crawler import CrawlSession

_DENIED_EXTENSIONS = [f".{ext}" for ext in IGNORED_EXTENSIONS]


def failure_reason(exc: BaseException, request: scrapy.Request | None = None) -> str:
    """A short, countable reason for a request that produced no usable response."""
    if isinstance(exc, CrawlRefusal):
        return exc.reason
    if isinstance(exc, StopDownload):
        return (request.meta.get("stop_reason") if request is not None else None) or "download_stopped"
    if isinstance(exc, DownloadTimeoutError | TxTimeoutError):
        return "timeout"
    if isinstance(exc, CannotResolveHostError):
        host = urlparse_cached(request).hostname if request is not None else None
        return REFUSED_REASON if host in REFUSED_HOSTS else "dns_error"
    if isinstance(exc, DownloadConnectionRefusedError):
        return "connection_refused"
    if isinstance(exc, ResponseDataLossError):
        return "data_loss"
    if (
        isinstance(exc, DownloadCancelledError | IgnoreRequest)
        and "max" in str(exc).lower()
        and "size" in str(exc).lower()
    ):
        return "too_large"  # Scrapy's own DOWNLOAD_MAXSIZE checks, e.g. after decompression
    if isinstance(exc, DownloadCancelledError):
        return "download_cancelled"
    if isinstance(exc, DownloadFailedError):
        return "download_failed"
    if isinstance(exc, IgnoreRequest):
        return "ignored"
    return f"error_{type(exc).__name__}"


class FrontierSpiderMixin:
    """What both spiders share: requests from frontier entries, page items, failure items. Mixed into Scrapy
    spiders, which give it ``logger`` (and the sitemap spider ``parse_sitemap``)."""

    session: CrawlSession
    logger: Any
    follow_links: bool
    parse_sitemap: Callable[..., Any]
    link_extractor = LinkExtractor(tags=("a", "area"), attrs=("href",), deny_extensions=(), unique=True)

    def request_for(self, entry: Entry) -> scrapy.Request:
        callback = self.parse_page if entry.kind == "page" else self.parse_sitemap
        return scrapy.Request(
            entry.url,
            callback=callback,
            errback=self.on_error,
            dont_filter=True,  # the frontier already de-duplicated it, by canonical URL
            priority=-entry.depth,  # breadth first: shallow pages before the page limit cuts off
            meta={
                "frontier_key": entry.key,
                "frontier_url": entry.url,
                "depth": entry.depth,
                "kind": entry.kind,
            },
        )

    def resumed_requests(self) -> list[scrapy.Request] | None:
        """Requests a killed earlier attempt queued but never finished; None on a fresh start."""
        state = self.session.state
        if not state.entries:
            return None
        pending = state.pending()
        self.logger.info("resuming: %d URLs done, %d still to fetch", len(state.done), len(pending))
        return [self.request_for(entry) for entry in pending]

    def start_requests_from(self, urls: list[str], kind: str) -> list[scrapy.Request]:
        requests = []
        for url in urls:
            entry, why = self.session.frontier.admit(url, depth=0, kind=kind)
            if entry is None:
                self.logger.warning("seed %s skipped: %s", url, why)
            else:
                requests.append(self.request_for(entry))
        return requests

    def parse_page(self, response: Response):
        reason, links = self.inspect(response)
        entries = []
        link_counts: dict[str, int] | None = None
        if links is not None:
            stats: Counter[str] = Counter()
            depth = response.meta["depth"] + 1
            for url in links:
                entry, why = self.admit_link(url, depth)
                stats[why] += 1
                if entry is not None:
                    entries.append(entry)
            link_counts = dict(stats)
        # The item (WARC + journal line) first: its flush makes the queued links durable with it.
        yield {"kind": "page", "response": response, "failure_reason": reason, "links": link_counts}
        for entry in entries:
            yield self.request_for(entry)

    def admit_link(self, url: str, depth: int):
        return self.session.frontier.admit(url, depth)

    def inspect(self, response: Response) -> tuple[str | None, list[str] | None]:
        """(failure reason or None, links to follow or None) for a downloaded page."""
        if response.status >= 300:
            return f"http_{response.status}", None
        if looks_binary(response.body):
            return "binary_content", None
        if not self.follow_links or not isinstance(response, TextResponse):
            return None, None
        try:
            robots = " ".join(response.xpath("//meta[@name='robots' or @name='ROBOTS']/@content").getall())
            header = (response.headers.get(b"X-Robots-Tag") or b"").decode("latin-1")
            if "nofollow" in f"{robots} {header}".lower():
                return None, []
            links = self.link_extractor.extract_links(response)
        except Exception as exc:  # lxml gives up on a few documents; keep the page, count it
            self.logger.info("no links from %s: %s", response.url, exc)
            return "unparseable_html", None
        urls = []
        for link in links:
            if link.nofollow:
                continue
            if url_has_any_extension(link.url, _DENIED_EXTENSIONS):
                self.session.frontier.skipped["denied_extension"] += 1
                continue
            urls.append(link.url)
        return None, urls

    def on_error(self, failure: Failure):
        request = failure.request  # type: ignore[attr-defined]  # Scrapy sets it on its requests' failures
        reason = failure_reason(failure.value, request)
        partial = getattr(failure.value, "response", None)
        detail = getattr(failure.value, "detail", None)  # a CrawlRefusal's text already names its reason
        if detail is None:
            detail = str(failure.value) or type(failure.value).__name__
        if detail and detail != request.url:
            self.logger.info("%s: %s (%s)", reason, request.url, detail[:300])
        else:
            self.logger.info("%s: %s", reason, request.url)
        yield {
            "kind": request.meta.get("kind", "page"),
            "request": request,
            "failure_reason": reason,
            "partial": partial,
        }


class SeedSpider(FrontierSpiderMixin, scrapy.Spider):
    """Starts from seed URLs and follows links within each seed's registered domain."""

    name = "seed"
    follow_links = True

    def __init__(self, session: CrawlSession, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.session = session

    async def start(self):
        requests = self.resumed_requests()
        for request in (
            requests if requests is not None else self.start_requests_from(self.session.spec.seeds, "page")
        ):
            yield request

    def parse_sitemap(self, response):  # a seed crawl queues no sitemaps
        raise NotImplementedError


class SitemapCrawlSpider(FrontierSpiderMixin, SitemapSpider):
    """Fetches the pages that sitemaps (or the ``Sitemap:`` lines of robots.txt) list, nested indexes too.

    Scrapy's SitemapSpider parses the sitemaps; every URL it yields goes through the frontier, so only
    same-site URLs within the page limit are fetched, once.
    """

    name = "sitemap"
    follow_links = False

    def __init__(self, session: CrawlSession, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.session = session
        self.sitemap_urls = list(session.spec.seeds)

    async def start(self):
        requests = self.resumed_requests()
        for request in (
            requests if requests is not None else self.start_requests_from(self.sitemap_urls, "sitemap")
        ):
            yield request

    def parse(self, response):  # SitemapSpider's rules name this callback; pages go to parse_page
        return self.parse_page(response)

    def parse_sitemap(self, response: Response):
        found: Counter[str] = Counter()
        entries = []
        reason = f"http_{response.status}" if response.status >= 300 else None
        if reason is None:
            outputs = list(self._parse_sitemap(response))
            if not outputs and not response.url.endswith("/robots.txt"):
                reason = "invalid_sitemap"
            depth = response.meta["depth"] + 1
            for request in outputs:
                kind = "sitemap" if request.callback == self._parse_sitemap else "page"
                entry, why = self.session.frontier.admit(request.url, depth, kind=kind, check_depth=False)
                found[why] += 1
                if entry is not None:
                    entries.append(entry)
        yield {"kind": "sitemap", "response": response, "failure_reason": reason, "links": dict(found)}
        for entry in entries:
            yield self.request_for(entry)
