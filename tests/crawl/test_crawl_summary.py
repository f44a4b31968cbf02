"""The crawl's last log line says what a new user needs: fetched and stored apart, and the page limit."""

from __future__ import annotations

import pytest

from pipeline.core.storage import StageFailure
from pipeline.crawl.stage import check_not_empty, crawl_summary
from tests.conftest import make_config

COUNTERS = {"requests": 200, "fetched": 199, "stored": 200, "by_reason": {"http_404": 1}}


def test_a_crawl_cut_by_the_page_limit_says_so_and_how_to_raise_it():
    """A real documentation site (526 pages) ended with `200 pages stored of 200 URLs; reasons: none`."""
    line = crawl_summary({**COUNTERS, "links": {"queued": 199, "page_limit": 30119}}, max_pages=200)
    assert line.startswith("200 URLs requested: 199 pages fetched (HTTP 200), 200 responses stored in WARC")
    assert "failures: http_404 1" in line
    assert "page limit was reached (crawl.max_pages=200): 30119 more links were not followed" in line
    assert line.endswith("--set crawl.max_pages=<pages>")


def test_a_crawl_within_its_limit_does_not_mention_it():
    line = crawl_summary({**COUNTERS, "by_reason": {}, "links": {"queued": 199, "duplicate": 7}}, 500)
    assert "page limit" not in line and line.endswith("failures: none")


def test_an_empty_crawl_of_refused_hosts_names_the_allow_list_setting(tmp_path):
    counters = {"requests": 2, "fetched": 0, "stored": 0, "by_reason": {"refused_private_address": 2}}
    with pytest.raises(StageFailure, match=r"allowed_private_hosts='\[docs\.internal, 10\.0\.0\.5\]'"):
        check_not_empty(
            make_config(tmp_path), "s", {**counters, "refused_hosts": ["docs.internal", "10.0.0.5"]}
        )
    with pytest.raises(StageFailure, match=r"crawl\.allow_empty=true"):  # nothing refused: no allow-list hint
        check_not_empty(make_config(tmp_path), "s", {**counters, "by_reason": {"http_500": 2}})
