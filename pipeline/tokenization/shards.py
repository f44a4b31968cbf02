"""Packed token shards in Megatron's indexed-dataset layout (``.bin`` tokens + ``MMIDIDX`` ``.idx``).

``.idx`` layout (little endian), as Megatron-LM's ``IndexedDataset`` reads it:

    9 bytes   magic  b"MMIDIDX\\x00\\x00"
    u64       version = 1
    u8        dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16)
    u64       sequence count N
    u64       document count D (= N + 1 here: one sequence per document)
    i32[N]    sequence lengths, in tokens
    i64[N]    sequence byte offsets into .bin
    i64[D]    document indices: sequence index where each document starts, then N
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
DTYPE_CODES = {
    np.dtype(np.uint8): 1,
    np.dtype(np.int8): 2,
    np.dtype(np.int16): 3,
    np.dtype(np.int32): 4,
    np.dtype(np.int64): 5,
    np.dtype(np.float64): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.uint16): 8,
}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 below 65,536 ids; above that int32, since Megatron's dtype codes have no uint32."""
    return np.dtype(np.uint16) if vocab_size < 65_536 else np.dtype(np.int32)


class ShardWriter:
    """Append documents to ``<prefix>.bin``; ``close()`` writes ``<prefix>.idx``."""

    def __init__(self, prefix: Path, dtype: np.dtype) -> None:
        self.prefix = Path(prefix)
        self.dtype = np.dtype(dtype)
        self.lengths: list[int] = []
        self.tokens = 0
        self._bin = open(self.prefix.with_suffix(".bin"), "wb")  # noqa: SIM115 - closed in close()

    def add_document(self, token_ids) -> None:
        array = np.asarray(token_ids, dtype=self.dtype)
        self._bin.write(array.tobytes(order="C"))
        self.lengths.append(len(array))
        self.tokens += len(array)

    def close(self) -> None:
        self._bin.close()
        write_index(self.prefix.with_suffix(".idx"), self.dtype, np.asarray(self.lengths, dtype=np.int32))

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_index(path: Path, dtype: np.dtype, lengths: np.ndarray) -> None:
    count = len(lengths)
    pointers = np.zeros(count, dtype=np.int64)
    if count:
        pointers[1:] = np.cumsum(lengths[:-1].astype(np.int64)) * np.dtype(dtype).itemsize
    documents = np.arange(count + 1, dtype=np.int64)
    with open(path, "wb") as handle:
        handle.write(INDEX_MAGIC)
        handle.write(struct.pack("<Q", INDEX_VERSION))
        handle.write(struct.pack("<B", DTYPE_CODES[np.dtype(dtype)]))
        handle.write(struct.pack("<Q", count))
        handle.write(struct.pack("<Q", len(documents)))
        handle.write(lengths.astype(np.int32).tobytes(order="C"))
        handle.write(pointers.tobytes(order="C"))
        handle.write(documents.tobytes(order="C"))


@dataclass
class ShardIndex:
    dtype: np.dtype
    lengths: np.ndarray
    pointers: np.ndarray
    documents: np.ndarray


def read_index(path: Path) -> ShardIndex:
    data = Path(path).read_bytes()
    if data[:9] != INDEX_MAGIC:
        raise ValueError(f"{path}: not an MMIDIDX index (bad magic {data[:9]!r})")
    (version,) = struct.unpack_from("<Q", data, 9)
    if version != INDEX_VERSION:
        raise ValueError(f"{path}: unsupported index version {version}")
    (code,) = struct.unpack_from("<B", data, 17)
    count, doc_count = struct.unpack_from("<QQ", data, 18)
    offset = 34
    lengths = np.frombuffer(data, dtype=np.int32, count=count, offset=offset)
    offset += 4 * count
    pointers = np.frombuffer(data, dtype=np.int64, count=count, offset=offset)
    offset += 8 * count
    documents = np.frombuffer(data, dtype=np.int64, count=doc_count, offset=offset)
    return ShardIndex(CODE_DTYPES[code], lengths, pointers, documents)


class Shard:
    """Read-only memmap view of one ``.bin``/``.idx`` pair."""

    def __init__(self, prefix: Path) -> None:
        self.prefix = Path(prefix)
        self.index = read_index(self.prefix.with_suffix(".idx"))
        size = self.prefix.with_suffix(".bin").stat().st_size
        self.tokens = (
            np.memmap(self.prefix.with_suffix(".bin"), dtype=self.index.dtype, mode="r")
            if size
            else np.zeros(0, self.index.dtype)
        )

    def __len__(self) -> int:
        return len(self.index.lengths)

    def document(self, i: int) -> np.ndarray:
        start = self.index.pointers[i] // self.index.dtype.itemsize
        return np.asarray(self.tokens[start : start + self.index.lengths[i]])


def shard_prefixes(folder: Path) -> list[Path]:
    return sorted(path.with_suffix("") for path in Path(folder).glob("*.idx"))
