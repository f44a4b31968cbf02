import hashlib
import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.data.shards import (
    INDEX_MAGIC,
    RollingShardWriter,
    Shard,
    ShardFormatError,
    ShardWriter,
    read_index,
    shard_prefixes,
    token_dtype,
    write_index,
)


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


def test_int32_shards_use_megatron_code_4(tmp_path):
    ids = [70_000, 1, 2**31 - 1]
    with ShardWriter(tmp_path / "s", np.dtype(np.int32)) as writer:
        writer.add_document(ids)
    raw = (tmp_path / "s.idx").read_bytes()
    assert raw[17] == 4
    assert Shard(tmp_path / "s").document(0).tolist() == ids
    assert np.frombuffer((tmp_path / "s.bin").read_bytes(), "<i4").tolist() == ids


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=8), min_size=1, max_size=6),
    st.integers(1, 40),
)
def test_rolling_writer_caps_shards_and_keeps_every_document_in_order(tmp_path_factory, batches, cap):
    """Batches of document lengths; each shard holds at most cap tokens unless it is one oversized document."""
    folder = tmp_path_factory.mktemp("roll")
    rng = np.random.default_rng(len(batches) * 100 + cap)
    writer = RollingShardWriter(folder, "shard-00003", np.dtype(np.uint16), max_tokens=cap)
    expected = []
    for lengths in batches:
        documents = [rng.integers(0, 60_000, size=length * 3).tolist() for length in lengths]
        expected += documents
        writer.add_documents(np.concatenate(documents), np.array([len(d) for d in documents]))
    files = writer.close()
    assert [p.name for p in shard_prefixes(folder)] == [f.name for f in files]
    assert [f.name for f in files] == [f"shard-00003-{i:04d}" for i in range(len(files))]
    read_back = []
    for file in files:
        shard = Shard(folder / file.name)
        documents = [shard.document(i).tolist() for i in range(len(shard))]
        read_back += documents
        assert file.tokens == shard.num_tokens and file.documents == len(documents) >= 1
        assert file.tokens <= cap or (len(documents) == 1 and file.oversized_documents == 1)
        assert file.bin_sha256 == hashlib.sha256((folder / f"{file.name}.bin").read_bytes()).hexdigest()
        assert file.idx_sha256 == hashlib.sha256((folder / f"{file.name}.idx").read_bytes()).hexdigest()
    assert read_back == expected
    assert sum(f.oversized_documents for f in files) == sum(len(d) > cap for d in expected)
    assert not [p for p in folder.iterdir() if ".tmp" in p.name]


def test_aborted_writer_leaves_nothing_and_partial_files_are_never_visible(tmp_path):
    writer = ShardWriter(tmp_path / "s", np.dtype(np.uint16), temp_suffix=".tmp-7")
    writer.add_document([1, 2, 3])
    assert shard_prefixes(tmp_path) == [] and not (tmp_path / "s.bin").exists()
    writer.abort()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError), ShardWriter(tmp_path / "t", np.dtype(np.uint16)) as failing:
        failing.add_document([4])
        raise RuntimeError("task killed")
    assert list(tmp_path.iterdir()) == []


def test_inconsistent_shards_are_rejected_with_the_reason(tmp_path):
    with ShardWriter(tmp_path / "s", np.dtype(np.uint16)) as writer:
        writer.add_document([1, 2, 3])
        writer.add_document([4, 5])
    index = (tmp_path / "s.idx").read_bytes()
    (tmp_path / "s.idx").write_bytes(index[:-8])
    with pytest.raises(ShardFormatError, match="truncated"):
        Shard(tmp_path / "s")
    (tmp_path / "s.idx").write_bytes(index)
    (tmp_path / "s.bin").write_bytes(b"\x00" * 12)
    with pytest.raises(ShardFormatError, match="describes 5 tokens"):
        Shard(tmp_path / "s")
    (tmp_path / "s.bin").unlink()
    with pytest.raises(ShardFormatError, match="missing"):
        Shard(tmp_path / "s")
    with pytest.raises(ValueError, match="add up to"):
        ShardWriter(tmp_path / "u", np.dtype(np.uint16)).add_documents(np.arange(3), np.array([2]))


def test_documents_made_of_several_megatron_sequences_are_measured_whole(tmp_path):
    """Megatron allows a document to span sequences; document_lengths follows the document indices."""
    write_index(tmp_path / "m.idx", np.dtype(np.uint16), np.array([2, 3, 4], dtype=np.int32))
    raw = bytearray((tmp_path / "m.idx").read_bytes())
    count_offset = 26
    raw[count_offset : count_offset + 8] = struct.pack("<Q", 3)  # documents 0..2: [seq 0, seq 1-2]
    raw = bytes(raw[:-32]) + np.array([0, 1, 3], dtype="<i8").tobytes()
    (tmp_path / "m.idx").write_bytes(raw)
    assert read_index(tmp_path / "m.idx").document_lengths.tolist() == [2, 7]


def test_shard_order_compares_numbers_as_numbers(tmp_path):
    for name in ("shard-00001-0010", "shard-00001-0002", "shard-00000-10000", "shard-00000-9999"):
        write_index(tmp_path / f"{name}.idx", np.dtype(np.uint16), np.zeros(0, dtype=np.int32))
    names = [p.name for p in shard_prefixes(tmp_path)]
    assert names == ["shard-00000-9999", "shard-00000-10000", "shard-00001-0002", "shard-00001-0010"]


@pytest.mark.slow  # megatron.core imports most of its model code: seconds, not milliseconds
@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_megatron_reads_our_shards_and_writes_the_same_bytes(tmp_path, dtype):
    """The published implementation itself: Megatron-LM's IndexedDataset reads our shards, and its
    IndexedDatasetBuilder, given the same documents, writes byte-identical .bin and .idx files."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
    rng = np.random.default_rng(3)
    documents = [rng.integers(0, 60_000, size=rng.integers(1, 50)).astype(dtype) for _ in range(120)]
    with ShardWriter(tmp_path / "ours", np.dtype(dtype)) as writer:
        for document in documents:
            writer.add_document(document)
    dataset = IndexedDataset(str(tmp_path / "ours"))
    assert len(dataset) == len(documents) and dataset.index.dtype == dtype
    assert all(np.array_equal(dataset[i], document) for i, document in enumerate(documents))
    assert dataset.document_indices.tolist() == list(range(len(documents) + 1))

    builder = IndexedDatasetBuilder(str(tmp_path / "megatron.bin"), dtype=dtype)
    for document in documents:
        builder.add_item(torch.from_numpy(document.astype(np.int64)))
        builder.end_document()
    builder.finalize(str(tmp_path / "megatron.idx"))
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"ours{suffix}").read_bytes() == (tmp_path / f"megatron{suffix}").read_bytes()
