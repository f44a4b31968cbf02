"""The `crawl` config section: seeds, politeness, limits and the address policy (docs/crawl.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from pipeline.core.config import Section


class CrawlConfig(Section):
    seeds: list[str] = Field(
        default_factory=list,
        description="start URLs (spider=seed) or sitemap/robots.txt URLs (spider=sitemap); "
        "empty crawls the bundled sample site",
    )
    sample_site: bool | None = Field(
        None, description="serve and crawl the bundled site; default: when no seeds"
    )
    spider: Literal["seed", "sitemap"] = Field(
        "seed", description="seed: follow same-site links from the seeds; sitemap: fetch what sitemaps list"
    )
    max_pages: int = Field(200, gt=0, description="pages requested per shard, at most")
    max_depth: int = Field(3, ge=0, description="link hops from a seed (seed spider)")
    num_shards: int = Field(1, gt=0, description="shards by registered domain; one crawl process each")
    user_agent: str = "pretrain-pipeline/0.1 (+https://github.com/pretrain-pipeline)"
    download_delay: float = Field(0.5, ge=0, description="seconds between requests to one site (minimum)")
    autothrottle: bool = Field(
        True, description="adapt the delay to each site's latency (Scrapy AutoThrottle)"
    )
    autothrottle_target_concurrency: float = Field(2.0, gt=0)
    autothrottle_max_delay: float = Field(30.0, gt=0)
    max_crawl_delay: float = Field(
        30.0, ge=0, description="robots.txt Crawl-delay is honoured up to this many seconds per request"
    )
    concurrent_requests: int = Field(32, gt=0, description="in flight over all sites")
    concurrent_requests_per_domain: int = Field(4, gt=0)
    download_timeout: float = Field(15.0, gt=0)
    download_maxsize: int = Field(5 * 1024 * 1024, gt=0, description="bytes; larger pages are dropped")
    retry_times: int = Field(2, ge=0, description="retries on 429/5xx, timeouts and connection errors")
    retry_http_codes: list[int] = Field(default_factory=lambda: [429, 500, 502, 503, 504, 522, 524, 408])
    retry_backoff_s: float = Field(1.0, ge=0, description="first retry waits this long, doubling after")
    retry_backoff_max_s: float = Field(60.0, ge=0, description="cap on one backoff, Retry-After included")
    max_redirects: int = Field(10, ge=0)
    allowed_content_types: list[str] = Field(
        default_factory=lambda: ["text/html", "application/xhtml+xml"],
        description="media types stored as pages; others are stopped after the headers",
    )
    allow_wide_private_networks: bool = Field(
        False,
        description="let allowed_private_hosts name networks wider than /24 (IPv4) or /64 (IPv6), such as "
        "10.0.0.0/8; without it such an entry is refused, since it may also allow cloud metadata addresses",
    )
    allowed_private_hosts: list[str] = Field(
        default_factory=list,
        description="hosts, IPs or CIDR networks exempt from the private/loopback/link-local refusal",
    )
    host_addresses: dict[str, str] = Field(
        default_factory=dict,
        description="pin host names to IP addresses, like curl --resolve; the address refusal still applies",
    )
    resume: bool = Field(True, description="continue a killed crawl of the same snapshot and shard")
    allow_empty: bool = Field(
        False, description="publish a crawl that stored no page (default: fail, listing the reasons)"
    )
    warc_max_bytes: int = Field(1 << 30, gt=0, description="start a new WARC file beyond this size")

    @field_validator("seeds")
    @classmethod
    def _valid_seeds(cls, seeds: list[str]) -> list[str]:
        from pipeline.documents.urls import InvalidURL, canonical_url

        for seed in seeds:
            try:
                canonical_url(seed)
            except InvalidURL as exc:
                raise ValueError(f"seed {seed!r} is not a crawlable http(s) URL ({exc.reason})") from None
        return seeds

    @field_validator("allowed_private_hosts")
    @classmethod
    def _valid_hosts(cls, hosts: list[str], info: ValidationInfo) -> list[str]:
        from pipeline.crawl.safety import parse_allow_list

        # allow_wide_private_networks is declared first, so it is validated and here already
        parse_allow_list(hosts, info.data.get("allow_wide_private_networks", False))
        return hosts

    @field_validator("host_addresses")
    @classmethod
    def _pinned_addresses(cls, pinned: dict[str, str]) -> dict[str, str]:
        import ipaddress

        for host, address in pinned.items():
            try:
                ipaddress.ip_address(address)
            except ValueError:
                raise ValueError(f"{host!r} is pinned to {address!r}, which is not an IP address") from None
        return pinned

    @field_validator("allowed_content_types")
    @classmethod
    def _media_types(cls, types: list[str]) -> list[str]:
        bad = [t for t in types if "/" not in t or ";" in t]
        if bad:
            raise ValueError(f"media types look like text/html, without parameters; got {bad}")
        return [t.strip().lower() for t in types]

    @property
    def use_sample_site(self) -> bool:
        return self.sample_site if self.sample_site is not None else not self.seeds
