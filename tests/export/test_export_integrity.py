"""What leaves the trainer is what gets used: export, evaluate and report check the files they read against the
digests their producers recorded, and refuse a changed one in one line naming it; and the exported folder is
readable by whoever may read the data root (the weights used to be written with mode 0600)."""

from __future__ import annotations

import stat

import pytest

from pipeline.core.storage import DatasetRef

pytestmark = pytest.mark.slow
SNAPSHOT = "integrity"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A short single-process training, exported and evaluated through the stages' entrypoints."""
    from pipeline.core.cli import run_cli
    from pipeline.evaluate.__main__ import main as evaluate_main
    from pipeline.export.__main__ import main as export_main
    from pipeline.train.trainer import train
    from tests.train.support import single_process, train_config, write_config, write_token_corpus

    root = tmp_path_factory.mktemp("integrity")
    config = train_config(root / "data", "train.steps=3", "evaluate.lm_eval=false")
    write_token_corpus(config, SNAPSHOT, documents=120)
    train(single_process(config, root), SNAPSHOT)
    path = write_config(config, root / "config.yaml")
    for main in (export_main, evaluate_main):
        assert run_cli(main, ["--config", str(path), "--snapshot", SNAPSHOT]) == 0
    return config, path


def flip(path, offset_from_end: int = 64, count: int = 64) -> bytes:
    """Change ``count`` bytes near the end of a file (past any header); returns the original bytes."""
    original = path.read_bytes()
    data = bytearray(original)
    for index in range(len(data) - offset_from_end, len(data) - offset_from_end + count):
        data[index] ^= 0x5A
    path.write_bytes(bytes(data))
    return original


def test_every_exported_file_has_the_mode_a_new_file_gets(exported):
    config, _ = exported
    folder = DatasetRef.of(config, "export", SNAPSHOT).path
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in folder.iterdir() if path.is_file()}
    assert modes["model.safetensors"] == modes["README.md"], modes
    assert modes["model.safetensors"] & stat.S_IROTH


@pytest.mark.parametrize("command", ["evaluate", "report"])
def test_changed_exported_weights_are_refused_naming_the_file(exported, command, capsys):
    """64 bytes of model.safetensors changed after export: evaluate used to score the changed model and
    report to register it; both now stop before doing anything, exit 2, one line."""
    import importlib

    from pipeline.core.cli import run_cli

    config, path = exported
    weights = DatasetRef.of(config, "export", SNAPSHOT).path / "model.safetensors"
    output = DatasetRef.of(config, command, SNAPSHOT)
    before = output.manifest().created_at if output.is_complete() else None
    original = flip(weights)
    try:
        main = importlib.import_module(f"pipeline.{command}.__main__").main
        assert run_cli(main, ["--config", str(path), "--snapshot", SNAPSHOT]) == 2
    finally:
        weights.write_bytes(original)
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith(f"error: {weights} does not match the export manifest (sha256 "), lines[-1]
    after = output.manifest().created_at if output.is_complete() else None
    assert after == before  # nothing published from the changed weights


def test_a_changed_checkpoint_is_refused_even_with_a_matching_checksum_file(exported, capsys):
    """The checkpoint and its .sha256 file both rewritten: the train manifest still knows the real digest."""
    from pipeline.core.cli import run_cli
    from pipeline.core.manifest import sha256_file
    from pipeline.export.__main__ import main as export_main
    from pipeline.model.checkpoint import CHECKSUM_SUFFIX

    config, path = exported
    train = DatasetRef.of(config, "train", SNAPSHOT)
    checkpoint = train.path / train.manifest().extra["checkpoint"]
    checksum = checkpoint.with_name(checkpoint.name + CHECKSUM_SUFFIX)
    original, original_checksum = flip(checkpoint, offset_from_end=4096), checksum.read_bytes()
    checksum.write_text(f"{sha256_file(checkpoint)}  {checkpoint.name}\n")
    try:
        assert run_cli(export_main, ["--config", str(path), "--snapshot", SNAPSHOT]) == 2
    finally:
        checkpoint.write_bytes(original)
        checksum.write_bytes(original_checksum)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"error: {checkpoint} does not match the train manifest"), last
