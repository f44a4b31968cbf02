"""Token shards checked before training uses them: each file against the checksum the tokenize stage recorded
in its manifest, each token id against the vocabulary.

The trainer calls ``verify_token_shards`` once per run, before its first step; the ranks share the files, so
each file is read once. Reading is streamed in chunks, so memory does not grow with a shard. A mismatch is a
``DamagedInputError`` naming the file, the expected and the found digest: the run fails once (a restart reads
the same bytes), before a step trains on changed tokens. ``data.verify_shards=false`` skips the reading for
corpora too large to read twice, with a warning on every run.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.manifest import DamagedInputError, Manifest
from pipeline.core.storage import DatasetRef

log = logging.getLogger(__name__)
SHARD_FOLDERS = ("train", "validation")
SHARD_SUFFIXES = (".bin", ".idx")
CHUNK_BYTES = 16 << 20  # a multiple of every token size


@dataclass(frozen=True)
class ShardCheck:
    files: int  # checked by this rank
    bytes: int
    max_token_id: int  # -1: no token read
    seconds: float


def shard_files(folder: Path) -> set[str]:
    """The shard files (relative paths) under ``folder``'s split folders."""
    return {
        path.relative_to(folder).as_posix()
        for split in SHARD_FOLDERS
        if (folder / split).is_dir()
        for path in (folder / split).iterdir()
        if path.suffix in SHARD_SUFFIXES
    }


def verify_token_shards(
    ref: DatasetRef, manifest: Manifest, *, checksums: bool = True, rank: int = 0, world_size: int = 1
) -> ShardCheck | None:
    """Check the tokenize output ``ref`` (whose manifest is ``manifest``): the shard files on disk are the
    ones the manifest lists; with ``checksums``, this rank's share of them (every ``world_size``-th file)
    has the recorded sha256, and every token id lies in ``[0, vocab_size)``. DamagedInputError otherwise."""
    listed = {name for name in manifest.files if name.endswith(SHARD_SUFFIXES) and "/" in name}
    found = shard_files(ref.path)
    for name in sorted(found - listed)[:1]:
        raise DamagedInputError(
            f"{ref.path / name} is not in the tokenize manifest, so training would read tokens nobody "
            f"produced; remove it or {ref.rerun_hint}"
        )
    for name in sorted(listed - found)[:1]:
        raise DamagedInputError(f"{ref.path / name} is missing (the tokenize manifest lists it); {ref.rerun_hint}")
    if not checksums:
        log.warning(
            "data.verify_shards=false: the %d token shard files of %s are NOT checked against their manifest "
            "checksums nor their token ids against the vocabulary; a damaged shard would train silently",
            len(listed),
            ref.what,
        )
        return None
    vocab_size = int(manifest.extra["vocab_size"])
    dtype = np.dtype(manifest.extra.get("dtype", "uint16"))
    started = time.monotonic()
    mine = sorted(listed)[rank::world_size]
    total, highest = 0, -1
    for name in mine:
        entry = manifest.files[name]
        path = ref.path / name
        digest = hashlib.sha256()
        position = 0  # tokens read so far
        with open(path, "rb") as handle:
            while chunk := handle.read(CHUNK_BYTES):
                digest.update(chunk)
                total += len(chunk)
                if name.endswith(".bin"):
                    tokens = np.frombuffer(chunk, dtype=dtype, count=len(chunk) // dtype.itemsize)
                    if len(tokens):
                        low, high = int(tokens.min()), int(tokens.max())
                        if low < 0 or high >= vocab_size:
                            bad = int(np.flatnonzero((tokens < 0) | (tokens >= vocab_size))[0])
                            raise DamagedInputError(
                                f"{path}: token id {int(tokens[bad])} at token {position + bad} is outside the "
                                f"vocabulary of {vocab_size} ids; {ref.rerun_hint}"
                            )
                        highest = max(highest, high)
                    position += len(tokens)
        if digest.hexdigest() != entry.sha256:
            raise DamagedInputError(
                f"{path} does not match the tokenize manifest: expected sha256 {entry.sha256} "
                f"({entry.bytes} bytes), found {digest.hexdigest()} ({path.stat().st_size} bytes); "
                f"{ref.rerun_hint}"
            )
    check = ShardCheck(len(mine), total, highest, round(time.monotonic() - started, 3))
    log.info(
        "token shards of %s: %d file(s), %d bytes match the tokenize manifest, token ids < %d (%.1f s)",
        ref.what,
        check.files,
        check.bytes,
        vocab_size,
        check.seconds,
    )
    return check
