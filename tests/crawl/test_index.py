"""Failure reasons, the index table and its manifest counts, checked against plain recounts."""

import random
from collections import Counter
from datetime import UTC, datetime

import pytest
import scrapy
from scrapy.exceptions import (
    CannotResolveHostError,
    DownloadCancelledError,
    DownloadConnectionRefusedError,
    DownloadTimeoutError,
    IgnoreRequest,
    StopDownload,
)

from pipeline.crawl.index import add_counts, crawl_counters, index_table, write_index
from pipeline.crawl.middlewares import REFUSED_HOSTS, CrawlRefusal
from pipeline.crawl.spiders import failure_reason
from pipeline.crawl.stage import check_index


def test_failure_reasons():
    request = scrapy.Request("http://refused.example/x", meta={"stop_reason": "content_type_not_allowed"})
    REFUSED_HOSTS["refused.example"] = "10.0.0.1 (private)"
    maxsize = (
        "Ignored response <200 http://a/> because its body (10 B compressed, 99 B decompressed so far) "
        "exceeded DOWNLOAD_MAXSIZE (50 B) during decompression."
    )
    cases = [
        (CrawlRefusal("robots_disallowed"), "robots_disallowed"),
        (StopDownload(fail=True), "content_type_not_allowed"),
        (DownloadTimeoutError("took longer"), "timeout"),
        (CannotResolveHostError("no results"), "refused_private_address"),
        (DownloadConnectionRefusedError("refused"), "connection_refused"),
        (IgnoreRequest(maxsize), "too_large"),
        (
            DownloadCancelledError(
                "Cancelling download: expected response size larger than download max size"
            ),
            "too_large",
        ),
        (ValueError("odd"), "error_ValueError"),
    ]
    for exc, reason in cases:
        assert failure_reason(exc, request) == reason, exc
    assert (
        failure_reason(CannotResolveHostError("x"), scrapy.Request("http://nowhere.example/")) == "dns_error"
    )


def random_rows(rng: random.Random, count: int) -> list[dict]:
    rows = []
    for number in range(count):
        stored = rng.random() < 0.7
        status = rng.choice([200, 200, 200, 404, 500]) if stored else None
        reason = (
            None
            if status == 200 and rng.random() < 0.9
            else rng.choice(["timeout", "robots_disallowed", "binary_content"])
        )
        if status is not None and status != 200:
            reason = f"http_{status}"
        domain = rng.choice(["a.example", "b.example", "c.example"])
        rows.append(
            {
                "url": f"http://{domain}/{number}",
                "domain": domain,
                "depth": rng.randint(0, 3),
                "status": status,
                "content_type": "text/html" if stored else None,
                "content_length": rng.randint(0, 5000) if stored else 0,
                "fetch_time": datetime(2026, 11, 29, tzinfo=UTC).isoformat(),
                "warc_file": "warc/x.warc.gz" if stored else None,
                "warc_offset": number * 10 if stored else None,
                "warc_length": 10 if stored else None,
                "failure_reason": reason,
            }
        )
    return rows


@pytest.mark.parametrize("seed", range(5))
def test_counters_match_a_recount(seed, tmp_path):
    rows = random_rows(random.Random(seed), 300)
    rng = random.Random(seed)
    rng.shuffle(rows)
    table = index_table(rows)
    assert table.column("url").to_pylist() == sorted(row["url"] for row in rows)
    counters = crawl_counters(table)
    assert counters["requests"] == len(rows)
    assert counters["fetched"] == sum(row["status"] == 200 for row in rows)
    assert counters["stored"] == sum(row["warc_file"] is not None for row in rows)
    assert counters["bytes_fetched"] == sum(row["content_length"] for row in rows)
    assert counters["by_reason"] == dict(
        Counter(row["failure_reason"] for row in rows if row["failure_reason"])
    )
    assert counters["by_status"] == {
        str(k): v for k, v in Counter(r["status"] for r in rows if r["status"]).items()
    }
    for domain, figures in counters["by_domain"].items():
        mine = [row for row in rows if row["domain"] == domain]
        assert figures["requests"] == len(mine)
        assert figures["bytes"] == sum(row["content_length"] for row in mine)
        assert figures.get("by_reason", {}) == dict(
            Counter(r["failure_reason"] for r in mine if r["failure_reason"])
        )
    assert (
        add_counts(counters, counters)["by_domain"]["a.example"]["requests"]
        == 2 * counters["by_domain"]["a.example"]["requests"]
    )

    (tmp_path / "warc").mkdir()
    (tmp_path / "warc" / "x.warc.gz").write_bytes(b"\0" * (10 * 300))
    write_index(table, tmp_path / "index" / "x.parquet")
    check_index(table, tmp_path)
    (tmp_path / "warc" / "x.warc.gz").write_bytes(b"\0" * 20)
    if counters["stored"] > 2:
        with pytest.raises(RuntimeError, match="past the end"):
            check_index(table, tmp_path)
    with pytest.raises(RuntimeError, match="twice"):
        check_index(index_table([*rows, rows[0]]), tmp_path)


def test_a_url_queued_but_never_finished_is_listed_not_lost():
    from pipeline.crawl.journal import Entry, JournalState
    from pipeline.crawl.stage import _never_finished

    state = JournalState()
    for key in ("http://a.example/1", "http://a.example/2", "http://a.example/map.xml"):
        state.apply(Entry(key, key, 1, "sitemap" if key.endswith(".xml") else "page").to_event())
    state.apply({"e": "done", "k": "http://a.example/1", "kind": "page", "row": {}, "end": None})
    rows = index_table(_never_finished(state, "shard-00000-of-00001")).to_pylist()
    assert [(row["url"], row["failure_reason"], row["status"]) for row in rows] == [
        ("http://a.example/2", "not_fetched", None)
    ]
