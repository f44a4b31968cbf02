"""The frontier split by registered domain: a partition, stable across processes, one site per shard."""

import hashlib
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.config import ConfigError
from pipeline.crawl.sharding import check_shard, shard_ids, shard_name, shard_of, shard_ref, split_seeds
from pipeline.documents.urls import registered_domain
from tests.conftest import make_config

labels = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=10)
suffixes = st.sampled_from(["com", "org", "co.uk", "de", "github.io", "com.au"])
# Some generated names are public suffixes themselves (eu.com, sa.com): those are not registered domains.
sites = st.builds(lambda name, suffix: f"{name}.{suffix}", labels, suffixes).filter(
    lambda site: registered_domain(f"www.{site}") == site
)
# (url, the registered domain it belongs to)
urls_with_site = st.builds(
    lambda sub, site, path, scheme: (f"{scheme}://{sub + '.' if sub else ''}{site}/{path}", site),
    st.one_of(st.just(""), labels),
    sites,
    labels,
    st.sampled_from(["http", "https"]),
)


def reference_shard(site: str, num_shards: int) -> int:
    """Written from the docstring: blake2b-64 of the registered domain, big-endian, modulo N."""
    return int(hashlib.blake2b(site.encode(), digest_size=8).hexdigest(), 16) % num_shards


@settings(deadline=None)  # no timing assertions: the machines are shared
@given(st.lists(urls_with_site, max_size=40), st.integers(1, 64))
def test_split_is_a_partition_that_keeps_each_site_together(pairs, num_shards):
    seeds = [url for url, _ in pairs]
    site_of = dict(pairs)
    shards = split_seeds(seeds, num_shards)
    assert len(shards) == num_shards
    assert sorted(url for shard in shards for url in shard) == sorted(seeds)
    for index, shard in enumerate(shards):
        assert shard == [url for url in seeds if url in shard], "each shard keeps the input order"
        for url in shard:
            assert shard_of(url, num_shards) == index == reference_shard(site_of[url], num_shards)


@settings(deadline=None)  # no timing assertions: the machines are shared
@given(labels, sites, st.integers(1, 1000))
def test_every_host_and_scheme_of_a_site_lands_in_one_shard(sub, site, num_shards):
    expected = shard_of(site, num_shards)
    for url in (f"http://{site}/", f"https://{sub}.{site}/a/b?c=d", f"http://{sub}.{sub}.{site}:8080/"):
        assert shard_of(url, num_shards) == expected


def test_shards_are_the_same_in_another_process_with_another_hash_seed():
    seeds = [f"https://www.site{i}.com/page" for i in range(200)]
    here = [shard_of(url, 16) for url in seeds]
    code = (
        "import json, sys; from pipeline.crawl.sharding import shard_of;"
        "print(json.dumps([shard_of(u, 16) for u in json.loads(sys.stdin.read())]))"
    )
    import json

    for hash_seed in ("0", "12345"):
        output = subprocess.run(
            [sys.executable, "-c", code],
            input=json.dumps(seeds),
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        ).stdout
        assert json.loads(output) == here
    assert len(set(here)) > 8, "200 sites spread over most of 16 shards"


def test_shard_ids_names_and_refs(tmp_path):
    config = make_config(tmp_path, "crawl.num_shards=4")
    assert shard_ids(config) == [0, 1, 2, 3]
    assert shard_name(2, 4) == "shard-00002-of-00004"
    ref = shard_ref(config, "2026-11-29", 2)
    assert ref.path == tmp_path / "sample" / "crawl-shards" / "2026-11-29.shard-00002-of-00004"
    with pytest.raises(ConfigError, match="out of range"):
        check_shard(4, 4)
    with pytest.raises(ConfigError, match="at least 1"):
        check_shard(0, 0)
    with pytest.raises(ValueError):
        shard_of("http://example.com/", 0)
