"""The ingest stage end to end: every source type through ingest, clean, dedup and tokenize into token
shards; hostile records quarantined with their reasons and counted; a rerun re-reads the same files."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.clean import job as clean_job
from pipeline.cli import main
from pipeline.core.manifest import sha256_file
from pipeline.core.storage import DatasetRef, StageFailure
from pipeline.dedup import job as dedup_job
from pipeline.documents.extract import EXTRACTED_SCHEMA
from pipeline.ingest import job as ingest_job
from pipeline.ingest.sources import HF_DATASET_METADATA
from pipeline.tokenization import job as tokenize_job
from tests.conftest import make_config
from tests.ingest.sources import MAX_RECORD_BYTES, write_all
from tests.ingest.test_readers import expected_ids

pytestmark = pytest.mark.slow
SNAPSHOT = "files1"


def overrides(root) -> list[str]:
    return [
        f"project.data_root={root}",
        "logging.console=false",
        "spark.master=local[2]",
        "spark.shuffle_partitions=4",
        "ingest.id_column=doc_id",
        "ingest.metadata_columns=[lang_hint]",
        f"ingest.max_record_bytes={MAX_RECORD_BYTES}",
    ]


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("ingest")
    sources = base / "sources"
    expected = write_all(sources)
    # A link in the corpus folder to a file outside it: refused (ingest.follow_symlinks=false), and counted.
    outside = base / "outside.jsonl"
    outside.write_text(
        json.dumps({"text": "a document from outside the source folder", "doc_id": "outside-1"})
    )
    (sources / "linked.jsonl").symlink_to(outside)
    root = base / "data"
    argv = ["ingest", "--snapshot", SNAPSHOT, "--source", str(sources / "*.gz"), "--source", str(sources)]
    for override in overrides(root):
        argv += ["--set", override]
    assert main(argv) == 0
    config = make_config(root, *overrides(root)[1:])
    ref = lambda stage: DatasetRef.of(config, stage, SNAPSHOT)  # noqa: E731
    clean_job.run(config, [ref("ingest")], ref("clean"))
    dedup_job.run(config, [ref("clean")], ref("dedup"))
    tokenize_job.run(config, [ref("dedup")], ref("tokenize"))
    return config, sources, expected, ref


def table(ref: DatasetRef, name: str):
    return pq.read_table(ref.path / name)


def test_ingest_writes_documents_in_the_clean_input_contract(pipeline_run):
    _, _, expected, ref = pipeline_run
    documents = table(ref("ingest"), "documents")
    for field in EXTRACTED_SCHEMA:
        assert documents.schema.field(field.name).type == field.type, field.name
    by_format: dict[str, set] = {}
    for row in documents.to_pylist():
        by_format.setdefault(row["format"], set()).add(row["id"])
        assert row["drop_reason"] is None and row["text"]
    assert by_format == {fmt: expected_ids(expected[fmt]) for fmt in expected}


def test_hostile_records_are_quarantined_with_reasons_and_the_counts_add_up(pipeline_run):
    _, _, expected, ref = pipeline_run
    manifest = ref("ingest").manifest()
    counters = manifest.counters
    excluded = table(ref("ingest"), "excluded").to_pylist()
    assert counters["records"] == counters["documents"] + counters["excluded"]
    assert manifest.rows == {"documents": counters["documents"], "excluded": len(excluded)}
    assert sum(counters["excluded_by_reason"].values()) == len(excluded)
    for fmt, part in counters["by_format"].items():
        assert part["records"] == part["documents"] + sum(part["excluded"].values()), fmt
        assert set(part["excluded"]) == expected[fmt]["excluded"], fmt
        if "records" in expected[fmt]:
            assert part["records"] == expected[fmt]["records"], fmt
    assert all(row["drop_reason"] and row["id"] for row in excluded)
    assert counters["skipped"]["warc.request"] == counters["skipped"]["warc.metadata"] + 1  # the cut one
    assert counters["source_files"] == len(manifest.extra["sources"]) == 14


def test_the_manifest_names_every_source_file_with_size_and_checksum(pipeline_run):
    _, sources, _, ref = pipeline_run
    listed = {entry["path"]: entry for entry in ref("ingest").manifest().extra["sources"]}
    files = {path for path in sources.rglob("*") if path.is_file() and not path.is_symlink()}
    assert set(listed) == {str(path) for path in files if path.name not in HF_DATASET_METADATA}
    for path, entry in listed.items():
        assert entry["sha256"] == sha256_file(path) and entry["bytes"] == Path(path).stat().st_size


def test_a_link_out_of_the_source_folder_is_refused_counted_and_named(pipeline_run):
    _, sources, _, ref = pipeline_run
    manifest = ref("ingest").manifest()
    assert manifest.counters["refused_symlinks"] == 1
    assert manifest.extra["refused_symlinks"] == [
        {"link": str(sources / "linked.jsonl"), "target": str((sources / "linked.jsonl").resolve())}
    ]
    ids = table(ref("ingest"), "documents").column("id").to_pylist()
    assert "outside-1" not in ids and len(ids) == manifest.counters["documents"]


def test_every_source_type_reaches_the_token_shards(pipeline_run):
    _, _, expected, ref = pipeline_run
    clean = ref("clean").manifest()
    assert clean.inputs[0]["stage"] == "ingest"
    assert clean.counters["input_pages"] == ref("ingest").manifest().counters["documents"]
    formats = {row["id"]: row["format"] for row in table(ref("ingest"), "documents").to_pylist()}
    kept = table(ref("dedup"), "documents").column("id").to_pylist()
    assert {formats[doc_id] for doc_id in kept} == set(expected), clean.counters["dropped"]
    tokens = ref("tokenize").manifest().rows
    assert tokens["train_documents"] + tokens["validation_documents"] == len(kept)


def test_a_jsonl_file_split_across_tasks_gives_the_same_bytes(pipeline_run):
    """ingest.split_bytes: the uncompressed JSONL file is read by one task per piece (5 pieces of an odd
    size, so they end inside records), with the same records, numbers and output bytes as one task per file.
    Checksummed in a Spark job here (driver_checksum_bytes=0), in the driver by the module's run: the
    same sizes and sha256."""
    config, sources, _, ref = pipeline_run
    jsonl = sources / "with_ids.jsonl"
    piece = jsonl.stat().st_size // 5 + 1
    listed = json.dumps([str(sources / "*.gz"), str(sources)])
    split = make_config(config.project.data_root, *overrides(config.project.data_root)[1:],
                        f"ingest.sources={listed}", f"ingest.split_bytes={piece}",
                        "ingest.driver_checksum_bytes=0")  # fmt: skip
    manifest = ingest_job.run(split, [], DatasetRef.of(split, "ingest", "split"))
    tasks = {Path(entry["path"]).name: entry["tasks"] for entry in manifest.extra["sources"]}
    assert tasks["with_ids.jsonl"] == -(-jsonl.stat().st_size // piece) > 1
    assert tasks["no_ids.jsonl.gz"] == 1  # a gzip stream is not split
    assert manifest.counters == ref("ingest").manifest().counters
    checksummed = lambda m: {e["path"]: (e["bytes"], e["sha256"]) for e in m.extra["sources"]}  # noqa: E731
    assert checksummed(manifest) == checksummed(ref("ingest").manifest())
    assert {k: v.sha256 for k, v in manifest.files.items()} == {
        k: v.sha256 for k, v in ref("ingest").manifest().files.items()
    }


def test_a_rerun_without_sources_re_reads_the_same_files_into_the_same_bytes(pipeline_run):
    config, sources, _, ref = pipeline_run
    before = ref("ingest").manifest()
    again = ingest_job.run(config, [], ref("ingest"))
    assert again.extra["replayed"] and again.extra["sources"] == before.extra["sources"]
    assert {k: v.sha256 for k, v in again.files.items()} == {k: v.sha256 for k, v in before.files.items()}
    changed = sources / "with_ids.jsonl"
    changed.write_bytes(changed.read_bytes() + json.dumps({"text": "new"}).encode() + b"\n")
    with pytest.raises(StageFailure, match=r"with_ids\.jsonl changed or is gone"):
        ingest_job.run(config, [], ref("ingest"))
    assert ref("ingest").manifest().digest == again.digest  # the published output is untouched
