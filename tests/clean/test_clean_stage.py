import os
import shutil
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from pipeline.clean import job as clean_job
from pipeline.core.manifest import Manifest
from pipeline.core.storage import DatasetRef
from tests.conftest import PROJECT_ROOT, make_config

# Every test here runs the clean stage in Spark, on the crawl of the sample site (sample_corpus).
pytestmark = pytest.mark.slow
ARTICLES = PROJECT_ROOT / "pipeline" / "crawl" / "sample_site" / "articles"


def test_clean_keeps_articles_and_explains_every_drop(sample_corpus):
    config, snapshot = sample_corpus
    clean = DatasetRef.of(config, "clean", snapshot)
    manifest = clean.manifest()
    documents = pq.read_table(clean.path / "documents").to_pylist()
    excluded = pq.read_table(clean.path / "excluded").to_pylist()
    crawl = DatasetRef.of(config, "crawl", snapshot).manifest()

    assert manifest.rows["documents"] == len(documents) >= 10
    assert len(documents) + len(excluded) == crawl.counters["fetched"], "no page disappears silently"
    assert all(row["drop_rule"] and row["drop_reason"] for row in excluded)
    assert sum(manifest.counters["dropped"].values()) == len(excluded)
    assert manifest.counters["kept_by_language"] == {"en": len(documents)}
    # The mirror page is an exact copy: the dedup stage, not clean, removes it.
    urls = {row["url"].split("/", 3)[3] for row in documents}
    assert {"articles/river-mills.html", "mirror/river-mills.html"} <= urls
    english_articles = {f"articles/{p.name}" for p in ARTICLES.glob("*.html")} - {"articles/tea.html"}
    assert english_articles <= urls, "the sample site's English articles pass the FineWeb recipe"
    tea = next(row for row in excluded if row["url"].endswith("articles/tea.html"))
    assert (tea["lang"], tea["drop_rule"]) == ("zh", "language.not_kept")
    river = next(row for row in documents if row["url"].endswith("articles/river-mills.html"))
    assert "a river was the most reliable source of power" in river["text"]
    assert "cookie" not in river["text"].lower(), "boilerplate is not main text"
    assert river["lang"] == "en" and river["lang_score"] > 0.9
    assert river["signals"]["gopher_quality"]["n_non_symbol_words"] > 50
    assert river["signals"]["c4"]["sentences"] >= 5
    assert len({row["id"] for row in documents}) == len(documents)


def _copy_crawl(source_config, snapshot, target_root):
    config = make_config(target_root)
    shutil.copytree(
        DatasetRef.of(source_config, "crawl", snapshot).path, DatasetRef.of(config, "crawl", snapshot).path
    )
    return config


def test_output_bytes_do_not_depend_on_partitioning(sample_corpus, tmp_path):
    config, snapshot = sample_corpus
    reference = DatasetRef.of(config, "clean", snapshot).manifest()
    other = _copy_crawl(config, snapshot, tmp_path / "data")
    other = other.model_copy(update={"spark": other.spark.model_copy(update={"shuffle_partitions": 7})})
    manifest = clean_job.run(
        other, [DatasetRef.of(other, "crawl", snapshot)], DatasetRef.of(other, "clean", snapshot)
    )
    assert {k: v.sha256 for k, v in manifest.files.items()} == {
        k: v.sha256 for k, v in reference.files.items()
    }


def test_killed_run_then_rerun_matches_uninterrupted_run(sample_corpus, tmp_path):
    """SIGKILL the clean stage once it has started writing, rerun it, compare with an uninterrupted run."""
    config, snapshot = sample_corpus
    reference = DatasetRef.of(config, "clean", snapshot).manifest()
    other = _copy_crawl(config, snapshot, tmp_path / "data")
    target = DatasetRef.of(other, "clean", snapshot)
    command = [
        sys.executable,
        "-m",
        "pipeline.clean",
        "--snapshot",
        snapshot,
        "--set",
        f"project.data_root={other.project.data_root}",
        "--set",
        "logging.console=false",
    ]
    process = subprocess.Popen(
        command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    # The signal is the stage's own first file in its staging folder; no deadline, since a loaded machine
    # can take minutes to start Spark (a fixed 120 s wait failed there). A run that ends first fails below.
    staging_files = []
    while process.poll() is None:
        staging_files = [
            p for s in target.path.parent.glob(".staging-*") for p in s.rglob("*") if p.is_file()
        ]
        if staging_files:
            break
        time.sleep(0.02)
    assert staging_files, f"the stage ended (exit {process.returncode}) before it was seen writing"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not target.is_complete(), "a killed run publishes nothing"

    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rerun = Manifest.read(target.path / "manifest.json")
    assert {k: v.sha256 for k, v in rerun.files.items()} == {k: v.sha256 for k, v in reference.files.items()}
    assert not list(target.path.parent.glob(".staging-*")), "the killed attempt's staging folder is gone"


def test_a_second_run_of_a_snapshot_being_written_fails_at_once_and_leaves_the_first_alone(
    sample_corpus, tmp_path
):
    """clean's start-up used to delete every staging folder of the snapshot, another run's included."""
    config, snapshot = sample_corpus
    reference = DatasetRef.of(config, "clean", snapshot).manifest()
    other = _copy_crawl(config, snapshot, tmp_path / "data")
    target = DatasetRef.of(other, "clean", snapshot)
    command = [
        sys.executable,
        "-m",
        "pipeline.cli",
        "clean",
        "--snapshot",
        snapshot,
        "--set",
        f"project.data_root={other.project.data_root}",
        "--set",
        "logging.console=false",
    ]
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while not list(target.path.parent.glob(".staging-*")):  # the first run's own signal: its staging folder
        assert first.poll() is None, "the first run ended before it was seen writing"
        time.sleep(0.02)
    second = subprocess.run(command, capture_output=True, text=True)
    assert second.returncode == 2
    assert f"clean sample/{snapshot} is being written by another run (pid {first.pid}" in second.stderr
    assert list(target.path.parent.glob(".staging-*")), "the first run's staging folder is still there"
    _, stderr = first.communicate()
    assert first.returncode == 0, stderr
    published = Manifest.read(target.path / "manifest.json")
    assert {k: v.sha256 for k, v in published.files.items()} == {
        k: v.sha256 for k, v in reference.files.items()
    }
