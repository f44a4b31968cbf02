import json
from pathlib import Path

import pytest

from pipeline.core.config import ConfigError
from pipeline.core.lineage import Lineage
from pipeline.core.manifest import Manifest, sha256_file
from pipeline.core.storage import DatasetRef, MissingInputError, StageOutput


def _write(out: StageOutput, name: str, payload: bytes) -> None:
    path = out.path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)


def test_commit_publishes_data_manifest_and_success(config):
    ref = DatasetRef.of(config, "clean", "2026-01-02")
    lineage = Lineage(dag_id="d", run_id="r", task_id="t", try_number=2)
    with StageOutput(ref, config, lineage=lineage) as out:
        _write(out, "documents/part-00000.parquet", b"abc")
        assert not ref.path.exists(), "nothing is visible before commit"
        manifest = out.commit(rows={"documents": 1}, counters={"dropped": {"too_short": 2}})
    assert ref.is_complete()
    assert ref.path == Path(config.project.data_root) / "sample" / "clean" / "2026-01-02"
    stored = Manifest.read(ref.path / "manifest.json")
    assert stored.files["documents/part-00000.parquet"].sha256 == sha256_file(
        ref.path / "documents/part-00000.parquet"
    )
    assert stored.config_hash == config.hash
    assert stored.lineage == {"dag_id": "d", "run_id": "r", "task_id": "t", "try_number": 2}
    assert stored.counters == {"dropped": {"too_short": 2}}
    assert stored.digest == manifest.digest
    assert not list(ref.path.parent.glob(".staging-*"))


def test_failure_keeps_previous_output_untouched(config):
    ref = DatasetRef.of(config, "clean", "snap")
    with StageOutput(ref, config) as out:
        _write(out, "data.bin", b"old")
        out.commit()
    with pytest.raises(RuntimeError, match="boom"), StageOutput(ref, config) as out:
        _write(out, "data.bin", b"new-but-broken")
        raise RuntimeError("boom")
    assert (ref.path / "data.bin").read_bytes() == b"old"
    assert not list(ref.path.parent.glob(".staging-*"))


def test_rerun_replaces_output_entirely(config):
    ref = DatasetRef.of(config, "clean", "snap")
    with StageOutput(ref, config) as out:
        _write(out, "a.bin", b"1")
        _write(out, "stale.bin", b"gone after rerun")
        out.commit()
    with StageOutput(ref, config) as out:
        _write(out, "a.bin", b"2")
        out.commit()
    assert sorted(p.name for p in ref.path.iterdir()) == ["_SUCCESS", "a.bin", "manifest.json"]
    assert json.loads((ref.path / "manifest.json").read_text())["files"].keys() == {"a.bin"}


def test_stale_staging_from_a_killed_attempt_is_removed(config):
    ref = DatasetRef.of(config, "clean", "snap")
    stale = ref.path.parent / ".staging-snap@deadbeef"
    stale.mkdir(parents=True)
    (stale / "half.parquet").write_bytes(b"partial")
    other_snapshot = ref.path.parent / ".staging-snap-2@deadbeef"
    other_snapshot.mkdir()
    with StageOutput(ref, config) as out:
        out.commit()
    assert not stale.exists()
    assert other_snapshot.exists(), "another snapshot's staging folder is not ours to delete"


def test_block_without_commit_is_an_error(config):
    ref = DatasetRef.of(config, "clean", "snap")
    with pytest.raises(RuntimeError, match="without commit"), StageOutput(ref, config):
        pass
    assert not ref.path.exists()


def test_missing_input_says_how_to_make_it(config):
    crawl = DatasetRef.of(config, "crawl", "2026-05-05")
    with pytest.raises(MissingInputError, match=r"pretrain crawl --snapshot 2026-05-05"):
        StageOutput(DatasetRef.of(config, "clean", "2026-05-05"), config, inputs=[crawl]).__enter__()


def test_inputs_are_recorded_by_digest(config):
    crawl = DatasetRef.of(config, "crawl", "s")
    with StageOutput(crawl, config) as out:
        _write(out, "warc/x.warc.gz", b"w")
        crawl_manifest = out.commit()
    with StageOutput(DatasetRef.of(config, "clean", "s"), config, inputs=[crawl]) as out:
        manifest = out.commit()
    assert manifest.inputs == [crawl_manifest.input_ref()]
    assert manifest.inputs[0]["digest"] == crawl_manifest.digest


@pytest.mark.parametrize("snapshot", ["", "../escape", "a b", "-leading-dash", "x/y", "nl\n", 20261201])
def test_bad_snapshot_names_are_refused(config, snapshot):
    with pytest.raises(ConfigError, match="snapshot"):
        DatasetRef.of(config, "clean", snapshot)


def test_resumable_staging_survives_failure(config):
    ref = DatasetRef.of(config, "train", "snap")
    with pytest.raises(KeyboardInterrupt), StageOutput(ref, config, resumable=True) as out:
        _write(out, "checkpoints/step-000001.pt", b"ckpt")
        raise KeyboardInterrupt
    with StageOutput(ref, config, resumable=True) as out:
        assert (out.path / "checkpoints/step-000001.pt").read_bytes() == b"ckpt"
        out.commit()
    assert (ref.path / "checkpoints/step-000001.pt").exists()
