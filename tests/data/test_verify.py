"""Token shards are checked against the tokenize manifest before training uses them (pipeline.data.verify)."""

from __future__ import annotations

import hashlib
import logging

import numpy as np
import pytest

from pipeline.core.manifest import DamagedInputError, write_published
from pipeline.data.verify import verify_token_shards
from pipeline.data.shards import ShardFormatError, ShardWriter
from tests.train.support import train_config, write_token_corpus

SNAPSHOT = "verify"


@pytest.fixture
def corpus(tmp_path):
    config = train_config(tmp_path / "data")
    return write_token_corpus(config, SNAPSHOT, documents=120)


def first_bin(ref):
    return sorted((ref.path / "train").glob("*.bin"))[0]


def test_untouched_shards_pass_and_every_file_is_read_once_across_ranks(corpus):
    manifest = corpus.manifest()
    whole = verify_token_shards(corpus, manifest)
    assert whole.files == 6 and whole.max_token_id < manifest.extra["vocab_size"]
    shares = [verify_token_shards(corpus, manifest, rank=r, world_size=2) for r in (0, 1)]
    assert sum(s.files for s in shares) == whole.files and sum(s.bytes for s in shares) == whole.bytes


def test_512_zeroed_bytes_of_a_shard_are_refused_naming_the_file_and_both_digests(corpus):
    """Zeroed bytes are still valid ids: `pretrain train` used to train on them and publish."""
    path = first_bin(corpus)
    expected = corpus.manifest().files[f"train/{path.name}"].sha256
    with open(path, "r+b") as handle:
        handle.seek(64)
        handle.write(bytes(512))
    with pytest.raises(DamagedInputError) as error:
        verify_token_shards(corpus, corpus.manifest())
    message = str(error.value)
    assert str(path) in message and f"expected sha256 {expected}" in message and "found " in message
    assert f"pretrain tokenize --snapshot {SNAPSHOT}" in message and error.value.not_retried


def test_a_token_id_beyond_the_vocabulary_is_refused_with_its_position(tmp_path, corpus):
    """The shard as its producer wrote it (the checksum matches), but an id past the vocabulary: it used to
    fail inside the model with `IndexError: index out of range in self`, after 3 restarts."""
    manifest = corpus.manifest()
    vocab = manifest.extra["vocab_size"]
    path = first_bin(corpus)
    tokens = np.fromfile(path, dtype=np.uint16)
    tokens[10] = vocab + 5
    tokens.tofile(path)
    manifest.files[f"train/{path.name}"].sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    write_published(corpus.path, manifest)
    with pytest.raises(DamagedInputError, match=rf"{path}: token id {vocab + 5} at token 10 is outside"):
        verify_token_shards(corpus, corpus.manifest())


def test_a_shard_not_in_the_manifest_or_missing_from_disk_is_refused(corpus):
    extra = corpus.path / "train" / "shard-99999-0000"
    with ShardWriter(extra, np.dtype(np.uint16)) as writer:
        writer.add_document([1, 2, 3])
    with pytest.raises(DamagedInputError, match="shard-99999-0000.bin is not in the tokenize manifest"):
        verify_token_shards(corpus, corpus.manifest())
    extra.with_suffix(".bin").unlink()
    extra.with_suffix(".idx").unlink()
    first_bin(corpus).unlink()
    with pytest.raises(DamagedInputError, match="is missing"):
        verify_token_shards(corpus, corpus.manifest())


def test_skipping_the_checksums_is_said_loudly(corpus, caplog):
    with open(first_bin(corpus), "r+b") as handle:
        handle.write(bytes(8))
    with caplog.at_level(logging.WARNING, logger="pipeline.data.verify"):
        assert verify_token_shards(corpus, corpus.manifest(), checksums=False) is None
    assert "NOT checked" in caplog.text and "data.verify_shards=false" in caplog.text


def test_a_bad_index_is_a_data_error_no_restart_can_fix():
    from pipeline.train.launcher.failures import is_deterministic

    assert isinstance(ShardFormatError("x"), ValueError) and is_deterministic(ShardFormatError("x"))
    assert is_deterministic(DamagedInputError("x"))
