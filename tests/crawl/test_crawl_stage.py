"""Crawl the bundled sample site over HTTP on 127.0.0.1 with the real Scrapy stack."""

import pyarrow.parquet as pq
import pytest
from warcio.archiveiterator import ArchiveIterator

from pipeline.core.storage import DatasetRef

# sample_corpus: Scrapy crawls the sample site, then Spark cleans and tokenizes it.
pytestmark = pytest.mark.slow


def test_crawl_writes_warc_and_index(sample_corpus):
    config, snapshot = sample_corpus
    crawl = DatasetRef.of(config, "crawl", snapshot)
    manifest = crawl.manifest()
    rows = pq.read_table(crawl.path / "index").to_pylist()
    by_path = {row["url"].split("/", 3)[3]: row for row in rows}

    assert manifest.counters["fetched"] == sum(row["status"] == 200 for row in rows) >= 15
    assert "private/secret.html" in by_path, "the disallowed link was seen"
    assert by_path["private/secret.html"]["status"] is None, "but robots.txt kept it from being fetched"
    assert by_path["missing.html"]["status"] == 404
    assert by_path["missing.html"]["failure_reason"] == "http_404"
    assert manifest.counters["by_status"]["404"] == 1

    for row in rows:
        if row["warc_offset"] is None:
            continue
        with open(crawl.path / row["warc_file"], "rb") as handle:
            handle.seek(row["warc_offset"])
            record = next(iter(ArchiveIterator(handle)))
            assert record.rec_type == "response"
            assert record.rec_headers.get_header("WARC-Target-URI") == row["url"]
            assert int(record.http_headers.get_statuscode()) == row["status"]
            assert len(record.content_stream().read()) == row["content_length"]
