"""What training reads from token shards: the shards of a folder as one memmapped token stream, the samples
over it (packed windows, or one document per row), and the batches made of them.

- ``PackedSequences``: all documents back to back (each ends in end-of-text) as one token stream, cut into
  windows of ``seq_len + 1`` tokens that overlap by one (inputs and shifted targets). ``document_ids`` says
  which document each input token is in, so the model can keep attention inside documents.
- ``DocumentSequences``: one sample per document (a long one cut into ``max_len`` pieces), for dynamic batching.

How samples become batches is ``pipeline.data.batching``; in which order, ``pipeline.data.loader``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from pipeline.data.shards import Shard, shard_prefixes

IGNORE_INDEX = -100  # targets the loss skips (F.cross_entropy's default ignore_index)
PAD_DOCUMENT = -1  # document id of padding positions


class Batch(NamedTuple):
    inputs: torch.Tensor
    """[B, T] int64 token ids (padding: the pad id)."""
    targets: torch.Tensor
    """[B, T] int64 next-token ids; IGNORE_INDEX (-100) where there is nothing to predict (padding)."""
    document_ids: torch.Tensor
    """[B, T] int64; a token may attend only to earlier tokens with the same id. Ids count from 0 in each row;
    padding has PAD_DOCUMENT (-1)."""

    @property
    def num_tokens(self) -> int:
        """Positions that count in the loss."""
        return int((self.targets != IGNORE_INDEX).sum())

    def to(self, device, non_blocking: bool = False) -> Batch:
        return Batch(*(t.to(device, non_blocking=non_blocking) for t in self))

    @property
    def sources(self) -> torch.Tensor | None:
        """[B] int64: the mixture source each row was drawn from (``SourcedBatch``); None here: one snapshot."""
        return None


class SourcedBatch(Batch):
    """A Batch from a declared mixture (``pipeline.data.loader``) that also says which source each row came
    from, for per-source loss. It is still the three tensors of a Batch (``inputs, targets, document_ids = batch``);
    ``sources`` rides beside them."""

    _row_sources: torch.Tensor

    def __new__(cls, inputs: torch.Tensor, targets: torch.Tensor, document_ids: torch.Tensor, sources):
        batch = super().__new__(cls, inputs, targets, document_ids)
        batch._row_sources = sources
        return batch

    @property
    def sources(self) -> torch.Tensor:
        return self._row_sources

    def to(self, device, non_blocking: bool = False) -> SourcedBatch:
        moved = (t.to(device, non_blocking=non_blocking) for t in (*self, self._row_sources))
        return SourcedBatch(*moved)


class TokenStream:
    """The shards of a folder (or of several, one after the other: a mixture source's snapshots) as one
    memmapped token stream, in shard_prefixes() order; nothing is copied."""

    def __init__(self, folder: Path | Sequence[Path]) -> None:
        folders = [Path(folder)] if isinstance(folder, str | Path) else [Path(f) for f in folder]
        self.folder = folders[0] if len(folders) == 1 else None
        self.folders = folders
        self.where = ", ".join(map(str, folders))  # how messages name it
        prefixes = [prefix for one in folders for prefix in shard_prefixes(one)]
        if not prefixes:
            raise FileNotFoundError(f"no token shards (*.idx) in {', '.join(map(str, folders))}")
        self.shards = [Shard(prefix) for prefix in prefixes]
        sizes = [shard.num_tokens for shard in self.shards]
        self.shard_starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self.num_tokens = int(self.shard_starts[-1])
        self.document_lengths = np.concatenate([shard.index.document_lengths for shard in self.shards])
        self.document_ends = np.cumsum(self.document_lengths, dtype=np.int64)
        self.num_documents = len(self.document_lengths)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of the stream as int64, across shard boundaries."""
        if not 0 <= start <= stop <= self.num_tokens:
            raise IndexError(f"token range [{start}, {stop}) outside the stream of {self.num_tokens}")
        out = np.empty(stop - start, dtype=np.int64)
        shard = int(np.searchsorted(self.shard_starts, start, side="right")) - 1
        position = start
        while position < stop:
            shard_stop = int(self.shard_starts[shard + 1])
            take = min(stop, shard_stop) - position
            local = position - int(self.shard_starts[shard])
            out[position - start : position - start + take] = self.shards[shard].tokens[local : local + take]
            position += take
            shard += 1
        return out

    def document_of(self, positions: np.ndarray) -> np.ndarray:
        """Index of the document that holds each stream position."""
        return np.searchsorted(self.document_ends, positions, side="right")

    def fingerprint(self) -> str:
        """Names and sizes of the shards: enough to tell that a checkpoint was made on other data."""
        # One folder: shard names, as always; several: the snapshot folder too (<snapshot>/<split>/<shard>).
        named = (lambda p: p.name) if len(self.folders) == 1 else (lambda p: "/".join(p.parts[-3:]))
        summary = [
            (named(shard.prefix), shard.num_tokens, len(shard.index.documents) - 1) for shard in self.shards
        ]
        return hashlib.sha256(json.dumps(summary).encode()).hexdigest()[:16]


class PackedSequences:
    """Windows of seq_len + 1 tokens over the stream; window i starts at token i * seq_len."""

    def __init__(self, folder: Path | Sequence[Path], seq_len: int) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        self.stream = TokenStream(folder)
        self.seq_len = seq_len
        if self.stream.num_tokens < seq_len + 1:
            raise ValueError(
                f"{self.stream.where} holds {self.stream.num_tokens} tokens, fewer than one sequence of {seq_len + 1}"
            )

    def __len__(self) -> int:
        return (self.stream.num_tokens - 1) // self.seq_len

    def _start(self, index: int) -> int:
        if not 0 <= index < len(self):
            raise IndexError(f"sequence {index} out of range for {len(self)} sequences")
        return index * self.seq_len

    def __getitem__(self, index: int) -> np.ndarray:
        start = self._start(index)
        return self.stream.read(start, start + self.seq_len + 1)

    def document_ids(self, index: int) -> np.ndarray:
        """Per token of window ``index``: its document, counted from 0 at the window's first token."""
        start = self._start(index)
        documents = self.stream.document_of(np.arange(start, start + self.seq_len + 1))
        return documents - documents[0]

    def fingerprint(self) -> str:
        return f"packed:{self.seq_len}:{self.stream.fingerprint()}"


class DocumentSequences:
    """One sample per document, a document of more than max_len + 1 tokens cut into pieces of at most
    max_len + 1 tokens that overlap by one, so every next-token target is predicted exactly once.
    Documents of a single token (nothing to predict) give no sample."""

    def __init__(self, folder: Path | Sequence[Path], max_len: int) -> None:
        if max_len < 1:
            raise ValueError(f"max_len must be positive, got {max_len}")
        self.stream = TokenStream(folder)
        self.max_len = max_len
        positions = self.stream.document_lengths - 1  # next-token predictions per document
        pieces = np.where(positions > 0, -(-positions // max_len), 0)
        document = np.repeat(np.arange(len(positions)), pieces)
        first_piece = np.repeat(np.cumsum(pieces) - pieces, pieces)
        piece = np.arange(len(document)) - first_piece
        document_starts = self.stream.document_ends - self.stream.document_lengths
        self.starts = document_starts[document] + piece * max_len
        # Positions (= inputs = targets) per sample; the sample itself has one token more.
        self.lengths = np.minimum(positions[document] - piece * max_len, max_len)
        if len(self.lengths) == 0:
            raise ValueError(f"{self.stream.where} holds no document with a token to predict")

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> np.ndarray:
        start = int(self.starts[index])
        return self.stream.read(start, start + int(self.lengths[index]) + 1)

    def fingerprint(self) -> str:
        return f"documents:{self.max_len}:{self.stream.fingerprint()}"
