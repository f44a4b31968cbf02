"""Two crawls of one snapshot at once: the second fails at once naming the first, which publishes whole.

It used to slip into the gap where the stage handed its lock to the crawler child, recreate `_job/` and
delete the first crawl's WARC files, which then published an index pointing at missing files.
"""

import subprocess
import sys
import time

import pytest

from pipeline.core.manifest import Manifest
from tests.crawl.support import LOCAL_CRAWL, read_index
from tests.crawl.testsite import TestSite

pytestmark = pytest.mark.slow


def wait_while_running(process: subprocess.Popen, condition, what: str) -> None:
    """Wait for a signal from the running stage (no deadline: a loaded machine is slow, not wrong)."""
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"the crawl ended (exit {process.returncode}) before {what}")
        time.sleep(0.05)


def test_a_second_crawl_of_the_same_snapshot_is_refused_and_the_first_publishes_whole(tmp_path):
    with TestSite(pages=20, bad_cases=False, seed=5, gate_after=6) as site:
        command = [sys.executable, "-m", "pipeline.cli", "crawl", "--snapshot", "twice"]
        for override in (
            f"project.data_root={tmp_path}",
            f"crawl.seeds=[{site.url('/index.html')}]",
            "logging.console=false",
            *LOCAL_CRAWL,
        ):
            command += ["--set", override]
        first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Pages past the 6th wait at the server: the first crawl is now mid-way, its crawler child writing.
        wait_while_running(first, lambda: site.in_flight > 0, "a request was held at the server")
        second = subprocess.run(command, capture_output=True, text=True)
        site.release()
        stdout, stderr = first.communicate()
    assert second.returncode == 2, second.stderr
    assert f"being written by another run (pid {first.pid}" in second.stderr
    assert "Traceback" not in second.stderr
    assert first.returncode == 0, stderr

    published = tmp_path / "sample" / "crawl" / "twice"
    assert stdout.strip().splitlines()[-1] == str(published)
    manifest = Manifest.read(published / "manifest.json")
    rows = read_index(published)
    stored = {row["warc_file"] for row in rows if row["warc_file"]}
    assert stored and all((published / name).is_file() for name in stored), stored
    assert manifest.rows["pages"] == len([row for row in rows if row["warc_file"]]) >= 20
    assert not (published / "_job").exists()
