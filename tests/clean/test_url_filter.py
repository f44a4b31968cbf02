"""URL blocklists: the UT1 layout (folder and archive), plain lists, subdomains, URL prefixes, allow-lists,
banned and soft-banned words; and the clean stage's hooks (a blocked page is never read; an ingest's documents
are marked), with the drops counted by rule."""

from __future__ import annotations

import tarfile
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.clean.url_filter import UrlFilter, UrlFilterConfig, UrlList, read_lists
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.documents.extract import EXTRACTED_SCHEMA, extract_batches
from tests.conftest import make_config

UT1 = {
    "adult/domains": "# UT1 adult\nporn.example\nxxx.example\n",
    "adult/urls": "example.org/adult\nwww.news.example/nsfw\n",
    "gambling/domains": "casino.example\n",
    "gambling/urls": "",
    "phishing/domains": "login-bank.example\n",
}


def write_ut1(root: Path) -> Path:
    for name, text in UT1.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def url_filter(tmp_path: Path, **settings) -> UrlFilter:
    return UrlFilter.from_config(UrlFilterConfig(**settings))


def words_file(tmp_path: Path, name: str, words: list[str]) -> str:
    path = tmp_path / name
    path.write_text("\n".join(words) + "\n")
    return str(path)


def test_ut1_folder_and_archive_give_the_same_lists_by_category(tmp_path):
    folder = write_ut1(tmp_path / "blacklists")
    archive = tmp_path / "blacklists.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname="blacklists")
    from_folder, sizes = read_lists([UrlList(path=str(folder), categories=["adult", "gambling"])])
    from_archive, archive_sizes = read_lists([UrlList(path=str(archive), categories=["adult", "gambling"])])
    assert from_folder == from_archive and sizes == archive_sizes == {"adult": 4, "gambling": 1}
    assert from_folder.domains == {
        "porn.example": "adult",
        "xxx.example": "adult",
        "casino.example": "gambling",
    }
    everything, all_sizes = read_lists([UrlList(path=str(folder))])
    assert all_sizes["phishing"] == 1 and "login-bank.example" in everything.domains


def test_domains_cover_their_subdomains_and_nothing_else(tmp_path):
    checker = url_filter(tmp_path, blocklists=[UrlList(path=str(write_ut1(tmp_path / "ut1")))])
    for url in (
        "https://porn.example/",
        "http://www.porn.example/a",
        "https://a.b.porn.example:8080/x?y=1",
        "PORN.EXAMPLE/page",
    ):
        assert checker.check(url)[0] == "url.domain:adult", url
    for url in ("https://notporn.example/", "https://porn.example.org/", "https://example.com/porn.example"):
        assert checker.check(url) is None or checker.check(url)[0] != "url.domain:adult", url
    rule, reason = checker.check("https://cdn.casino.example/x")
    assert (
        rule == "url.domain:gambling" and "cdn.casino.example is under listed domain casino.example" in reason
    )


def test_url_entries_are_prefixes_at_path_boundaries(tmp_path):
    checker = url_filter(tmp_path, blocklists=[UrlList(path=str(write_ut1(tmp_path / "ut1")))])
    assert checker.check("https://example.org/adult")[0] == "url.url:adult"
    assert checker.check("https://www.example.org/adult/page.html")[0] == "url.url:adult"
    assert checker.check("http://news.example/nsfw?x=1")[0] == "url.url:adult"  # www. ignored on both sides
    assert checker.check("https://example.org/adults") is None
    assert checker.check("https://example.org/") is None


def test_the_allow_list_wins_over_every_rule(tmp_path):
    blocklist = tmp_path / "blocked.txt"
    blocklist.write_text("example.com\n")
    allow = tmp_path / "allowed.txt"
    allow.write_text("good.example.com\nexample.com/wiki\n")
    checker = url_filter(
        tmp_path,
        blocklists=[UrlList(path=str(blocklist))],
        allowlists=[UrlList(path=str(allow))],
        banned_words=[words_file(tmp_path, "banned.txt", ["porn"])],
    )
    assert checker.check("https://example.com/")[0] == "url.domain:blocked"
    assert checker.check("https://x.good.example.com/porn") is None
    assert checker.check("https://example.com/wiki/Porn_studies") is None
    assert checker.check("https://example.com/wikis")[0] == "url.domain:blocked"


def test_banned_soft_banned_and_subwords(tmp_path):
    checker = url_filter(
        tmp_path,
        banned_words=[words_file(tmp_path, "banned.txt", ["porn", "# a comment"])],
        soft_banned_words=[words_file(tmp_path, "soft.txt", ["sex", "hot", "girls", "cam"])],
        soft_banned_threshold=2,
        banned_subwords=[words_file(tmp_path, "subwords.txt", ["xvideo"])],
    )
    assert checker.check("https://site.example/free-PORN-here")[0] == "url.banned_word"
    assert checker.check("https://site.example/pornography") is None  # a word, not a substring
    assert checker.check("https://site.example/hot-news") is None  # one soft word
    assert checker.check("https://site.example/hot-news/hot") is None  # distinct words are counted
    rule, reason = checker.check("https://site.example/hot/girls/cam")
    assert rule == "url.soft_banned_words" and "3 (cam, girls, hot) >= 2" in reason
    assert checker.check("https://x-video.example/")[0] == "url.banned_subword"  # letters and digits only


def test_nothing_named_means_no_filter():
    assert UrlFilter.from_config(UrlFilterConfig()) is None


def test_a_blocked_page_is_never_read_from_its_warc(tmp_path):
    blocklist = tmp_path / "adult.txt"
    blocklist.write_text("porn.example\n")
    shared = SimpleNamespace(value=url_filter(tmp_path, blocklists=[UrlList(path=str(blocklist))]))
    pages = pa.RecordBatch.from_pylist(
        [
            {
                "id": "a",
                "url": "https://porn.example/x",
                "domain": "porn.example",
                "fetch_time": datetime(2026, 1, 1, tzinfo=UTC),
                "warc_file": "missing.warc.gz",
                "warc_offset": 0,
                "content_type": "text/html",
            }
        ]
    )
    (row,) = next(extract_batches(iter([pages]), str(tmp_path), shared)).to_pylist()
    assert row["text"] is None and row["drop_reason"].startswith("url.domain:adult: porn.example")


@pytest.mark.slow
def test_the_clean_stage_drops_and_counts_blocked_urls_of_an_ingest(tmp_path):
    from pipeline.clean import job

    blocklist = tmp_path / "adult.txt"
    blocklist.write_text("porn.example\n")
    text = " ".join(["The river runs past the old mill and the children play by the water in summer."] * 12)
    rows = [
        {
            "id": f"{i:04d}",
            "url": url,
            "domain": None,
            "fetch_time": None,
            "text": text,
            "drop_reason": None,
            "charset": None,
            "charset_fix": None,
        }
        for i, url in enumerate(
            [
                "https://porn.example/a",
                "https://www.porn.example/b",
                "https://fine.example/c",
                "https://hot.example/hot/cam",
            ]
        )
    ]
    config = make_config(
        tmp_path / "data",
        f"clean.url_filter.blocklists=[{{path: {blocklist}}}]",
        f"clean.url_filter.soft_banned_words=[{words_file(tmp_path, 'soft.txt', ['hot', 'cam'])}]",
        "clean.pii.enabled=false",
    )
    ingest = DatasetRef.of(config, "ingest", "u1")
    with StageOutput(ingest, config, []) as out:
        (out.path / "documents").mkdir()
        pq.write_table(
            pa.Table.from_pylist(rows, schema=EXTRACTED_SCHEMA), out.path / "documents" / "part-00000.parquet"
        )
        out.commit(rows={"documents": 4})
    manifest = job.run(config, [ingest], DatasetRef.of(config, "clean", "u1"))
    assert manifest.counters["dropped"]["url.domain:adult"] == 2
    assert manifest.counters["dropped"]["url.soft_banned_words"] == 1
    assert manifest.extra["url_filter"]["blocklists"] == {"adult": 1}
    excluded = pq.read_table(DatasetRef.of(config, "clean", "u1").path / "excluded").to_pylist()
    assert sorted(r["drop_rule"] for r in excluded if r["drop_rule"].startswith("url.")) == [
        "url.domain:adult",
        "url.domain:adult",
        "url.soft_banned_words",
    ]
    assert {
        r["url"] for r in pq.read_table(DatasetRef.of(config, "clean", "u1").path / "documents").to_pylist()
    } <= {"https://fine.example/c"}
