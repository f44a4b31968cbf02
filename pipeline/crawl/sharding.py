"""Split the crawl frontier into N shards by registered domain.

Every host of one registered domain lands in the same shard, so shards never fetch the same site,
politeness limits hold per site, and links followed inside a site never leave their shard. The hash is
a fixed function of the domain (blake2b), not Python's salted ``hash()``, so every worker agrees.

Airflow maps one task per id in :func:`shard_ids` (``.expand``), each running
``pretrain crawl --snapshot S --shard I --num-shards N``; ``pretrain crawl --snapshot S --merge
--num-shards N`` then publishes the snapshot's single ``crawl`` output.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from pipeline.config import PipelineConfig
from pipeline.core.storage import DatasetRef
from pipeline.documents.urls import registered_domain

SHARDS_STAGE = "crawl-shards"


def shard_of(url_or_host: str, num_shards: int) -> int:
    """The shard (0 <= shard < num_shards) that crawls this URL's registered domain."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be at least 1, got {num_shards}")
    digest = hashlib.blake2b(registered_domain(url_or_host).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % num_shards


def split_seeds(seeds: Iterable[str], num_shards: int) -> list[list[str]]:
    """Seeds per shard, each list in the input order."""
    shards: list[list[str]] = [[] for _ in range(num_shards)]
    for seed in seeds:
        shards[shard_of(seed, num_shards)].append(seed)
    return shards


def shard_ids(config: PipelineConfig) -> list[int]:
    """The shard ids of a crawl, for Airflow's dynamic task mapping: ``range(crawl.num_shards)``."""
    return list(range(config.crawl.num_shards))


def shard_name(shard: int, num_shards: int) -> str:
    check_shard(shard, num_shards)
    return f"shard-{shard:05d}-of-{num_shards:05d}"


def check_shard(shard: int, num_shards: int) -> None:
    from pipeline.core.config import ConfigError

    if num_shards < 1:
        raise ConfigError(f"crawl.num_shards must be at least 1, got {num_shards}")
    if not 0 <= shard < num_shards:
        raise ConfigError(
            f"--shard {shard} is out of range for {num_shards} shard(s): use 0..{num_shards - 1}"
        )


def shard_ref(config: PipelineConfig, snapshot: str, shard: int) -> DatasetRef:
    """Where one shard of a snapshot's crawl is published: ``<corpus>/crawl-shards/<snapshot>.shard-…``."""
    name = shard_name(shard, config.crawl.num_shards)
    return DatasetRef.of(config, SHARDS_STAGE, f"{snapshot}.{name}")
