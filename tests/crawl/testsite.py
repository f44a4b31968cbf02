"""A generated website on 127.0.0.1 with every case a crawler must survive, counting hits per path.

Used by the crawl tests and ``benchmarks/crawl.py`` only, so it lives with the tests rather than in the installed
package (the demo crawls ``pipeline/crawl/sample_site``). ``TestSite.EXPECTED`` says what the crawler should
record for each bad-input path (the index's ``failure_reason``); pages under ``/page/`` are plain
articles whose links form a random (seeded) graph, all reachable from ``/index.html``.

    with TestSite(pages=30) as site:
        crawl(site.url("/index.html"))
        assert site.hits["/private/secret.html"] == 0
"""

from __future__ import annotations

import functools
import gzip
import html
import random
import threading
import time
import zlib
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

WORDS = [
    "river",
    "mill",
    "stone",
    "water",
    "wheel",
    "flour",
    "bread",
    "market",
    "bridge",
    "road",
    "town",
    "valley",
    "garden",
    "harvest",
    "winter",
    "summer",
    "island",
    "harbour",
    "lantern",
    "window",
    "library",
    "letter",
    "journey",
    "mountain",
    "forest",
    "meadow",
    "orchard",
    "timber",
    "copper",
    "silver",
    "weaver",
    "potter",
    "baker",
    "candle",
    "festival",
    "season",
    "morning",
    "evening",
    "quiet",
    "bright",
]

PNG_BYTES = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8
BOMB_DECODED_MIB = 64


@functools.cache
def bomb(encoding: str) -> bytes:
    """A page body that decodes to BOMB_DECODED_MIB MiB of spaces, compressed piece by piece."""
    piece = b" " * (1 << 20)
    if encoding == "br":
        import brotli

        compressor = brotli.Compressor(quality=5)
        return b"".join(compressor.process(piece) for _ in range(BOMB_DECODED_MIB)) + compressor.finish()
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    return b"".join(compressor.compress(piece) for _ in range(BOMB_DECODED_MIB)) + compressor.flush()


class TestSite:
    """Serve the generated site in a background thread; ``hits`` counts requests per path."""

    __test__ = False  # not a pytest test class

    # path -> the failure_reason the crawler must record for it (None: stored without a reason)
    EXPECTED: ClassVar[dict[str, str | None]] = {
        "/private/secret.html": "robots_disallowed",
        "/no-bots/page.html": "robots_disallowed",
        "/missing.html": "http_404",
        "/error500.html": "http_500",
        "/slow.html": "timeout",
        "/binary.html": "binary_content",
        "/report": "content_type_not_allowed",
        "/huge.html": "too_large",
        "/huge-stream.html": "too_large",
        # Small on the wire, 64 MiB decoded: Scrapy caps decoding at DOWNLOAD_MAXSIZE (crawl.download_maxsize)
        "/bomb-gzip.html": "too_large",
        "/bomb-deflate.html": "too_large",
        "/bomb-br.html": "too_large",
        "/loop-a": "redirect_loop",
        "/self-redirect": "redirect_loop",
        "/to-metadata": "redirect_off_site",  # another site; same-site ones are refused for the address
        "/to-internal": "redirect_off_site",
        "/off-site": "redirect_off_site",
        "/malformed.html": None,
        "/charset/latin1-declared-utf8.html": None,
        "/charset/utf8-declared-latin1.html": None,
        "/gzip.html": None,
        "/empty.html": None,
        "/flaky503.html": None,
        "/throttled.html": None,
        "/nofollow.html": None,
    }
    NEVER_FETCHED = ("/private/secret.html", "/no-bots/page.html", "/hidden-by-nofollow.html")

    def __init__(
        self,
        pages: int = 30,
        links_per_page: int = 4,
        page_bytes: int = 3000,
        seed: int = 0,
        bad_cases: bool = True,
        slow_s: float = 3.0,
        big_bytes: int = 300_000,
        gate_after: int | None = None,
        host: str = "127.0.0.1",
        internal_url: str = "http://10.0.0.1/admin",
        crawl_delay: float | None = None,
    ) -> None:
        self.pages = pages
        self.links_per_page = links_per_page
        self.page_bytes = page_bytes
        self.seed = seed
        self.bad_cases = bad_cases
        self.slow_s = slow_s
        self.big_bytes = big_bytes
        self.gate_after = gate_after
        self.host = host
        self.internal_url = internal_url  # where /to-internal redirects
        self.crawl_delay = crawl_delay  # robots.txt's Crawl-delay for our user agent
        self.page_request_times: list[float] = []  # time.monotonic() as each /page/ request arrives
        self.hits: Counter[str] = Counter()
        self.hits_by_host: Counter[str] = Counter()  # the Host header: which name the crawler connected for
        self.in_flight = 0
        self.max_in_flight = 0  # most requests served at once: what per-site concurrency limits
        self.bytes_sent = 0
        self.gate = threading.Event()
        self._lock = threading.Lock()
        self._page_cache: dict[int, bytes] = {}
        self.server: ThreadingHTTPServer | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> TestSite:
        site = self

        class Handler(_Handler):
            pass

        Handler.site = site
        self.server = _Server((self.host, 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="test-site", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.gate.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.thread.join(timeout=5)
            self.server = None

    def __enter__(self) -> TestSite:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self.server is not None, "start() the site first"
        return self.server.server_address[1]

    def url(self, path: str = "/", host: str | None = None) -> str:
        return f"http://{host or self.host}:{self.port}{path}"

    def release(self) -> None:
        """Let requests held by ``gate_after`` through."""
        self.gate.set()

    def hold_after(self, page_hits: int) -> None:
        """Hold every /page/ request once the site has served ``page_hits`` of them, until release()."""
        with self._lock:
            self.gate_after = page_hits
            self.gate.clear()

    def page_hits(self) -> int:
        with self._lock:
            return sum(count for name, count in self.hits.items() if name.startswith("/page/"))

    # -- content -----------------------------------------------------------------------------------

    def page_paths(self) -> list[str]:
        return [f"/page/{i}.html" for i in range(self.pages)]

    def links_of(self, number: int) -> list[str]:
        rng = random.Random(self.seed * 1_000_003 + number)
        targets = rng.sample(range(self.pages), min(self.links_per_page, self.pages))
        links = [f"/page/{target}.html" for target in targets]
        if self.bad_cases and number % 5 == 0:  # the same pages under other spellings: one fetch each
            links += [f"/page/{targets[0]}.html#section", f"/page/{targets[0]}.html?utm_source=feed"]
        return links

    def page(self, number: int) -> bytes:
        if number not in self._page_cache:
            rng = random.Random(self.seed * 7919 + number)
            words, size = [], 0
            while size < self.page_bytes:
                sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 16))).capitalize() + "."
                words.append(f"<p>{html.escape(sentence)}</p>")
                size += len(sentence) + 7
            links = "".join(f'<li><a href="{href}">link</a></li>' for href in self.links_of(number))
            self._page_cache[number] = (
                f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Page {number}</title></head>"
                f"<body><main><article><h1>Page {number}</h1>{''.join(words)}</article></main>"
                f"<nav><ul>{links}</ul></nav></body></html>"
            ).encode()
        return self._page_cache[number]

    def index(self) -> bytes:
        links = [*self.page_paths()]
        if self.bad_cases:
            links += [path for path in self.EXPECTED] + ["/moved"]
        items = "".join(f'<li><a href="{html.escape(href)}">{html.escape(href)}</a></li>' for href in links)
        return f"<!DOCTYPE html><html><head><title>Test site</title></head><body><ul>{items}</ul></body></html>".encode()

    def sitemap_urls(self) -> list[str]:
        """Every URL the sitemaps list: the articles, the orphans (linked from nowhere) and a disallowed one."""
        return [
            *(self.url(path) for path in self.page_paths()),
            *(self.url(f"/orphan/{i}.html") for i in range(3)),
            self.url("/private/secret.html"),
        ]


def _urlset(urls: list[str]) -> bytes:
    locs = "".join(f"<url><loc>{html.escape(url)}</loc></url>" for url in urls)
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>'
        f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{locs}</urlset>'
    ).encode()


class _Handler(BaseHTTPRequestHandler):
    site: TestSite
    protocol_version = "HTTP/1.1"  # keep-alive, like real servers
    # Headers and body go out in two writes; with Nagle's algorithm and the client's delayed ACKs the
    # second waits ~40 ms, which would make the server, not the crawler, the thing measured.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args) -> None:
        pass

    def _send(
        self, status: int, body: bytes = b"", content_type: str = "text/html; charset=utf-8", **headers
    ) -> None:
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)
        with self.site._lock:
            self.site.bytes_sent += len(body)

    def _redirect(self, location: str, status: int = 302) -> None:
        self._send(status, b"", content_type="text/html", Location=location)

    def do_GET(self) -> None:
        site = self.site
        path = self.path.split("?", 1)[0]
        with site._lock:
            site.hits[path] += 1
            if path.startswith("/page/"):
                site.page_request_times.append(time.monotonic())
            site.hits_by_host[(self.headers.get("Host") or "").rsplit(":", 1)[0]] += 1
            hits = site.hits[path]
            page_hits = sum(count for name, count in site.hits.items() if name.startswith("/page/"))
            # /slow.html keeps sleeping after the crawler gave up on it: not a request the crawler has open
            counted = path != "/slow.html"
            site.in_flight += counted
            site.max_in_flight = max(site.max_in_flight, site.in_flight)
        try:
            if path.startswith("/page/"):
                if site.gate_after is not None and page_hits > site.gate_after:
                    site.gate.wait(timeout=120)
                try:
                    number = int(path[len("/page/") : -len(".html")])
                except ValueError:
                    number = -1
                if 0 <= number < site.pages and path.endswith(".html"):
                    return self._send(200, site.page(number))
                return self._send(404, b"<html><body>No such page</body></html>")
            if path in ("/", "/index.html"):
                return self._send(200, site.index())
            if path == "/robots.txt":
                delay = f"Crawl-delay: {site.crawl_delay}\n" if site.crawl_delay is not None else ""
                body = (
                    "User-agent: *\nDisallow: /private/\n\n"
                    f"User-agent: pretrain-pipeline\nDisallow: /private/\nDisallow: /no-bots/\n{delay}\n"
                    f"Sitemap: {site.url('/sitemap.xml')}\n"
                ).encode()
                return self._send(200, body, "text/plain")
            if not site.bad_cases:
                return self._send(404, b"<html><body>Not found</body></html>")
            return self._bad_case(path, hits)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the crawler gave up on us (timeouts, stopped downloads): that is the point
        finally:
            with site._lock:
                site.in_flight -= counted

    def _bad_case(self, path: str, hits: int) -> None:
        site = self.site
        if path == "/sitemap.xml":
            body = (
                '<?xml version="1.0" encoding="UTF-8"?>'
                '<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                f"<sitemap><loc>{site.url('/sitemap-pages.xml')}</loc></sitemap>"
                f"<sitemap><loc>{site.url('/sitemap-more.xml.gz')}</loc></sitemap>"
                f"<sitemap><loc>{site.url('/sitemap-broken.xml')}</loc></sitemap>"
                "</sitemapindex>"
            ).encode()
            return self._send(200, body, "application/xml")
        urls = site.sitemap_urls()
        if path == "/sitemap-pages.xml":
            return self._send(200, _urlset(urls[: len(urls) // 2]), "application/xml")
        if path == "/sitemap-more.xml.gz":
            return self._send(200, gzip.compress(_urlset(urls[len(urls) // 2 :])), "application/x-gzip")
        if path == "/sitemap-broken.xml":
            return self._send(200, b"<?xml version='1.0'?><not-a-sitemap><x>", "application/xml")
        if path.startswith("/orphan/"):
            return self._send(200, site.page(0).replace(b"Page 0", path.encode()))
        if path in (
            "/private/secret.html",
            "/no-bots/page.html",
            "/hidden-by-nofollow.html",
            "/moved-target.html",
        ):
            return self._send(200, site.page(1).replace(b"Page 1", path.encode()))
        if path == "/malformed.html":
            body = (
                b"<html><head><title>Broken<title></head><body><div><p>Unclosed <b>bold <i>italic"
                b"<table><tr><td>cell<a href='/page/2.html'>two</a><td><a href=\"/page/3.html>three</a>"
                b"<p>Text after a stray < sign & an unescaped ampersand <![CDATA[ odd ]]>"
                b"<a href='/page/1.html'>one</a></div></div></span><!-- never closed comment"
            )
            return self._send(200, body)
        if path == "/charset/latin1-declared-utf8.html":  # bytes are cp1252, the header says utf-8
            text = "<html><body><p>Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e, na\u00efve fa\u00e7ade \u2013 d\u00e9j\u00e0 vu.</p></body></html>"
            return self._send(200, text.encode("cp1252"), "text/html; charset=utf-8")
        if path == "/charset/utf8-declared-latin1.html":  # bytes are utf-8, the header says latin-1
            text = "<html><body><p>\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440, caf\u00e9 na\u00efve.</p></body></html>"
            return self._send(200, text.encode("utf-8"), "text/html; charset=iso-8859-1")
        if path == "/binary.html":
            return self._send(200, PNG_BYTES, "text/html")
        if path == "/report":
            return self._send(200, b"%PDF-1.4\n" + b"0" * 5000, "application/pdf")
        if path == "/gzip.html":
            body = gzip.compress(site.page(2).replace(b"Page 2", b"Gzipped page"))
            return self._send(200, body, "text/html; charset=utf-8", Content_Encoding="gzip")
        if path.startswith("/bomb-"):
            encoding = path.removeprefix("/bomb-").removesuffix(".html")
            return self._send(200, bomb(encoding), "text/html; charset=utf-8", Content_Encoding=encoding)
        if path == "/empty.html":
            return self._send(200, b"")
        if path == "/error500.html":
            return self._send(500, b"<html><body>Internal error</body></html>")
        if path == "/flaky503.html":
            if hits == 1:
                return self._send(503, b"<html><body>Busy</body></html>")
            return self._send(200, site.page(3).replace(b"Page 3", b"Flaky page"))
        if path == "/throttled.html":
            if hits == 1:
                return self._send(429, b"<html><body>Slow down</body></html>", Retry_After="1")
            return self._send(200, site.page(4).replace(b"Page 4", b"Throttled page"))
        if path == "/slow.html":
            time.sleep(site.slow_s)
            return self._send(200, b"<html><body>Too late</body></html>")
        if path == "/loop-a":
            return self._redirect("/loop-b")
        if path == "/loop-b":
            return self._redirect("/loop-a")
        if path == "/self-redirect":
            return self._redirect("/self-redirect", 301)
        if path == "/moved":
            return self._redirect("/moved-target.html", 301)
        if path == "/to-metadata":
            return self._redirect("http://169.254.169.254/latest/meta-data/")
        if path == "/to-internal":
            return self._redirect(site.internal_url)
        if path == "/off-site":
            return self._redirect("http://elsewhere.example.net/")
        if path == "/huge.html":
            return self._send(200, b"<html><body>" + b"x" * site.big_bytes + b"</body></html>")
        if path == "/huge-stream.html":
            # No Content-Length: the size is only known while reading, and the body ends when we close.
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            chunk = b"y" * 16384
            for _ in range(site.big_bytes // len(chunk) + 2):
                self.wfile.write(chunk)
            return None
        if path == "/nofollow.html":
            body = (
                b"<html><head><meta name='robots' content='noindex, nofollow'></head><body>"
                b"<p>Do not follow my links.</p><a href='/hidden-by-nofollow.html'>hidden</a></body></html>"
            )
            return self._send(200, body)
        return self._send(404, b"<html><body>Not found</body></html>")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # socketserver's default of 5 drops SYNs when a crawler opens many connections

    def handle_error(self, request, client_address) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):  # a killed crawler resets its connections
            super().handle_error(request, client_address)
