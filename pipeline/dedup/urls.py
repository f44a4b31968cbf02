"""Page keys, so fetches of one page under cosmetic URL variants can be de-duplicated.

A page key is not a URL to fetch: it drops every difference that never changes the page served by a normal
site (scheme, ``www.``, host case, default port, fragment, tracking parameters, parameter order, a trailing
slash, percent-encoding), so ``http://www.example.com/a/`` and ``https://example.com/a`` share one. Paths keep
their case and other query parameters stay, so ``?page=2`` is not ``?page=3``. Any string is accepted; one
that names no host has no key (None).

The crawl's ``pipeline.documents.urls.canonical_url`` is the strict counterpart: a fetchable URL that keeps the
scheme, ``www.`` and the trailing slash, and raises on a URL the crawler must not fetch.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

TRACKING_PARAMETERS = frozenset(
    {"fbclid", "gclid", "dclid", "msclkid", "mc_cid", "mc_eid", "yclid", "igshid", "_ga", "ref_src"}
)
DEFAULT_PORTS = {"http": 80, "https": 443}
PATH_SAFE = "/:@!$&'()*+,;=-._~"


def page_key(url: str | None) -> str | None:
    """``//host/path?sorted&query`` without the cosmetic parts; None for a missing or unparsable URL."""
    if not url or not url.strip():
        return None
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    host = (parts.hostname or "").rstrip(".")
    if not host:
        return None
    host = host.removeprefix("www.")
    netloc = host if port is None or port == DEFAULT_PORTS.get(parts.scheme.lower()) else f"{host}:{port}"
    # One spelling of percent-encoding: "/a b", "/a%20b" and "/a%20b" are one path.
    path = quote(unquote(parts.path), safe=PATH_SAFE) or "/"
    if len(path) > 1:
        path = path.rstrip("/") or "/"
    query = sorted(
        (key, value)
        for key, value in parse_qsl(parts.query, keep_blank_values=True)
        if not key.lower().startswith("utm_") and key.lower() not in TRACKING_PARAMETERS
    )
    return f"//{netloc}{path}" + (f"?{urlencode(query)}" if query else "")
