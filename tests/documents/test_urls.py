"""Canonical URLs (the frontier's de-duplication key) and registered domains (the sharding unit)."""

import random
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.documents.urls import (
    MAX_URL_LENGTH,
    InvalidURL,
    canonical_url,
    fetchable_url,
    registered_domain,
)

hosts = st.sampled_from(
    ["example.com", "www.example.co.uk", "blog.example.org", "127.0.0.1", "[::1]", "bücher.de"]
)
segments = st.text(alphabet=string.ascii_letters + string.digits + "-._~", min_size=1, max_size=8)
paths = st.lists(segments, max_size=4).map(lambda parts: "/" + "/".join(parts))
params = st.lists(
    st.tuples(
        st.text(string.ascii_lowercase, min_size=1, max_size=5), st.text(string.ascii_letters, max_size=5)
    ),
    max_size=4,
    unique_by=lambda pair: pair[0],
)


def build(scheme, host, port, path, query_pairs, fragment=""):
    netloc = host if port is None else f"{host}:{port}"
    query = "&".join(f"{key}={value}" for key, value in query_pairs)
    return (
        f"{scheme}://{netloc}{path}" + (f"?{query}" if query else "") + (f"#{fragment}" if fragment else "")
    )


@settings(deadline=None)  # no timing assertions: the machines are shared
@given(st.sampled_from(["http", "https"]), hosts, paths, params, st.text(string.ascii_letters, max_size=6))
def test_canonical_form_ignores_spelling_differences(scheme, host, path, pairs, fragment):
    reference = canonical_url(build(scheme, host, None, path, pairs))
    default_port = 80 if scheme == "http" else 443
    shuffled = list(pairs)
    random.Random(len(path)).shuffle(shuffled)
    variants = [
        build(scheme.upper(), host.upper() if host.isascii() else host, None, path, pairs),
        build(scheme, host, default_port, path, pairs),
        build(scheme, host, None, path, shuffled, fragment),
        build(scheme, host, None, path, [*pairs, ("utm_source", "newsletter")]),
        "  " + build(scheme, host, None, path, pairs) + "\n",
    ]
    for variant in variants:
        assert canonical_url(variant) == reference, variant
    assert canonical_url(reference) == reference, "idempotent"


@settings(deadline=None)  # no timing assertions: the machines are shared
@given(hosts, paths, paths)
def test_different_pages_keep_different_keys(host, first, second):
    a, b = build("http", host, None, first, []), build("http", host, None, second, [])
    if first.rstrip("/") != second.rstrip("/") and first and second:
        assert (canonical_url(a) == canonical_url(b)) == (first == second)
    assert canonical_url(build("http", host, 8080, first, [])) != canonical_url(
        build("http", host, 8081, first, [])
    )
    assert canonical_url(a) != canonical_url(build("https", host, None, first, [])), (
        "scheme is part of the page"
    )


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://example.com/file", "unsupported_scheme"),
        ("mailto:someone@example.com", "unsupported_scheme"),
        ("javascript:void(0)", "unsupported_scheme"),
        ("http:///no-host", "invalid_url"),
        ("http://example.com:99999/", "invalid_url"),
        ("http://[::1/", "invalid_url"),
        ("http://exa mple.com/", "invalid_url"),
        ("http://example.com/" + "a" * MAX_URL_LENGTH, "url_too_long"),
    ],
)
def test_uncrawlable_urls_say_why(url, reason):
    with pytest.raises(InvalidURL) as caught:
        canonical_url(url)
    assert caught.value.reason == reason


def test_fetchable_url_keeps_the_url_as_found_without_fragment():
    url = "http://Example.com/b?z=1&a=2#part"
    assert fetchable_url(url) == "http://Example.com/b?z=1&a=2"
    assert canonical_url(url) == "http://example.com/b?a=2&z=1"


@pytest.mark.parametrize(
    ("url", "site"),
    [
        ("https://www.bbc.co.uk/news", "bbc.co.uk"),
        ("http://a.b.example.com:8080/x", "example.com"),
        ("http://BÜCHER.de/", "xn--bcher-kva.de"),
        ("http://xn--bcher-kva.de/", "xn--bcher-kva.de"),
        ("http://127.0.0.1:5000/", "127.0.0.1"),
        ("http://[::1]:80/", "::1"),
        ("http://localhost/", "localhost"),
        ("www.example.org", "example.org"),
        ("10.1.2.3", "10.1.2.3"),
    ],
)
def test_registered_domain(url, site):
    assert registered_domain(url) == site
