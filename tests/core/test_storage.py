import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from pipeline.core import storage
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


# --- what a reader sees while a snapshot is republished ------------------------------------------------


class StepReader:
    """A reader in its own thread that looks at the output after each filesystem step of a publish.

    The writer hands over after every rename or swap and waits until the reader has looked, so the reader
    sees each intermediate state, however short it is in a real run.
    """

    def __init__(self, ref: DatasetRef) -> None:
        self.ref = ref
        self.seen: list[object] = []  # per step: the data.bin payload the manifest vouches for, or the error
        self._step = threading.Event()
        self._looked = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, name="step-reader", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._step.wait()
            self._step.clear()
            if self._done:
                self._looked.set()
                return
            self.seen.append(self._look())
            self._looked.set()

    def _look(self) -> object:
        try:
            manifest = self.ref.manifest()  # require(): _SUCCESS and manifest.json, then the manifest itself
            payload = (self.ref.path / "data.bin").read_bytes()
            assert manifest.extra["payload"] == payload.decode(), "a manifest with another output's data"
            return payload
        except Exception as exc:  # what a reader would have hit
            return exc

    def after_step(self) -> None:
        self._looked.clear()
        self._step.set()
        self._looked.wait()

    def close(self) -> None:
        self._done = True
        self.after_step()
        self._thread.join()


def _publish_payload(ref: DatasetRef, config, payload: bytes, resumable: bool = False) -> None:
    with StageOutput(ref, config, resumable=resumable) as out:
        _write(out, "data.bin", payload)
        out.commit(extra={"payload": payload.decode()})


def _watch_every_step(monkeypatch, reader: StepReader) -> None:
    real_replace, real_swap = os.replace, storage.swap_folders

    def replace(src, dst):
        real_replace(src, dst)
        reader.after_step()

    def swap(a, b):
        swapped = real_swap(a, b)
        reader.after_step()
        return swapped

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(storage, "swap_folders", swap)


def _can_swap(folder: Path) -> bool:
    a, b = folder / "swap-probe-a", folder / "swap-probe-b"
    a.mkdir(parents=True)
    b.mkdir()
    try:
        return storage.swap_folders(a, b)
    finally:
        shutil.rmtree(a)
        shutil.rmtree(b)


@pytest.mark.parametrize("resumable", [False, True])
def test_a_reader_finds_a_complete_output_at_every_step_of_a_republish(config, monkeypatch, resumable):
    ref = DatasetRef.of(config, "clean", "snap")
    _publish_payload(ref, config, b"old", resumable)
    if not _can_swap(ref.path.parent):
        pytest.skip("this filesystem cannot exchange two folders; publish falls back to two renames")
    reader = StepReader(ref)
    with monkeypatch.context() as patch:
        _watch_every_step(patch, reader)
        _publish_payload(ref, config, b"new", resumable)
    reader.close()

    assert reader.seen, "the publish took no step the reader could watch"
    assert all(isinstance(seen, bytes) for seen in reader.seen), reader.seen
    assert reader.seen[0] == b"old" and reader.seen[-1] == b"new"
    assert (ref.path / "data.bin").read_bytes() == b"new"
    assert sorted(p.name for p in ref.path.parent.iterdir()) == [".lock-snap", "snap"], (
        "no old output or staging left"
    )


def test_without_an_atomic_swap_the_output_is_briefly_absent_never_partial(config, monkeypatch):
    ref = DatasetRef.of(config, "clean", "snap")
    _publish_payload(ref, config, b"old")
    reader = StepReader(ref)
    with monkeypatch.context() as patch:
        _watch_every_step(patch, reader)
        patch.setattr(storage, "_renameat2", lambda: None)  # as on a system without renameat2
        _publish_payload(ref, config, b"new")
    reader.close()

    assert any(isinstance(seen, MissingInputError) for seen in reader.seen), reader.seen
    assert all(isinstance(seen, (bytes, MissingInputError)) for seen in reader.seen), reader.seen
    assert reader.seen[-1] == b"new"
    assert sorted(p.name for p in ref.path.parent.iterdir()) == [".lock-snap", "snap"]


def test_killed_right_after_the_swap_leaves_nothing_a_resumed_run_would_pick_up(config, monkeypatch):
    ref = DatasetRef.of(config, "train", "snap")
    _publish_payload(ref, config, b"old", resumable=True)
    real_swap = storage.swap_folders

    def swap_then_die(a, b):
        if not real_swap(a, b):
            pytest.skip("this filesystem cannot exchange two folders")
        raise KeyboardInterrupt  # SIGKILL's stand-in: nothing after the swap runs

    with monkeypatch.context() as patch:
        patch.setattr(storage, "swap_folders", swap_then_die)
        with pytest.raises(KeyboardInterrupt):
            _publish_payload(ref, config, b"new", resumable=True)

    assert (ref.path / "data.bin").read_bytes() == b"new" and ref.is_complete()
    resume_folder = StageOutput(ref, config, resumable=True).path
    assert not resume_folder.exists(), "the old output sits where the next training attempt resumes from"
    (leftover,) = ref.path.parent.glob(".staging-snap@swap-*")
    assert (leftover / "data.bin").read_bytes() == b"old"
    _publish_payload(ref, config, b"newer", resumable=True)  # the next publish clears it
    assert sorted(p.name for p in ref.path.parent.iterdir()) == [".lock-snap", "snap"]
