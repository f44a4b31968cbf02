"""WARC records and the journal: readable with warcio, matching the index, and consistent after a kill."""

import json
import random
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from warcio.archiveiterator import ArchiveIterator

from pipeline.crawl.journal import CorruptJournalError, Entry, Journal, read_journal, recover
from pipeline.crawl.warc import Exchange, WarcStore


def random_exchange(rng: random.Random, number: int) -> Exchange:
    size = rng.choice([0, 17, 900, 5000])
    body = bytes(rng.getrandbits(8) for _ in range(size))
    return Exchange(
        url=f"http://example.com/page/{number}?q={rng.randint(0, 99)}",
        status=rng.choice([200, 200, 404, 500]),
        headers=[("Content-Type", "text/html; charset=utf-8"), ("Content-Encoding", "gzip"), ("Server", "t")],
        body=body,
        fetched_at=datetime(2026, 11, 29, 12, 0, number % 60, tzinfo=UTC),
        request_headers=[("User-Agent", "pretrain-pipeline-test"), ("Accept", "text/html")],
        ip_address="127.0.0.1",
    )


def store_exchange(journal: Journal, store: WarcStore, exchange: Exchange, key: str) -> dict:
    location = store.write(exchange)
    row = {
        "url": exchange.url,
        "status": exchange.status,
        "content_length": len(exchange.body),
        "warc_file": location.warc_file,
        "warc_offset": location.offset,
        "warc_length": location.length,
    }
    journal.done(key, "page", row, (location.warc_file, location.end))
    return row


def response_records(output: Path) -> list:
    """Every response record of every WARC file, read front to back (fails on a torn record)."""
    records = []
    for path in sorted((output / "warc").glob("*.warc.gz")):
        with open(path, "rb") as handle:
            for record in ArchiveIterator(handle, check_digests=True):
                if record.rec_type == "response":
                    records.append(
                        (record.rec_headers.get_header("WARC-Target-URI"), record.content_stream().read())
                    )
    return records


def test_records_read_back_and_match_the_index(tmp_path):
    rng = random.Random(7)
    journal, store = (
        Journal(tmp_path / "_job"),
        WarcStore(tmp_path, "shard-00000-of-00001", 1, max_bytes=8000),
    )
    exchanges = [random_exchange(rng, n) for n in range(25)]
    rows = [store_exchange(journal, store, exchange, f"k{n}") for n, exchange in enumerate(exchanges)]
    store.close()
    journal.close()
    assert len({row["warc_file"] for row in rows}) > 1, "files rotate past max_bytes"

    for row, exchange in zip(rows, exchanges, strict=True):
        with open(tmp_path / row["warc_file"], "rb") as handle:
            handle.seek(row["warc_offset"])
            records = iter(ArchiveIterator(handle, check_digests=True))
            response = next(records)
            assert response.rec_type == "response"
            assert response.rec_headers.get_header("WARC-Target-URI") == exchange.url
            assert response.rec_headers.get_header("WARC-IP-Address") == "127.0.0.1"
            assert int(response.http_headers.get_statuscode()) == row["status"]
            assert response.http_headers.get_header("Content-Length") == str(len(exchange.body))
            assert response.http_headers.get_header("Content-Encoding") is None, "the stored body is decoded"
            assert response.http_headers.get_header("X-Crawler-Content-Encoding") == "gzip"
            assert response.content_stream().read() == exchange.body
            request = next(records)
            assert request.rec_type == "request"
            assert request.rec_headers.get_header("WARC-Concurrent-To") == response.rec_headers.get_header(
                "WARC-Record-ID"
            )
            assert request.http_headers.get_header("Host") == "example.com"
            request_line = f"{request.http_headers.protocol} {request.http_headers.statusline}"
            assert request_line == f"GET {exchange.url.split('example.com', 1)[1]} HTTP/1.1"
            assert response.rec_headers.get_header("WARC-Date") == exchange.fetched_at.strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            )
    assert response_records(tmp_path) == [(exchange.url, exchange.body) for exchange in exchanges]
    state = read_journal(tmp_path / "_job")
    assert state.rows() == rows


@settings(deadline=None, max_examples=60)
@given(
    st.integers(0, 12), st.sampled_from(["during_warc", "between", "during_journal"]), st.integers(0, 2**32)
)
def test_a_kill_at_any_point_recovers_to_the_last_journaled_record(killed_at, moment, seed):
    """Write records, kill mid-way (simulated by cutting the files where a SIGKILL could leave them),
    recover, finish in a second attempt: every record is stored exactly once and every file reads cleanly."""
    rng = random.Random(seed)
    total = 12
    exchanges = [random_exchange(rng, n) for n in range(total)]
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder)
        job = output / "_job"
        journal, store = Journal(job), WarcStore(output, "s", 1, max_bytes=rng.choice([3000, 10**9]))
        journal.attempt(1)
        for n in range(total):
            journal.enqueue(Entry(f"k{n}", exchanges[n].url, 0))
        for n in range(min(killed_at, total)):
            store_exchange(journal, store, exchanges[n], f"k{n}")
        if killed_at < total:
            file_before = store.sequence
            before = store.handle.tell() if store.handle is not None else 0
            location = store.write(exchanges[killed_at])
            if moment == "during_warc":  # a new file may have been opened for it: cut anywhere in that one
                start = before if store.sequence == file_before else 0
                store.handle.truncate(rng.randint(start, location.end - 1))
            elif moment == "during_journal":
                line = json.dumps({"e": "done", "k": f"k{killed_at}", "kind": "page", "row": {}, "end": None})
                journal.handle.write(line[: rng.randint(1, len(line) - 1)])
        store.handle.close()
        journal.handle.close()

        state = recover(job, output)
        survived = min(killed_at, total)
        assert sorted(state.done) == sorted(f"k{n}" for n in range(survived))
        assert [entry.key for entry in state.pending()] == [f"k{n}" for n in range(survived, total)]
        assert response_records(output) == [(e.url, e.body) for e in exchanges[:survived]]
        assert (job / "journal.jsonl").read_bytes().endswith(b"\n")

        journal, store = Journal(job), WarcStore(output, "s", 2, max_bytes=10**9)
        for entry in state.pending():
            store_exchange(journal, store, exchanges[int(entry.key[1:])], entry.key)
        store.close()
        journal.close()
        final = read_journal(job)
        assert len(final.done) == total
        assert sorted(response_records(output)) == sorted((e.url, e.body) for e in exchanges)
        for row in final.rows():
            with open(output / row["warc_file"], "rb") as handle:
                handle.seek(row["warc_offset"])
                assert (
                    next(iter(ArchiveIterator(handle))).rec_headers.get_header("WARC-Target-URI")
                    == row["url"]
                )


def test_a_corrupt_line_before_the_end_is_an_error_not_a_guess(tmp_path):
    journal = Journal(tmp_path)
    journal.enqueue(Entry("a", "http://a/", 0))
    journal.handle.write("{not json\n")
    journal.enqueue(Entry("b", "http://b/", 0))
    journal.close()
    with pytest.raises(CorruptJournalError, match=r"journal\.jsonl:2"):
        read_journal(tmp_path)


def test_a_warc_file_shorter_than_the_journal_says_is_an_error(tmp_path):
    journal, store = Journal(tmp_path / "_job"), WarcStore(tmp_path, "s", 1, max_bytes=10**9)
    row = store_exchange(journal, store, random_exchange(random.Random(1), 1), "k1")
    store.close()
    journal.close()
    with open(tmp_path / row["warc_file"], "r+b") as handle:
        handle.truncate(row["warc_offset"] + 5)
    with pytest.raises(CorruptJournalError, match="journal says"):
        recover(tmp_path / "_job", tmp_path)
