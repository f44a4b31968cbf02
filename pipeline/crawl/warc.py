"""WARC files of one shard: response + request records per fetched page, written with warcio.

Each crawler attempt writes its own files (``warc/<shard>.a<attempt>.<seq>.warc.gz``), rotated past a
size limit, so a resumed crawl never appends after bytes a killed attempt may have torn; the journal
truncates those (pipeline.crawl.journal). Every record is its own gzip member, so a reader can seek to
an index row's offset and read one record.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from http import HTTPStatus
from io import BytesIO
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

# The stored body is the decoded one (Scrapy removes transfer and content encodings), so these headers
# would lie about it. They are kept under X-Crawler-* names, as Common Crawl does.
_REWRITTEN_HEADERS = {"content-encoding", "transfer-encoding", "content-length"}


@dataclass(frozen=True)
class WarcLocation:
    warc_file: str  # relative to the crawl output folder
    offset: int  # of the response record
    length: int  # of the response record
    end: int  # after the request record: where the next record starts


@dataclass
class Exchange:
    """One HTTP request and its response, as the crawler saw them."""

    url: str
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    fetched_at: datetime
    request_method: str = "GET"
    request_headers: list[tuple[str, str]] | None = None
    request_body: bytes = b""
    protocol: str = "HTTP/1.1"
    ip_address: str | None = None


def reason_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


class WarcStore:
    def __init__(
        self, output: Path, prefix: str, attempt: int, max_bytes: int, info: dict[str, str] | None = None
    ) -> None:
        self.output = Path(output)
        self.prefix = prefix
        self.attempt = attempt
        self.max_bytes = max_bytes
        self.info = dict(info or {})
        self.sequence = -1
        self.handle: BinaryIO | None = None
        (self.output / "warc").mkdir(parents=True, exist_ok=True)

    def _open_next(self) -> BinaryIO:
        self.close()
        self.sequence += 1
        name = f"{self.prefix}.a{self.attempt:03d}.{self.sequence:05d}.warc.gz"
        self.relative = f"warc/{name}"
        # "x": a file of this name can only be left by an attempt whose records recovery removed.
        self.handle = open(self.output / self.relative, "xb")  # noqa: SIM115 - closed in close()
        self.writer = WARCWriter(self.handle, gzip=True)
        self.writer.write_record(self.writer.create_warcinfo_record(name, self.info))
        return self.handle

    def write(self, exchange: Exchange) -> WarcLocation:
        handle = self.handle
        if handle is None or handle.tell() >= self.max_bytes:
            handle = self._open_next()
        date = exchange.fetched_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        headers = [
            (name, value) for name, value in exchange.headers if name.lower() not in _REWRITTEN_HEADERS
        ]
        headers += [
            (f"X-Crawler-{name}", value)
            for name, value in exchange.headers
            if name.lower() in _REWRITTEN_HEADERS
        ]
        headers.append(("Content-Length", str(len(exchange.body))))
        http_headers = StatusAndHeaders(
            f"{exchange.status} {reason_phrase(exchange.status)}", headers, protocol=exchange.protocol
        )
        warc_headers = {"WARC-Date": date}
        if exchange.ip_address:
            warc_headers["WARC-IP-Address"] = exchange.ip_address
        response = self.writer.create_warc_record(
            exchange.url,
            "response",
            payload=BytesIO(exchange.body),
            http_headers=http_headers,
            warc_headers_dict=warc_headers,
        )
        offset = handle.tell()
        self.writer.write_record(response)
        length = handle.tell() - offset

        split = urlsplit(exchange.url)
        target = split.path or "/"
        if split.query:
            target += f"?{split.query}"
        request_headers = list(exchange.request_headers or [])
        if not any(name.lower() == "host" for name, _ in request_headers):
            request_headers.insert(0, ("Host", split.netloc))
        request = self.writer.create_warc_record(
            exchange.url,
            "request",
            payload=BytesIO(exchange.request_body),
            http_headers=StatusAndHeaders(
                f"{exchange.request_method} {target} {exchange.protocol}",
                request_headers,
                is_http_request=True,
            ),
            warc_headers_dict={
                "WARC-Date": date,
                "WARC-Concurrent-To": response.rec_headers.get_header("WARC-Record-ID"),
            },
        )
        self.writer.write_record(request)
        # Flushed before the journal line that points here is written (see pipeline.crawl.journal).
        handle.flush()
        return WarcLocation(self.relative, offset, length, handle.tell())

    def close(self) -> None:
        if self.handle is not None and not self.handle.closed:
            self.handle.flush()
            self.handle.close()
