"""Crawl the generated test site (every bad-input case) with the real Scrapy stack on 127.0.0.1."""

from collections import Counter

import pytest
from warcio.archiveiterator import ArchiveIterator

from pipeline.core.storage import DatasetRef
from pipeline.crawl import stage
from pipeline.documents.content import looks_binary
from pipeline.documents.extract import decode_html_detailed, read_warc_payload
from tests.crawl.support import crawl_config, path_of, read_index, row_for
from tests.crawl.testsite import TestSite

PER_SITE = 3

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def crawled(tmp_path_factory):
    site = TestSite(pages=30, slow_s=8.0, big_bytes=300_000, seed=11).start()
    config = crawl_config(
        tmp_path_factory.mktemp("site") / "data",
        [site.url("/index.html")],
        "crawl.download_timeout=2.5",
        "crawl.download_maxsize=100000",
        f"crawl.concurrent_requests_per_domain={PER_SITE}",
    )
    output = DatasetRef.of(config, "crawl", "site")
    manifest = stage.run(config, [], output)
    yield site, output, manifest, read_index(output.path)
    site.stop()


def test_every_bad_input_is_counted_with_its_reason(crawled):
    _, _, manifest, rows = crawled
    for path, reason in TestSite.EXPECTED.items():
        assert row_for(rows, path)["failure_reason"] == reason, path
    recount = Counter(row["failure_reason"] for row in rows if row["failure_reason"])
    assert manifest.counters["by_reason"] == dict(recount)
    assert manifest.counters["by_domain"]["127.0.0.1"]["requests"] == len(rows) == manifest.rows["index"]
    assert manifest.counters["by_domain"]["127.0.0.1"]["by_reason"] == dict(recount)
    assert manifest.counters["fetched"] == sum(row["status"] == 200 for row in rows) == manifest.rows["pages"]
    assert manifest.counters["by_status"] == {
        str(status): count
        for status, count in Counter(row["status"] for row in rows if row["status"]).items()
    }


def test_nothing_linked_is_lost(crawled):
    site, _, _, rows = crawled
    linked = {path_of(site.url(path)) for path in [*site.page_paths(), *TestSite.EXPECTED, "/moved"]}
    queued = {path_of(row["original_url"] or row["url"]) for row in rows}
    assert linked | {"/index.html"} == queued
    assert len({row["url"] for row in rows}) == len(rows), "one row per URL"


def test_robots_txt_is_obeyed(crawled):
    site, _, _, rows = crawled
    assert site.hits["/robots.txt"] == 1
    for path in TestSite.NEVER_FETCHED:
        assert site.hits[path] == 0, path
    for path in ("/private/secret.html", "/no-bots/page.html"):
        assert row_for(rows, path)["status"] is None, "nothing stored"


def test_each_page_is_fetched_once_and_retries_back_off(crawled):
    site, _, _, rows = crawled
    for path in site.page_paths():
        assert site.hits[path] == 1, f"{path}: #fragment and utm_ variants are the same page"
    for path in ("/flaky503.html", "/throttled.html"):
        row = row_for(rows, path)
        assert (site.hits[path], row["status"], row["retries"], row["failure_reason"]) == (2, 200, 1, None)
    assert site.hits["/error500.html"] == 2, "one retry, then the 500 is stored and counted"
    assert row_for(rows, "/error500.html")["status"] == 500
    moved = row_for(rows, "/moved")
    assert (path_of(moved["url"]), moved["redirects"], moved["status"]) == ("/moved-target.html", 1, 200)


def test_per_site_concurrency_is_respected(crawled):
    site = crawled[0]
    assert 1 <= site.max_in_flight <= PER_SITE


def test_warc_records_read_back_and_match_the_index(crawled):
    _, output, _, rows = crawled
    stored = [row for row in rows if row["warc_file"] is not None]
    assert len(stored) == sum(row["status"] is not None for row in rows)
    for row in stored:
        with open(output.path / row["warc_file"], "rb") as handle:
            handle.seek(row["warc_offset"])
            records = iter(ArchiveIterator(handle, check_digests=True))
            response = next(records)
            assert response.rec_type == "response"
            assert response.rec_headers.get_header("WARC-Target-URI") == row["url"]
            assert int(response.http_headers.get_statuscode()) == row["status"]
            assert len(response.content_stream().read()) == row["content_length"]
            assert handle.tell() - row["warc_offset"] >= row["warc_length"]
            request = next(records)
            assert request.rec_type == "request"
            assert request.rec_headers.get_header("WARC-Target-URI") == row["url"]
    in_files = []
    for path in sorted((output.path / "warc").glob("*.warc.gz")):
        with open(path, "rb") as handle:
            in_files += [
                record.rec_headers.get_header("WARC-Target-URI")
                for record in ArchiveIterator(handle)
                if record.rec_type == "response"
            ]
    assert sorted(in_files) == sorted(row["url"] for row in stored), "no record without an index row"


def test_clean_reads_and_repairs_what_the_crawler_stored(crawled):
    """The crawl stores raw bodies; decoding and charset repair happen in pipeline.documents.extract."""
    _, output, _, rows = crawled

    def payload(path):
        row = row_for(rows, path)
        return read_warc_payload(output.path / row["warc_file"], row["warc_offset"]), row["content_type"]

    cp1252 = decode_html_detailed(*payload("/charset/latin1-declared-utf8.html"))
    assert "Café crème brûlée" in cp1252.text and cp1252.fix == "declared_mismatch"
    utf8 = decode_html_detailed(*payload("/charset/utf8-declared-latin1.html"))
    assert "Привет мир" in utf8.text and utf8.fix == "declared_mismatch"
    assert b"Gzipped page" in payload("/gzip.html")[0], "stored decompressed"
    assert looks_binary(payload("/binary.html")[0])
    assert payload("/empty.html")[0] == b""
