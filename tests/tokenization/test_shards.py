import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.tokenization.shards import INDEX_MAGIC, Shard, ShardWriter, read_index, token_dtype


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(0, 65_535), min_size=0, max_size=50), min_size=0, max_size=20))
def test_documents_read_back_exactly(tmp_path_factory, documents):
    prefix = tmp_path_factory.mktemp("shard") / "shard-00000"
    with ShardWriter(prefix, np.dtype(np.uint16)) as writer:
        for document in documents:
            writer.add_document(document)
    shard = Shard(prefix)
    assert len(shard) == len(documents)
    for i, document in enumerate(documents):
        assert shard.document(i).tolist() == document


def test_index_layout_matches_megatron_format(tmp_path):
    """Parse the bytes by hand, independently of read_index, against Megatron's MMIDIDX spec."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 40, size=7)
    prefix = tmp_path / "s"
    with ShardWriter(prefix, np.dtype(np.uint16)) as writer:
        for length in lengths:
            writer.add_document(rng.integers(0, 60_000, size=length))
    raw = (tmp_path / "s.idx").read_bytes()
    assert raw[:9] == INDEX_MAGIC == b"MMIDIDX\x00\x00"
    assert struct.unpack("<Q", raw[9:17]) == (1,)
    assert raw[17] == 8, "uint16 is dtype code 8"
    count, documents = struct.unpack("<QQ", raw[18:34])
    assert (count, documents) == (7, 8)
    offset = 34
    assert np.frombuffer(raw, np.int32, 7, offset).tolist() == lengths.tolist()
    offset += 28
    pointers = np.frombuffer(raw, np.int64, 7, offset)
    assert pointers.tolist() == (np.concatenate([[0], np.cumsum(lengths)[:-1]]) * 2).tolist()
    offset += 56
    assert np.frombuffer(raw, np.int64, 8, offset).tolist() == list(range(8))
    assert len(raw) == offset + 64
    assert (tmp_path / "s.bin").stat().st_size == 2 * lengths.sum()


def test_large_vocabularies_use_int32():
    assert token_dtype(65_535) == np.uint16
    assert token_dtype(65_536) == np.int32


def test_bad_magic_is_rejected(tmp_path):
    (tmp_path / "x.idx").write_bytes(b"NOTANIDX" + bytes(40))
    with pytest.raises(ValueError, match="MMIDIDX"):
        read_index(tmp_path / "x.idx")
