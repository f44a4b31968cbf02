"""Scrapy components of the crawler: refusals with a reason, polite retries, guarded DNS, size/type limits.

Every request the crawler gives up on ends in its errback with one of these exceptions (or a Scrapy
download error), which :func:`pipeline.crawl.spiders.failure_reason` turns into the index's reason.
"""

from __future__ import annotations

import email.utils
import ipaddress
import logging
import random
import time
from datetime import UTC

from scrapy import signals
from scrapy.downloadermiddlewares.redirect import MetaRefreshMiddleware, RedirectMiddleware
from scrapy.downloadermiddlewares.retry import RetryMiddleware
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
from scrapy.exceptions import IgnoreRequest, StopDownload
from scrapy.extensions.throttle import AutoThrottle
from scrapy.resolver import CachingThreadedResolver
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet import defer
from twisted.internet.error import DNSLookupError
from twisted.internet.task import deferLater

from pipeline.crawl.safety import REFUSED_REASON, AddressPolicy
from pipeline.documents.urls import InvalidURL, canonical_url

log = logging.getLogger(__name__)

DEFAULT_PORTS = {"http": 80, "https": 443}
# Host names the resolver refused at connection time, so a DNS-shaped failure can be told apart.
REFUSED_HOSTS: dict[str, str] = {}


class CrawlRefusal(IgnoreRequest):
    """The crawler decided not to fetch (or not to keep) a request; ``reason`` goes to the index."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class AddressRefused(DNSLookupError):
    """Raised inside the resolver: Twisted then fails the connection as a lookup failure."""


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _policy(settings) -> AddressPolicy:
    return AddressPolicy(
        list(settings.getlist("CRAWL_ALLOWED_PRIVATE_HOSTS")),
        allow_wide=settings.getbool("CRAWL_ALLOW_WIDE_PRIVATE_NETWORKS"),
    )


class GuardedResolver(CachingThreadedResolver):
    """Scrapy's caching resolver, refusing private addresses at the moment a connection is made.

    Twisted resolves every host it connects to through this resolver, IP literals included, so a name
    that passed the request-time check and then re-resolves elsewhere (DNS rebinding) is still refused.
    """

    def __init__(
        self,
        reactor,
        cache_size: int,
        timeout: float,
        policy: AddressPolicy,
        pinned: dict[str, str] | None = None,
    ) -> None:
        super().__init__(reactor, cache_size, timeout)
        self.policy = policy
        self.pinned = {name.lower(): address for name, address in (pinned or {}).items()}

    @classmethod
    def from_crawler(cls, crawler, reactor):
        settings = crawler.settings
        cache_size = settings.getint("DNSCACHE_SIZE") if settings.getbool("DNSCACHE_ENABLED") else 0
        return cls(
            reactor,
            cache_size,
            settings.getfloat("DNS_TIMEOUT"),
            _policy(settings),
            settings.getdict("CRAWL_HOST_ADDRESSES"),
        )

    def check(self, name: str, address: str, port: int | None = None) -> str:
        category = self.policy.refusal(name, address, port)
        if category is not None:
            REFUSED_HOSTS[name] = f"{address} ({category})"
            raise AddressRefused(f"{name} resolves to {address}, a {category} address")
        return address

    def getHostByName(self, name: str, timeout=()):
        pinned = self.pinned.get(name.lower())
        resolved = defer.succeed(pinned) if pinned else super().getHostByName(name, timeout)
        return resolved.addCallback(lambda address: self.check(name, address))


class AddressGuardMiddleware:
    """Refuses a request whose host resolves to a non-public address, before anything is sent.

    Runs first in the downloader chain, so it sees seeds, links, redirect targets and robots.txt fetches.
    """

    def __init__(self, crawler) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler)

    async def process_request(self, request, spider=None) -> None:
        from twisted.internet import reactor

        url = urlparse_cached(request)
        host = url.hostname
        if not host:
            return
        # The allow-list's ports are checked here, where the port is known (the resolver sees names only).
        port = url.port or DEFAULT_PORTS.get(url.scheme)
        try:
            if is_ip_literal(host):  # checked as written: a resolver may not take IPv6 literals
                reactor.resolver.check(host, host, port)
            else:
                address = await maybe_deferred_to_future(reactor.resolver.getHostByName(host))
                reactor.resolver.check(host, address, port)
        except AddressRefused as exc:
            self.crawler.stats.inc_value("crawl/refused_private_address")
            raise CrawlRefusal(REFUSED_REASON, exc.args[0] if exc.args else str(exc)) from None
        except DNSLookupError as exc:
            # Fail closed: an address we could not check is never handed to the downloader.
            raise CrawlRefusal("dns_error", f"{host}: {exc}") from None


class RobotsPolicyMiddleware(RobotsTxtMiddleware):
    """Scrapy's robots.txt handling, plus RFC 9309's rule that a 5xx/429 robots.txt means "disallow all",
    plus ``Crawl-delay``: it becomes the floor of that site's download delay (capped at CRAWL_MAX_CRAWL_DELAY).

    Disallowed requests fail with the reason ``robots_disallowed`` (Scrapy raises a bare IgnoreRequest).
    """

    _DISALLOW_ALL = b"User-agent: *\nDisallow: /\n"

    def __init__(self, crawler) -> None:
        super().__init__(crawler)
        self._unavailable: dict[str, int] = {}  # netloc -> the status its robots.txt answered
        self.max_crawl_delay = crawler.settings.getfloat("CRAWL_MAX_CRAWL_DELAY", 30.0)

    def process_request_2(self, rp, request) -> None:
        netloc = urlparse_cached(request).netloc
        if netloc in self._unavailable:
            raise CrawlRefusal(
                "robots_unavailable", f"robots.txt of {netloc} answered {self._unavailable[netloc]}"
            )
        try:
            super().process_request_2(rp, request)
        except IgnoreRequest:
            raise CrawlRefusal("robots_disallowed", request.url) from None

    async def _parse_robots(self, response, netloc, request) -> None:
        if response.status >= 500 or response.status == 429:
            self._unavailable[netloc] = response.status
            response = response.replace(body=self._DISALLOW_ALL)
        elif response.status >= 400:  # no robots.txt: everything is allowed
            response = response.replace(body=b"")
        await super()._parse_robots(response, netloc, request)
        self._apply_crawl_delay(netloc, request)

    def _apply_crawl_delay(self, netloc: str, request) -> None:
        crawl_delay = getattr(self._parsers.get(netloc), "crawl_delay", None)
        useragent = self._robotstxt_useragent or request.headers.get(b"User-Agent", self._default_useragent)
        delay = crawl_delay(useragent) if crawl_delay is not None else None
        if not delay or delay <= 0:
            return
        if delay > self.max_crawl_delay:
            log.warning(
                "robots.txt of %s asks for Crawl-delay %g s; keeping to CRAWL_MAX_CRAWL_DELAY (%g s)",
                netloc,
                delay,
                self.max_crawl_delay,
            )
            self._stats.inc_value("robotstxt/crawl_delay_capped")
            delay = self.max_crawl_delay
        set_delay_floor(self.crawler.engine.downloader, request, delay)
        self._stats.inc_value("robotstxt/crawl_delay_honoured")
        log.info("robots.txt of %s: Crawl-delay %g s", netloc, delay)


def set_delay_floor(downloader, request, delay: float) -> None:
    """The least delay between requests of ``request``'s download slot, for its slot now and if recreated.

    Without jitter: Scrapy's default varies each delay by +-50%, which would undercut the floor.
    """
    key = downloader.get_slot_key(request)
    slot_settings = downloader.per_slot_settings.setdefault(key, {})
    slot_settings["delay"] = max(slot_settings.get("delay", 0.0), delay)
    slot_settings["jitter"] = 0.0
    slot = downloader.slots.get(key)
    if slot is not None:
        slot.delay, slot.jitter = max(slot.delay, delay), 0.0


def delay_floor(downloader, slot_key: str | None) -> float:
    return downloader.per_slot_settings.get(slot_key, {}).get("delay", 0.0) if slot_key else 0.0


class PoliteAutoThrottle(AutoThrottle):
    """AutoThrottle that never goes below a site's Crawl-delay (Scrapy's lowers it to DOWNLOAD_DELAY)."""

    def _response_downloaded(self, response, request, spider) -> None:
        super()._response_downloaded(response, request, spider)
        key, slot = self._get_slot(request, spider)
        if slot is not None:
            slot.delay = max(slot.delay, delay_floor(self.crawler.engine.downloader, key))


def retry_after_seconds(value: bytes | str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), None when absent or unreadable."""
    if not value:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


class BackoffRetryMiddleware(RetryMiddleware):
    """Scrapy's retries on 429/5xx/timeouts, each waiting exponentially longer (or as Retry-After says)."""

    def __init__(self, settings) -> None:
        super().__init__(settings)
        self.base = settings.getfloat("CRAWL_RETRY_BACKOFF")
        self.cap = settings.getfloat("CRAWL_RETRY_BACKOFF_MAX")
        self.random = random.Random(settings.getint("CRAWL_SEED"))

    def backoff(self, retry_times: int, retry_after: float | None = None) -> float:
        delay = self.base * 2 ** (retry_times - 1) * (1 + 0.25 * self.random.random())  # jitter de-syncs
        if retry_after is not None:
            delay = max(delay, retry_after)
        return min(delay, self.cap)

    def _schedule(self, result, response=None):
        if hasattr(result, "meta") and result.meta.get("retry_times"):
            retry_after = (
                retry_after_seconds(response.headers.get(b"Retry-After")) if response is not None else None
            )
            delay = self.backoff(result.meta["retry_times"], retry_after)
            result.meta["backoff_until"] = time.monotonic() + delay
            self.crawler.stats.inc_value("crawl/backoff_seconds", delay)
        return result

    def process_response(self, request, response, spider=None):
        return self._schedule(super().process_response(request, response), response)

    def process_exception(self, request, exception, spider=None):
        return self._schedule(super().process_exception(request, exception))

    async def process_request(self, request, spider=None) -> None:
        wait = request.meta.get("backoff_until", 0) - time.monotonic()
        if wait > 0:
            from twisted.internet import reactor

            await maybe_deferred_to_future(deferLater(reactor, wait, lambda: None))


class _FrontierRedirectMixin:
    """Follows a redirect only within the crawl's sites, never in a loop, never to a URL already queued."""

    def _redirect(self, redirected, request, reason):
        if "frontier_key" not in request.meta:  # robots.txt fetches: Scrapy's own rules
            return super()._redirect(redirected, request, reason)
        if request.meta.get("redirect_times", 0) + 1 > self.max_redirect_times:
            raise CrawlRefusal("too_many_redirects", request.url)
        chain = [*request.meta.get("redirect_urls", []), request.url]
        try:
            target = canonical_url(redirected.url)
            loop = target in {canonical_url(url) for url in chain}
        except InvalidURL as exc:
            raise CrawlRefusal(f"redirect_{exc.reason}", redirected.url) from None
        if loop:
            raise CrawlRefusal("redirect_loop", " -> ".join([*chain, redirected.url]))
        refusal = self.crawler.spider.session.frontier.claim_redirect(redirected.url)
        if refusal is not None:
            raise CrawlRefusal(refusal, f"{request.url} -> {redirected.url}")
        return super()._redirect(redirected, request, reason)


class FrontierRedirectMiddleware(_FrontierRedirectMixin, RedirectMiddleware):
    pass


class FrontierMetaRefreshMiddleware(_FrontierRedirectMixin, MetaRefreshMiddleware):
    pass


def media_type(content_type: bytes | str | None) -> str | None:
    if not content_type:
        return None
    text = content_type.decode("latin-1") if isinstance(content_type, bytes) else content_type
    return text.split(";", 1)[0].strip().lower() or None


class ResponseLimits:
    """Stops a page download as soon as its headers or byte count break the limits, with a reason.

    Stopping at the headers means a PDF or a video linked from a page costs one round trip, not a download.
    """

    def __init__(self, crawler) -> None:
        self.allowed = set(crawler.settings.getlist("CRAWL_ALLOWED_CONTENT_TYPES"))
        self.maxsize = crawler.settings.getint("DOWNLOAD_MAXSIZE")
        crawler.signals.connect(self.headers_received, signal=signals.headers_received)
        crawler.signals.connect(self.bytes_received, signal=signals.bytes_received)

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler)

    def _stop(self, request, reason: str, detail: str) -> None:
        request.meta["stop_reason"] = reason
        request.meta["stop_detail"] = detail
        raise StopDownload(fail=True)

    def headers_received(self, headers, body_length, request, spider=None) -> None:
        if request.meta.get("kind") != "page":
            return
        kind = media_type(headers.get(b"Content-Type"))
        if kind is not None and kind not in self.allowed and b"Location" not in headers:
            self._stop(request, "content_type_not_allowed", kind)
        if self.maxsize and isinstance(body_length, int) and body_length > self.maxsize:
            self._stop(request, "too_large", f"Content-Length {body_length} > {self.maxsize}")

    def bytes_received(self, data, request, spider=None) -> None:
        received = request.meta.get("bytes_received", 0) + len(data)
        request.meta["bytes_received"] = received
        if self.maxsize and received > self.maxsize:
            self._stop(request, "too_large", f"more than {self.maxsize} bytes")


class ProgressLog:
    """One line every few seconds: pages stored, failures, queue; long crawls show they are alive."""

    def __init__(self, crawler) -> None:
        from twisted.internet import task

        self.crawler = crawler
        self.interval = crawler.settings.getfloat("CRAWL_PROGRESS_INTERVAL")
        self.loop = task.LoopingCall(self.report)
        self.started = time.monotonic()
        crawler.signals.connect(self.opened, signal=signals.spider_opened)
        crawler.signals.connect(self.closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler)

    def opened(self, spider) -> None:
        if self.interval > 0:
            self.loop.start(self.interval, now=False)

    def report(self) -> None:
        session = self.crawler.spider.session
        elapsed = max(time.monotonic() - self.started, 1e-9)
        log.info(
            "progress: %d pages stored, %d failed, %d queued in total, %.1f pages/s",
            session.stored,
            session.failed,
            session.frontier.pages,
            session.stored / elapsed,
        )

    def closed(self, spider, reason) -> None:
        if self.loop.running:
            self.loop.stop()
        self.report()
