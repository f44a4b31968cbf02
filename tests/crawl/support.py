"""Helpers for the crawl tests that run the real crawler against tests.crawl.testsite."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pyarrow.parquet as pq

from pipeline.config import PipelineConfig
from tests.conftest import make_config

# Fast and deterministic for a local server: no politeness delay, short timeouts and backoffs.
LOCAL_CRAWL = (
    "crawl.allowed_private_hosts=[127.0.0.1]",
    "crawl.download_delay=0",
    "crawl.autothrottle=false",
    "crawl.retry_times=1",
    "crawl.retry_backoff_s=0.2",
    "crawl.max_depth=5",
)


def crawl_config(root: Path, seeds: list[str], *overrides: str) -> PipelineConfig:
    return make_config(root, f"crawl.seeds=[{', '.join(seeds)}]", *LOCAL_CRAWL, *overrides)


def read_index(folder: Path) -> list[dict]:
    return pq.read_table(Path(folder) / "index").to_pylist()


def path_of(url: str | None) -> str | None:
    return urlsplit(url).path if url else None


def row_for(rows: list[dict], path: str) -> dict:
    """The index row of the URL queued at ``path`` (``original_url`` when a redirect moved it)."""
    matches = [row for row in rows if path_of(row["original_url"] or row["url"]) == path]
    assert len(matches) == 1, f"{path}: {len(matches)} index rows"
    return matches[0]
