"""The private-address refusal in a real crawl: after DNS resolution, for seeds and for redirects."""

import pytest

from pipeline.core.storage import DatasetRef
from pipeline.crawl import stage
from tests.conftest import make_config
from tests.crawl.support import path_of, read_index, row_for
from tests.crawl.testsite import TestSite

pytestmark = pytest.mark.slow


def test_loopback_and_private_addresses_are_refused_unless_allow_listed(tmp_path):
    with TestSite(pages=3, slow_s=0.1, big_bytes=1000) as site:
        # www.example.com stands for a public site; it is pinned to the test server and allow-listed by name.
        # internal.example.com is the same site's host that resolves into a private network.
        site.internal_url = f"http://internal.example.com:{site.port}/admin"
        seeds = [
            site.url("/index.html", host="www.example.com"),
            site.url("/page/1.html", host="localhost"),  # resolves to 127.0.0.1 by the system resolver
            site.url("/page/2.html"),  # 127.0.0.1 itself
            f"http://[::1]:{site.port}/page/3.html",  # an IPv6 literal: used to reach the downloader
        ]
        config = make_config(
            tmp_path,
            f"crawl.seeds=[{', '.join(repr(seed) for seed in seeds)}]",
            "crawl.allowed_private_hosts=[www.example.com]",
            "crawl.host_addresses={www.example.com: 127.0.0.1, internal.example.com: 10.0.0.7}",
            "crawl.download_delay=0",
            "crawl.autothrottle=false",
            "crawl.retry_times=0",
        )
        manifest = stage.run(config, [], DatasetRef.of(config, "crawl", "refusals"))
        rows = read_index(manifest.path)

        assert site.hits_by_host["localhost"] == 0 and site.hits_by_host["127.0.0.1"] == 0, "never connected"
        assert site.hits_by_host["www.example.com"] > 10, "the allow-listed site was crawled"
    by_host = {(row["domain"], path_of(row["url"])): row for row in rows}
    assert by_host["localhost", "/page/1.html"]["failure_reason"] == "refused_private_address"
    assert by_host["127.0.0.1", "/page/2.html"]["failure_reason"] == "refused_private_address"
    (ipv6,) = [row for row in rows if "[::1]" in row["url"]]
    assert ipv6["failure_reason"] == "refused_private_address" and ipv6["status"] is None
    site_rows = [row for row in rows if row["registered_domain"] == "example.com"]
    internal = row_for(site_rows, "/to-internal")
    assert internal["failure_reason"] == "refused_private_address", (
        "a redirect to a private address is refused"
    )
    assert path_of(internal["url"]) == "/admin" and internal["status"] is None
    assert row_for(site_rows, "/to-metadata")["failure_reason"] == "redirect_off_site"
    assert row_for(site_rows, "/page/0.html")["status"] == 200
    assert manifest.counters["by_reason"]["refused_private_address"] == 4
    assert manifest.counters["by_domain"]["localhost"]["by_reason"] == {"refused_private_address": 1}


def test_another_port_of_an_allow_listed_host_is_refused(tmp_path):
    """Allow-listed as 127.0.0.1:<site port>, the crawl must not reach a service on another port of
    127.0.0.1, through a redirect or a seed."""
    with (
        TestSite(pages=3, slow_s=0.1, big_bytes=1000) as site,
        TestSite(pages=1, bad_cases=False) as internal,
    ):
        site.internal_url = internal.url("/admin")  # /to-internal redirects to the other port
        internal_seed, site_port = internal.url("/index.html"), site.port
        config = make_config(
            tmp_path,
            f"crawl.seeds=[{site.url('/index.html')!r}, {internal.url('/index.html')!r}]",
            f"crawl.allowed_private_hosts=['127.0.0.1:{site.port}']",
            "crawl.download_delay=0",
            "crawl.autothrottle=false",
            "crawl.retry_times=0",
        )
        manifest = stage.run(config, [], DatasetRef.of(config, "crawl", "ports"))
        rows = read_index(manifest.path)
        assert sum(internal.hits.values()) == 0, internal.hits
        assert site.hits["/page/0.html"] == 1, "the allow-listed port was crawled"
    redirected = row_for(
        [row for row in rows if f":{site_port}/" in (row["original_url"] or row["url"])], "/to-internal"
    )
    assert redirected["failure_reason"] == "refused_private_address" and redirected["status"] is None
    (seed,) = [row for row in rows if row["url"] == internal_seed]
    assert seed["failure_reason"] == "refused_private_address"
