"""Band/row selection against scipy's quadrature, the S-curve plot, page keys of URLs, config checks."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.integrate import quad

from pipeline.core.config import ConfigError
from pipeline.dedup import lsh
from pipeline.dedup.job import minhasher
from pipeline.dedup.urls import page_key
from pipeline.documents.urls import InvalidURL, canonical_url
from tests.conftest import make_config


def brute_force_bands_rows(threshold, num_perm, wfp, wfn):
    def p(s, b, r):
        return 1 - (1 - s**r) ** b

    best = None
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            fp = quad(p, 0, threshold, args=(b, r))[0]
            fn = quad(lambda s, b=b, r=r: 1 - p(s, b, r), threshold, 1)[0]
            error = wfp * fp + wfn * fn
            if best is None or error < best[0] - 1e-12:
                best = (error, b, r)
    return best


@pytest.mark.parametrize(
    ("threshold", "num_perm", "wfp", "wfn"),
    [
        (0.8, 128, 0.05, 0.95),
        (0.8, 128, 0.5, 0.5),
        (0.7, 64, 0.3, 0.7),
        (0.9, 40, 0.5, 0.5),
        (0.5, 20, 0.9, 0.1),
    ],
)
def test_optimal_bands_rows_matches_brute_force_quadrature(threshold, num_perm, wfp, wfn):
    bands, rows = lsh.optimal_bands_rows(threshold, num_perm, wfp, wfn)
    error, *_ = brute_force_bands_rows(threshold, num_perm, wfp, wfn)
    fp, fn = lsh.error_areas(threshold, bands, rows)
    # The same minimum error (ties between grid points may be broken either way).
    assert wfp * fp + wfn * fn == pytest.approx(error, abs=1e-9)
    assert bands * rows <= num_perm


def test_default_parameters_favour_recall_at_the_threshold():
    bands, rows = (
        minhasher(make_config("/tmp/unused").dedup, 1).bands,
        minhasher(make_config("/tmp/unused").dedup, 1).rows,
    )
    assert (bands, rows) == (16, 8)
    assert lsh.collision_probability(0.8, bands, rows) > 0.94
    assert lsh.collision_probability(0.9, bands, rows) > 0.999
    assert lsh.collision_probability(0.3, bands, rows) < 0.002


def test_bands_and_rows_from_config_skip_the_search():
    config = make_config("/tmp/unused", "dedup.bands=20", "dedup.rows=5")
    hasher = minhasher(config.dedup, 3)
    assert (hasher.bands, hasher.rows, hasher.num_perm) == (20, 5, 100)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["dedup.bands=4"], "set both bands and rows"),
        (["dedup.threshold=1.5"], "dedup.threshold"),
        (["dedup.bands=100", "dedup.rows=100"], "at most 4096"),
        (["dedup.false_positive_weight=0", "dedup.false_negative_weight=0"], "cannot both be 0"),
        (["dedup.ngram_size=0"], "dedup.ngram_size"),
    ],
)
def test_bad_dedup_config_fails_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        make_config("/tmp/unused", *overrides)


def test_optimal_bands_rows_rejects_bad_arguments():
    with pytest.raises(ValueError, match="threshold"):
        lsh.optimal_bands_rows(1.0, 10)
    with pytest.raises(ValueError, match="num_perm"):
        lsh.optimal_bands_rows(0.5, 0)


def test_s_curve_plot_is_a_stable_png(tmp_path):
    first = lsh.plot_s_curve(16, 8, 0.8, tmp_path / "a.png").read_bytes()
    second = lsh.plot_s_curve(16, 8, 0.8, tmp_path / "b.png").read_bytes()
    assert first[:8] == b"\x89PNG\r\n\x1a\n"
    assert hashlib.sha256(first).digest() == hashlib.sha256(second).digest()


def test_lsh_cli_prints_the_choice(capsys, tmp_path):
    assert lsh.main(["--threshold", "0.8", "--num-perm", "128", "--plot", str(tmp_path / "s.png")]) == 0
    out = capsys.readouterr().out
    assert "bands=16 rows=8" in out and (tmp_path / "s.png").is_file()


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("https://www.Example.com:443/a/b/?utm_source=x&b=2&a=1#top", "http://example.com/a/b?a=1&b=2"),
        ("https://example.com", "http://example.com/"),
        ("https://example.com/x?fbclid=1", "https://example.com/x"),
        ("http://example.com:80/x", "https://example.com/x"),
    ],
)
def test_cosmetic_url_variants_share_a_page_key(a, b):
    assert page_key(a) == page_key(b) is not None


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("https://example.com/x?page=2", "https://example.com/x?page=3"),
        ("https://example.com/X", "https://example.com/x"),
        ("https://example.com:8080/x", "https://example.com/x"),
        ("https://a.example.com/x", "https://b.example.com/x"),
    ],
)
def test_different_pages_keep_different_page_keys(a, b):
    assert page_key(a) != page_key(b)


@pytest.mark.parametrize("url", [None, "", "   ", "not a url", "http://[::1", "mailto:someone@example.com"])
def test_unusable_urls_have_no_page_key(url):
    assert page_key(url) is None


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("http://example.com/a", "https://example.com/a"),
        ("https://www.example.com/a", "https://example.com/a"),
        ("https://example.com/a/", "https://example.com/a"),
    ],
)
def test_page_key_merges_what_the_crawls_canonical_url_keeps_apart(a, b):
    assert canonical_url(a) != canonical_url(b)
    assert page_key(a) == page_key(b)


@pytest.mark.parametrize("url", ["mailto:someone@example.com", "http://[::1"])
def test_an_unusable_url_has_no_page_key_where_the_crawl_refuses_it(url):
    assert page_key(url) is None
    with pytest.raises(InvalidURL):
        canonical_url(url)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_page_key_never_raises_and_is_idempotent(suffix):
    url = "https://example.com/" + suffix
    key = page_key(url)
    if key is not None:
        assert key.startswith("//")
        assert page_key("https:" + key) == key
