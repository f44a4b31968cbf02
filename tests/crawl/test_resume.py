"""A crawl SIGKILLed mid-way resumes on rerun: nothing it stored is fetched again, nothing is lost or doubled."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator

from pipeline.core.manifest import Manifest
from tests.crawl.support import LOCAL_CRAWL, path_of, read_index
from tests.crawl.testsite import TestSite

pytestmark = pytest.mark.slow


def wait_for(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def stored_urls(job: Path) -> list[str]:
    lines = (job / "journal.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines if line.endswith("}")]
    return [event["row"]["url"] for event in events if event["e"] == "done" and event["row"]["warc_file"]]


def test_killed_crawl_resumes_without_refetching_what_it_stored(tmp_path):
    with TestSite(pages=40, bad_cases=False, seed=3, gate_after=8) as site:
        command = [
            sys.executable,
            "-m",
            "pipeline.crawl",
            "--snapshot",
            "r",
            "--set",
            f"project.data_root={tmp_path}",
        ]
        for override in (f"crawl.seeds=[{site.url('/index.html')}]", "logging.console=false", *LOCAL_CRAWL):
            command += ["--set", override]
        job = tmp_path / "sample" / "crawl" / ".staging-r@resume" / "_job"

        def start() -> subprocess.Popen:
            return subprocess.Popen(
                command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )

        # 1: pages beyond the 8th hang at the server; SIGKILL the crawler's process group, then the stage's.
        stage = start()
        wait_for(
            lambda: job.joinpath("journal.jsonl").exists() and len(stored_urls(job)) >= 9, "9 stored pages"
        )
        wait_for(lambda: site.in_flight > 0, "a request held at the server")
        crawler = int((job / "lock").read_text())
        os.killpg(crawler, signal.SIGKILL)
        os.killpg(stage.pid, signal.SIGKILL)
        stage.wait()
        wait_for(lambda: not alive(crawler), "the crawler to die")
        first, hits_at_first_kill = stored_urls(job), dict(site.hits)
        site.release()

        # 2: kill only the stage's group: its crawler child must not live on as an orphan still writing.
        site.hold_after(site.page_hits() + 8)
        stage = start()
        wait_for(lambda: len(stored_urls(job)) >= len(first) + 8, "8 more stored pages")
        crawler = int((job / "lock").read_text())
        os.killpg(stage.pid, signal.SIGKILL)
        stage.wait()
        wait_for(lambda: not alive(crawler), "the orphaned crawler to die with its parent", timeout=30)
        second, hits_at_second_kill = stored_urls(job), dict(site.hits)
        site.release()
        site.gate_after = None

        # 3: run to the end.
        finished = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert finished.returncode == 0, finished.stderr[-3000:]

    output = tmp_path / "sample" / "crawl" / "r"
    rows = read_index(output)
    assert len(first) >= 9 and len(second) >= len(first) + 8
    for stored, hits_then in ((first, hits_at_first_kill), (second, hits_at_second_kill)):
        for url in stored:
            assert site.hits[path_of(url)] == hits_then[path_of(url)], f"{url} was stored, then fetched again"
    assert max(site.hits.values()) <= 3, "at most the two requests a kill interrupted, then the one stored"
    assert sorted(path_of(row["url"]) for row in rows) == sorted([*site.page_paths(), "/index.html"])
    assert all(row["status"] == 200 for row in rows)
    in_warc = []
    for path in sorted((output / "warc").glob("*.warc.gz")):
        with open(path, "rb") as handle:
            in_warc += [
                r.rec_headers["WARC-Target-URI"] for r in ArchiveIterator(handle) if r.rec_type == "response"
            ]
    assert sorted(in_warc) == sorted(row["url"] for row in rows), (
        "each page stored once, no torn or stray record"
    )
    manifest = Manifest.read(output / "manifest.json")
    assert manifest.counters["attempts"] == 3
    assert not job.parent.exists(), "the staging folder was published"
