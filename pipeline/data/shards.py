"""Packed token shards in Megatron's indexed-dataset layout (``.bin`` tokens + ``MMIDIDX`` ``.idx``).

``.idx`` layout (little endian), as Megatron-LM's ``megatron/core/datasets/indexed_dataset.py`` writes it
(``_IndexWriter``) and reads it (``_IndexReader``); full description in ``docs/token-shards.md``:

    9 bytes   magic  b"MMIDIDX\\x00\\x00"
    u64       version = 1
    u8        dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16)
    u64       sequence count N
    u64       document-index count D + 1 (here D = N: one sequence per document)
    i32[N]    sequence lengths, in tokens
    i64[N]    sequence byte offsets into .bin
    i64[D+1]  document indices: 0, then the sequence index after each document (= 0..N here)
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.manifest import DamagedInputError

INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
HEADER_BYTES = 34  # magic 9 + version 8 + dtype 1 + sequence count 8 + document count 8
DTYPE_CODES: dict[np.dtype, int] = {
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
MAX_SEQUENCE_TOKENS = np.iinfo(np.int32).max  # lengths are int32 in the index
# Who each validation document is, beside its shard (``<shard>.docs.parquet``), so an evaluation can break
# the loss down by host and language; the train split, far larger, has none.
DESCRIBED_SPLIT = "validation"
DOCUMENTS_SUFFIX = ".docs.parquet"


class ShardFormatError(DamagedInputError):
    """A .bin/.idx pair is not a valid, complete shard (a ValueError; never retried: reading it again finds
    the same bytes)."""


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 below 65,536 ids; above that int32, since Megatron's dtype codes have no uint32.

    int32 holds any id below 2**31, far above any vocabulary, so nothing is lost.
    """
    return np.dtype(np.uint16) if vocab_size < 65_536 else np.dtype(np.int32)


class ShardWriter:
    """Append documents to ``<prefix>.bin``; ``close()`` writes ``<prefix>.idx``.

    Both files are written under temporary names and renamed into place by ``close()``, ``.idx`` last, so a
    killed or retried Spark task never leaves a half-written shard under a real name. ``bin_sha256`` and
    ``idx_sha256`` hold the files' checksums after close().
    """

    def __init__(self, prefix: Path, dtype: np.dtype, temp_suffix: str = ".tmp") -> None:
        self.prefix = Path(prefix)
        self.dtype = np.dtype(dtype)
        if self.dtype not in DTYPE_CODES:
            raise ValueError(f"dtype {self.dtype} has no MMIDIDX code")
        self.lengths: list[int] = []
        self.tokens = 0
        self.bin_sha256 = self.idx_sha256 = ""
        self._temp_suffix = temp_suffix
        self._bin_digest = hashlib.sha256()
        self._bin_path = self.prefix.with_suffix(".bin")
        self._bin = open(self._temp(self._bin_path), "wb")  # noqa: SIM115 - closed in close()

    def _temp(self, path: Path) -> Path:
        return path.with_name(path.name + self._temp_suffix)

    @property
    def documents(self) -> int:
        return len(self.lengths)

    def add_document(self, token_ids) -> None:
        array = np.asarray(token_ids, dtype=self.dtype)
        self.add_documents(array, np.array([len(array)], dtype=np.int64))

    def add_documents(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append several documents at once: tokens back to back, lengths[i] tokens each."""
        tokens = np.ascontiguousarray(tokens, dtype=self.dtype)
        if int(np.sum(lengths)) != len(tokens):
            raise ValueError(f"lengths add up to {int(np.sum(lengths))} tokens, but {len(tokens)} were given")
        if len(lengths) and int(np.max(lengths)) > MAX_SEQUENCE_TOKENS:
            raise ValueError(f"a document of {int(np.max(lengths))} tokens does not fit the int32 index")
        data = tokens.tobytes()
        self._bin.write(data)
        self._bin_digest.update(data)
        self.lengths += [int(length) for length in lengths]
        self.tokens += len(tokens)

    def close(self) -> None:
        self._bin.close()
        idx_path = self.prefix.with_suffix(".idx")
        write_index(self._temp(idx_path), self.dtype, np.asarray(self.lengths, dtype=np.int32))
        self.bin_sha256 = self._bin_digest.hexdigest()
        self.idx_sha256 = hashlib.sha256(self._temp(idx_path).read_bytes()).hexdigest()
        os.replace(self._temp(self._bin_path), self._bin_path)
        os.replace(self._temp(idx_path), idx_path)

    def abort(self) -> None:
        self._bin.close()
        for path in (self._bin_path, self.prefix.with_suffix(".idx")):
            self._temp(path).unlink(missing_ok=True)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


@dataclass
class ShardFile:
    """What one finished shard holds, for the manifest."""

    name: str
    documents: int
    tokens: int
    bin_bytes: int
    bin_sha256: str
    idx_sha256: str
    oversized_documents: int


class RollingShardWriter:
    """Writes ``<folder>/<stem>-0000``, ``-0001``, ... starting a new shard before one would pass max_tokens.

    A single document longer than max_tokens cannot be split across files (a shard holds whole documents);
    it gets a shard of its own and is counted in ``oversized_documents``.
    """

    def __init__(
        self, folder: Path, stem: str, dtype: np.dtype, max_tokens: int, temp_suffix: str = ".tmp"
    ) -> None:
        self.folder = Path(folder)
        self.stem = stem
        self.dtype = np.dtype(dtype)
        self.max_tokens = max_tokens
        self.temp_suffix = temp_suffix
        self.finished: list[ShardFile] = []
        self._writer: ShardWriter | None = None
        self._oversized = 0

    def add_documents(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        ends = np.cumsum(lengths)
        start_doc, start_token = 0, 0
        while start_doc < len(lengths):
            writer = self._current()
            room = self.max_tokens - writer.tokens
            # Documents [start_doc, stop_doc) fit in the room left in this shard.
            stop_doc = int(np.searchsorted(ends, start_token + room, side="right"))
            if stop_doc == start_doc:
                if writer.tokens:
                    self._roll()
                    continue
                stop_doc = start_doc + 1  # longer than a whole shard: alone in this one
                self._oversized += 1
            stop_token = int(ends[stop_doc - 1])
            writer.add_documents(tokens[start_token:stop_token], lengths[start_doc:stop_doc])
            start_doc, start_token = stop_doc, stop_token
            if writer.tokens >= self.max_tokens:
                self._roll()

    def _current(self) -> ShardWriter:
        if self._writer is None:
            prefix = self.folder / f"{self.stem}-{len(self.finished):04d}"
            self._writer = ShardWriter(prefix, self.dtype, self.temp_suffix)
        return self._writer

    def _roll(self) -> None:
        writer, self._writer = self._writer, None
        if writer is None:
            return
        writer.close()
        self.finished.append(
            ShardFile(
                name=writer.prefix.name,
                documents=writer.documents,
                tokens=writer.tokens,
                bin_bytes=writer.tokens * self.dtype.itemsize,
                bin_sha256=writer.bin_sha256,
                idx_sha256=writer.idx_sha256,
                oversized_documents=self._oversized,
            )
        )
        self._oversized = 0

    def close(self) -> list[ShardFile]:
        self._roll()
        return self.finished

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.abort()
            self._writer = None


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
        handle.write(lengths.astype("<i4").tobytes(order="C"))
        handle.write(pointers.astype("<i8").tobytes(order="C"))
        handle.write(documents.astype("<i8").tobytes(order="C"))


@dataclass
class ShardIndex:
    dtype: np.dtype
    lengths: np.ndarray
    pointers: np.ndarray
    documents: np.ndarray

    @property
    def document_lengths(self) -> np.ndarray:
        """Tokens per document (a document may span several sequences in Megatron's format)."""
        sequence_ends = np.concatenate([[0], np.cumsum(self.lengths, dtype=np.int64)])
        return np.diff(sequence_ends[self.documents])


def read_index(path: Path) -> ShardIndex:
    """Parse and validate an MMIDIDX file; any inconsistency is a ShardFormatError naming the file."""
    path = Path(path)
    data = path.read_bytes()
    if data[:9] != INDEX_MAGIC:
        raise ShardFormatError(f"{path}: not an MMIDIDX index (bad magic {data[:9]!r})")
    if len(data) < HEADER_BYTES:
        raise ShardFormatError(f"{path}: truncated header ({len(data)} bytes)")
    (version,) = struct.unpack_from("<Q", data, 9)
    if version != INDEX_VERSION:
        raise ShardFormatError(f"{path}: unsupported index version {version}")
    (code,) = struct.unpack_from("<B", data, 17)
    if code not in CODE_DTYPES:
        raise ShardFormatError(f"{path}: unknown dtype code {code}")
    count, doc_count = struct.unpack_from("<QQ", data, 18)
    expected = HEADER_BYTES + 12 * count + 8 * doc_count
    if len(data) < expected:
        raise ShardFormatError(f"{path}: truncated ({len(data)} bytes, the header promises {expected})")
    offset = HEADER_BYTES
    lengths = np.frombuffer(data, dtype="<i4", count=count, offset=offset)
    offset += 4 * count
    pointers = np.frombuffer(data, dtype="<i8", count=count, offset=offset)
    offset += 8 * count
    documents = np.frombuffer(data, dtype="<i8", count=doc_count, offset=offset)
    if doc_count == 0 or documents[0] != 0 or documents[-1] != count or np.any(np.diff(documents) < 0):
        raise ShardFormatError(f"{path}: document indices do not run from 0 to the sequence count {count}")
    return ShardIndex(CODE_DTYPES[code], lengths, pointers, documents)


class Shard:
    """Read-only memmap view of one ``.bin``/``.idx`` pair; checks that the two agree."""

    def __init__(self, prefix: Path) -> None:
        self.prefix = Path(prefix)
        self.index = read_index(self.prefix.with_suffix(".idx"))
        bin_path = self.prefix.with_suffix(".bin")
        if not bin_path.is_file():
            raise ShardFormatError(f"{bin_path}: missing (its .idx exists)")
        itemsize = self.index.dtype.itemsize
        self.num_tokens = int(np.sum(self.index.lengths, dtype=np.int64))
        size = bin_path.stat().st_size
        if size != self.num_tokens * itemsize:
            raise ShardFormatError(
                f"{bin_path}: {size} bytes, but its index describes {self.num_tokens} tokens "
                f"of {itemsize} bytes; the shard is truncated or does not belong to this index"
            )
        expected_pointers = (
            np.concatenate([[0], np.cumsum(self.index.lengths[:-1], dtype=np.int64)]) * itemsize
        )
        if len(self.index.lengths) and not np.array_equal(self.index.pointers, expected_pointers):
            raise ShardFormatError(f"{self.prefix}.idx: sequence pointers are not contiguous")
        self.tokens = (
            np.memmap(bin_path, dtype=self.index.dtype, mode="r") if size else np.zeros(0, self.index.dtype)
        )

    def __len__(self) -> int:
        return len(self.index.lengths)

    def document(self, i: int) -> np.ndarray:
        start = self.index.pointers[i] // self.index.dtype.itemsize
        return np.asarray(self.tokens[start : start + self.index.lengths[i]])


def _natural_key(path: Path) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def shard_prefixes(folder: Path) -> list[Path]:
    """Shard prefixes (path without suffix) in stream order: by name, numbers compared as numbers."""
    return sorted((path.with_suffix("") for path in Path(folder).glob("*.idx")), key=_natural_key)
