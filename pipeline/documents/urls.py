"""URL canonical form (the crawl's de-duplication key) and registered domains (the unit of sharding)."""

from __future__ import annotations

import functools
import ipaddress
import re
from urllib.parse import urlsplit, urlunsplit

from w3lib.url import canonicalize_url

MAX_URL_LENGTH = 2083  # what browsers accept; Scrapy's UrlLengthMiddleware would drop longer ones silently
TRACKING_PARAMS = frozenset(
    {"utm_source", "utm_medium", "utm_campaign", "utm_term", "utm_content", "gclid", "fbclid", "msclkid"}
)
_DEFAULT_PORTS = {"http": 80, "https": 443}
_HOST_CHARS = re.compile(r"^[a-z0-9._:-]+$")  # after IDNA encoding; IPv6 literals arrive without brackets


class InvalidURL(ValueError):
    """A URL the crawler cannot or must not fetch (bad syntax, other scheme, too long)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{reason}: {url[:200]!r}")
        self.reason = reason


def canonical_url(url: str) -> str:
    """The form two URLs share when they name the same page, used to de-duplicate the frontier.

    w3lib's canonicalize_url sorts the query, normalises percent-escapes and IDNA, drops the fragment and
    resolves dot segments; on top of that the default port and tracking parameters go, and an empty path
    becomes ``/``. The crawler fetches the URL as found; only the de-duplication key is canonical. Scheme,
    ``www.`` and a trailing slash stay (a server may answer them differently); the dedup stage's looser
    ``pipeline.dedup.urls.page_key`` drops them.
    """
    url = url.strip()
    if len(url) > MAX_URL_LENGTH:
        raise InvalidURL(url, "url_too_long")
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a port that is not a number or out of range
        canonical = urlsplit(canonicalize_url(url, keep_fragments=False)) if parts.hostname else None
    except (ValueError, UnicodeError) as exc:
        raise InvalidURL(url, "invalid_url") from exc
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise InvalidURL(url, "unsupported_scheme")
    if canonical is None or not canonical.hostname:
        raise InvalidURL(url, "invalid_url")
    host = canonical.hostname.rstrip(".")
    if not _HOST_CHARS.match(host):
        raise InvalidURL(url, "invalid_url")
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = host if port in (None, _DEFAULT_PORTS[scheme]) else f"{host}:{port}"
    # Filter the already-canonical query text so w3lib's encoding of the other parameters is kept.
    query = "&".join(
        pair for pair in canonical.query.split("&") if pair and pair.split("=", 1)[0] not in TRACKING_PARAMS
    )
    return urlunsplit((scheme, netloc, canonical.path or "/", query, ""))


def fetchable_url(url: str) -> str:
    """The URL to request: as found, minus its fragment; raises InvalidURL like canonical_url."""
    canonical_url(url)
    return url.strip().split("#", 1)[0]


@functools.cache
def _extractor():
    import tldextract

    # The bundled public-suffix snapshot: no network access, same answer on every worker. Private suffixes
    # (github.io, blogspot.com) count, so each user site there is its own site, crawled politely on its own.
    return tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None, include_psl_private_domains=True)


def host_of(url: str) -> str:
    """The canonical (lower-case, IDNA) host of a URL, without brackets for IPv6."""
    return urlsplit(canonical_url(url)).hostname or ""


def registered_domain(url_or_host: str) -> str:
    """The site a URL belongs to: ``www.bbc.co.uk`` -> ``bbc.co.uk``; an IP or ``localhost`` is its own site."""
    text = url_or_host.strip()
    if "://" not in text:
        text = f"http://{text if not _is_bare_ipv6(text) else f'[{text}]'}/"
    host = host_of(text)
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    extracted = _extractor()(host)
    return extracted.top_domain_under_public_suffix or host


def _is_bare_ipv6(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 6
    except ValueError:
        return False
