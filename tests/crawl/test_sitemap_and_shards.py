"""The sitemap spider, and a sharded crawl run shard by shard through the CLI, then merged."""

import os
import subprocess
import sys

import pytest

from pipeline.core.storage import DatasetRef
from pipeline.crawl import stage
from pipeline.crawl.sharding import shard_of, shard_ref
from pipeline.documents.extract import read_warc_payload
from tests.crawl.support import LOCAL_CRAWL, crawl_config, path_of, read_index, row_for
from tests.crawl.testsite import TestSite

pytestmark = pytest.mark.slow


def test_sitemap_spider_fetches_what_sitemaps_list(tmp_path):
    with TestSite(pages=8, seed=5) as site:
        config = crawl_config(tmp_path, [site.url("/robots.txt")], "crawl.spider=sitemap")
        manifest = stage.run(config, [], DatasetRef.of(config, "crawl", "maps"))
        assert site.hits["/index.html"] == 0, "a sitemap crawl follows no links"
        assert site.hits["/private/secret.html"] == 0
        listed = {path_of(url) for url in site.sitemap_urls()}
    rows = read_index(manifest.path)
    assert {path_of(row["url"]) for row in rows} == listed
    assert row_for(rows, "/private/secret.html")["failure_reason"] == "robots_disallowed"
    assert all(row["status"] == 200 for row in rows if path_of(row["url"]).startswith(("/page/", "/orphan/")))
    sitemaps = manifest.counters["sitemaps"]
    # robots.txt, the index, the plain and the gzipped sitemap, and a broken one
    assert sitemaps["requests"] == 5 and sitemaps["by_reason"] == {"invalid_sitemap": 1}


def pretrain_crawl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "crawl", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PRETRAIN__LOGGING__CONSOLE": "false"},
    )


def test_sharded_crawl_then_merge(tmp_path):
    with TestSite(pages=6, bad_cases=False, seed=8) as site:
        seeds = [site.url("/index.html"), site.url("/index.html", host="localhost")]
        num_shards = next(n for n in range(2, 20) if shard_of(seeds[0], n) != shard_of(seeds[1], n))
        args = ["--snapshot", "s", "--num-shards", str(num_shards), "--set", f"project.data_root={tmp_path}"]
        args += ["--set", f"crawl.seeds=[{', '.join(seeds)}]"]
        for override in LOCAL_CRAWL:
            args += ["--set", override]

        early = pretrain_crawl(*args, "--merge")
        assert (
            early.returncode == 2 and f"{num_shards} of {num_shards} shard(s) not published" in early.stderr
        )
        outside = pretrain_crawl(*args, "--shard", str(num_shards))
        assert outside.returncode == 2 and "out of range" in outside.stderr
        for shard in range(num_shards):
            done = pretrain_crawl(*args, "--shard", str(shard))
            assert done.returncode == 0, done.stderr[-3000:]
        merged = pretrain_crawl(*args, "--merge")
        assert merged.returncode == 0, merged.stderr[-3000:]

    config = crawl_config(tmp_path, seeds, f"crawl.num_shards={num_shards}")
    crawl = DatasetRef.of(config, "crawl", "s")
    assert merged.stdout.strip() == str(crawl.path)
    rows = read_index(crawl.path)
    shards = [shard_ref(config, "s", shard) for shard in range(num_shards)]
    per_shard = [read_index(ref.path) for ref in shards]
    assert sorted(row["url"] for row in rows) == sorted(row["url"] for part in per_shard for row in part)
    for shard, part in enumerate(per_shard):
        assert {shard_of(row["url"], num_shards) for row in part} <= {shard}, "a site never leaves its shard"
    assert {row["domain"] for row in rows} == {"127.0.0.1", "localhost"}
    assert len(rows) == 2 * 7, "each host: index and 6 pages"
    for row in rows:  # the clean stage resolves WARC paths against the merged folder
        payload = read_warc_payload(crawl.path / row["warc_file"], row["warc_offset"])
        assert len(payload) == row["content_length"] and b"<html" in payload[:200]
        assert (crawl.path / row["warc_file"]).stat().st_nlink >= 2, "hard-linked, not copied"

    manifest = crawl.manifest()
    assert manifest.counters["requests"] == len(rows) and manifest.counters["fetched"] == len(rows)
    assert set(manifest.counters["by_domain"]) == {"127.0.0.1", "localhost"}
    assert sum(part["requests"] for part in manifest.counters["per_shard"].values()) == len(rows)
    assert [entry["stage"] for entry in manifest.inputs] == ["crawl-shards"] * num_shards
