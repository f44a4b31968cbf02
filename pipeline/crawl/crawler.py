"""The Scrapy side of the crawl stage, run in its own process (Twisted's reactor cannot restart).

``python -m pipeline.crawl.crawler spec.json`` crawls the spec's seeds, writes WARC records and a
Parquet fetch index into the spec's output folder, and exits.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from io import BytesIO
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
import scrapy
from scrapy.crawler import CrawlerProcess
from scrapy.http import Response
from twisted.python.failure import Failure
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

INDEX_SCHEMA = pa.schema(
    [
        ("url", pa.string()),
        ("domain", pa.string()),
        ("depth", pa.int32()),
        ("status", pa.int32()),
        ("content_type", pa.string()),
        ("content_length", pa.int64()),
        ("fetch_time", pa.timestamp("us", tz="UTC")),
        ("warc_file", pa.string()),
        ("warc_offset", pa.int64()),
        ("warc_length", pa.int64()),
        ("failure_reason", pa.string()),
    ]
)

_DROPPED_HEADERS = {b"content-encoding", b"transfer-encoding", b"content-length"}


@dataclass
class CrawlSpec:
    seeds: list[str]
    output: str
    shard: str = "shard-00000"
    max_pages: int = 200
    max_depth: int = 3
    settings: dict = field(default_factory=dict)

    @classmethod
    def read(cls, path: str | Path) -> CrawlSpec:
        return cls(**json.loads(Path(path).read_text()))

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.__dict__, indent=2))


class SiteSpider(scrapy.Spider):
    """Follows links that stay on a seed's host, up to the depth and page limits."""

    name = "site"

    def __init__(self, spec: CrawlSpec, **kwargs) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.allowed_hosts = {urlsplit(seed).netloc for seed in spec.seeds}

    async def start(self):
        for seed in self.spec.seeds:
            yield scrapy.Request(seed, callback=self.parse, errback=self.on_error)

    def parse(self, response: Response):
        yield {"response": response}
        if response.status != 200 or not hasattr(response, "css"):
            return
        for href in response.css("a::attr(href)").getall():
            url = response.urljoin(href).split("#", 1)[0]
            if urlsplit(url).netloc in self.allowed_hosts and url.startswith(("http://", "https://")):
                yield scrapy.Request(url, callback=self.parse, errback=self.on_error)

    def on_error(self, failure: Failure):
        request = failure.request
        yield {
            "failure": type(failure.value).__name__,
            "url": request.url,
            "depth": request.meta.get("depth", 0),
        }


class WarcIndexPipeline:
    """Writes each fetched response as WARC request+response records and one fetch-index row."""

    def __init__(self, spec: CrawlSpec) -> None:
        self.spec = spec
        self.rows: list[dict] = []
        self.warc_name = f"warc/{spec.shard}.warc.gz"

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler.spider.spec)

    def open_spider(self, spider=None) -> None:
        output = Path(self.spec.output)
        (output / "warc").mkdir(parents=True, exist_ok=True)
        (output / "index").mkdir(parents=True, exist_ok=True)
        self.handle = open(output / self.warc_name, "wb")  # noqa: SIM115 - closed in close_spider
        self.writer = WARCWriter(self.handle, gzip=True)

    def process_item(self, item, spider=None):
        now = datetime.now(UTC)
        if "failure" in item:
            self.rows.append(
                self._row(item["url"], item["depth"], None, None, 0, now, reason=item["failure"])
            )
            return item
        response: Response = item["response"]
        content_type = response.headers.get(b"Content-Type", b"").decode("latin-1") or None
        offset = self.handle.tell()
        self._write_records(response, now)
        length = self.handle.tell() - offset
        reason = None if response.status == 200 else f"http_{response.status}"
        self.rows.append(
            self._row(
                response.url,
                response.meta.get("depth", 0),
                response.status,
                content_type,
                len(response.body),
                now,
                offset=offset,
                warc_length=length,
                reason=reason,
            )
        )
        return item

    def _write_records(self, response: Response, when: datetime) -> None:
        date = when.strftime("%Y-%m-%dT%H:%M:%SZ")
        # Scrapy hands us the decoded body, so the headers must not claim an encoding or length.
        headers = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, values in response.headers.items()
            if name.lower() not in _DROPPED_HEADERS
            for value in values
        ]
        headers.append(("Content-Length", str(len(response.body))))
        status_line = f"{response.status} {_reason_phrase(response.status)}"
        http_headers = StatusAndHeaders(status_line, headers, protocol="HTTP/1.1")
        record = self.writer.create_warc_record(
            response.url,
            "response",
            payload=BytesIO(response.body),
            http_headers=http_headers,
            warc_headers_dict={"WARC-Date": date},
        )
        self.writer.write_record(record)
        request = response.request
        request_headers = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, values in request.headers.items()
            for value in values
        ]
        path = urlsplit(request.url).path or "/"
        request_record = self.writer.create_warc_record(
            request.url,
            "request",
            payload=BytesIO(request.body or b""),
            http_headers=StatusAndHeaders(
                f"{request.method} {path} HTTP/1.1", request_headers, is_http_request=True
            ),
            warc_headers_dict={
                "WARC-Date": date,
                "WARC-Concurrent-To": record.rec_headers.get_header("WARC-Record-ID"),
            },
        )
        self.writer.write_record(request_record)

    def _row(
        self,
        url,
        depth,
        status,
        content_type,
        content_length,
        when,
        *,
        offset=None,
        warc_length=None,
        reason=None,
    ):
        return {
            "url": url,
            "domain": urlsplit(url).hostname,
            "depth": depth,
            "status": status,
            "content_type": content_type,
            "content_length": content_length,
            "fetch_time": when,
            "warc_file": self.warc_name if offset is not None else None,
            "warc_offset": offset,
            "warc_length": warc_length,
            "failure_reason": reason,
        }

    def close_spider(self, spider=None) -> None:
        self.handle.close()
        table = pa.Table.from_pylist(self.rows, schema=INDEX_SCHEMA)
        pq.write_table(table, Path(self.spec.output) / "index" / f"{self.spec.shard}.parquet")


def _reason_phrase(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def scrapy_settings(spec: CrawlSpec) -> dict:
    settings = {
        "ROBOTSTXT_OBEY": True,
        "DEPTH_LIMIT": spec.max_depth,
        "CLOSESPIDER_ITEMCOUNT": spec.max_pages,
        "HTTPERROR_ALLOW_ALL": True,
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "WARNING",
        "ITEM_PIPELINES": {f"{__name__}.WarcIndexPipeline": 100},
        "REQUEST_FINGERPRINTER_IMPLEMENTATION": "2.7",
    }
    settings.update(spec.settings)
    return settings


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m pipeline.crawl.crawler SPEC.json", file=sys.stderr)
        return 2
    spec = CrawlSpec.read(argv[0])
    process = CrawlerProcess(settings=scrapy_settings(spec))
    process.crawl(SiteSpider, spec=spec)
    process.start()
    return 0


if __name__ == "__main__":
    sys.exit(main())
