"""Documents -> token ids, robust to bad input: the part of the tokenize stage that runs in Spark's Python workers.

Bad input is counted, never fatal:
- invalid UTF-8 and lone surrogates are replaced with U+FFFD (``repaired_unicode``);
- documents longer than ``chunk_chars`` are encoded in pieces cut before whitespace (``chunked_documents``),
  which bounds the work BPE does on one pre-token and the memory of one encode call;
- special-token strings inside a document are encoded as plain text, so the end-of-text id appears only where
  this stage puts it: once, after each document (``DocumentEncoder.__post_init__``).
"""

from __future__ import annotations

import array
import os
import unicodedata
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from tokenizers import AddedToken, Tokenizer

REPLACEMENT = "\ufffd"
# Where a hard cut (no whitespace near the limit) must not land: before a combining mark, a joiner or a
# variation selector, all of which belong with the character before them.
_NO_CUT_BEFORE = {"\u200c", "\u200d", *map(chr, range(0xFE00, 0xFE10))}


def configure_threads(threads: int) -> None:
    """Cap tokenizers' Rayon pool in this process before its first use.

    Spark already runs one Python worker per task slot; each worker's encode_batch defaulting to one thread
    per core would oversubscribe the machine (slots x cores threads), so a task gets spark.task.cpus threads.
    Set unconditionally: a value inherited from the driver's environment was meant for the driver.
    """
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "false" if threads == 1 else "true"


def repair_text(text: str) -> tuple[str, bool]:
    """Make text UTF-8 encodable; returns (text, repaired).

    A surrogate pair left as two code points (as JSON escapes give) becomes its character; each lone
    surrogate becomes one U+FFFD. The UTF-16 round trip does both.
    """
    try:
        text.encode("utf-8")
        return text, False
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace"), True


def texts_from_arrow(column: pa.Array | pa.ChunkedArray) -> tuple[list[str | None], int]:
    """Python strings from an Arrow string column; invalid UTF-8 (Spark does not validate) becomes U+FFFD.

    Returns (texts, number of texts that needed repair).
    """
    try:
        return column.to_pylist(), 0
    except UnicodeDecodeError:
        pass
    texts: list[str | None] = []
    repaired = 0
    for raw in column.cast(pa.binary()).to_pylist():
        if raw is None:
            texts.append(None)
            continue
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            texts.append(raw.decode("utf-8", "replace"))
            repaired += 1
    return texts, repaired


def split_long_text(text: str, chunk_chars: int) -> list[str]:
    """Pieces of at most chunk_chars characters whose concatenation is text.

    A cut goes just before the last whitespace in the second half of the window, so byte-level BPE (whose
    pre-tokens start with their leading space) sees the same words; with no whitespace there (CJK, base64)
    it falls back to a hard cut that does not separate a combining mark from its base character, unless marks
    fill the whole second half of the window (Zalgo text), where it cuts among them.
    """
    if len(text) <= chunk_chars:
        return [text]
    pieces = []
    start = 0
    while len(text) - start > chunk_chars:
        limit = start + chunk_chars
        lower = start + chunk_chars // 2
        cut = max(text.rfind(" ", lower, limit), text.rfind("\n", lower, limit))
        if cut <= start:
            cut = limit
            while cut > lower and (unicodedata.combining(text[cut]) or text[cut] in _NO_CUT_BEFORE):
                cut -= 1
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


def vocabulary_size(tokenizer: Tokenizer) -> int:
    """The ids an embedding table and a shard's dtype must hold: the largest id + 1. ``get_vocab_size``
    counts entries, so a file whose ids have gaps would claim too few."""
    ids = tokenizer.get_vocab(with_added_tokens=True).values()
    return max(ids, default=-1) + 1


@dataclass
class EncodeCounters:
    documents: int = 0
    repaired_unicode: int = 0
    chunked_documents: int = 0

    def add(self, other: EncodeCounters) -> None:
        self.documents += other.documents
        self.repaired_unicode += other.repaired_unicode
        self.chunked_documents += other.chunked_documents


@dataclass
class DocumentEncoder:
    """Encodes batches of documents to id arrays that end with the end-of-text id."""

    tokenizer: Tokenizer
    eos_id: int
    dtype: np.dtype
    chunk_chars: int = 100_000
    counters: EncodeCounters = field(default_factory=EncodeCounters)
    plain_ids: tuple[int, ...] = ()  # other ids a document's text must not produce (the padding token's)

    def __post_init__(self) -> None:
        # A literal "<|endoftext|>" in a web page must not become a document boundary. tokenizers matches
        # added tokens in the input before anything else; with encode_special_tokens it skips those marked
        # special, so their text goes through normaliser, pre-tokenizer and model as any other text. A
        # brought tokenizer.json may add its end-of-text (or padding) token unmarked, as a plain added token
        # that would still be matched: it is marked special here. Ids, and the encoding of every text that
        # does not spell such a token, stay as they were (the flag only changes that token's matching).
        self.tokenizer.encode_special_tokens = True
        added = self.tokenizer.get_added_tokens_decoder()
        unmarked = [
            added[token_id].content
            for token_id in sorted({self.eos_id, *self.plain_ids})
            if token_id in added and not added[token_id].special
        ]
        if unmarked:
            self.tokenizer.add_special_tokens([AddedToken(content, special=True) for content in unmarked])
        self._typecode = {np.dtype(np.uint16): "H", np.dtype(np.int32): "i"}[np.dtype(self.dtype)]

    @classmethod
    def for_tokenizer(
        cls, tokenizer: Tokenizer, eos_token: str, chunk_chars: int, pad_token: str | None = None
    ) -> DocumentEncoder:
        from pipeline.data.shards import token_dtype

        eos_id = tokenizer.token_to_id(eos_token)
        if eos_id is None:
            raise ValueError(f"the tokenizer has no end-of-text token {eos_token!r}")
        pad_id = tokenizer.token_to_id(pad_token) if pad_token is not None else None
        plain_ids = () if pad_id is None else (pad_id,)
        return cls(
            tokenizer, eos_id, token_dtype(vocabulary_size(tokenizer)), chunk_chars, plain_ids=plain_ids
        )

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Encode texts (none may be None) into (tokens, lengths): all documents' ids back to back, each
        followed by the end-of-text id, and each document's length including that id."""
        try:
            tokens, lengths = self._encode(texts)
        except TypeError:
            # tokenizers rejects strings UTF-8 cannot encode (lone surrogates): repair them and retry.
            repaired = [repair_text(text) for text in texts]
            self.counters.repaired_unicode += sum(flag for _, flag in repaired)
            tokens, lengths = self._encode([text for text, _ in repaired])
        self.counters.documents += len(texts)
        return tokens, lengths

    def _encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        pieces: list[str] = []
        owners: list[int] = []  # the document of each piece; filled only once some document is split
        chunked = 0
        for i, text in enumerate(texts):
            if len(text) > self.chunk_chars:
                if not owners:
                    owners = list(range(len(pieces)))
                parts = split_long_text(text, self.chunk_chars)
                pieces += parts
                owners += [i] * len(parts)
                chunked += 1
            else:
                pieces.append(text)
                if owners:
                    owners.append(i)
        encodings = self.tokenizer.encode_batch_fast(pieces, add_special_tokens=False)
        self.counters.chunked_documents += chunked
        # array.array grows in C; one numpy view per batch instead of one array per document.
        buffer = array.array(self._typecode)
        lengths = np.zeros(len(texts), dtype=np.int64)
        eos = self.eos_id
        if not owners:
            for i, encoding in enumerate(encodings):
                ids = encoding.ids
                buffer.extend(ids)
                buffer.append(eos)
                lengths[i] = len(ids) + 1
        else:
            for position, (owner, encoding) in enumerate(zip(owners, encodings, strict=True)):
                ids = encoding.ids
                buffer.extend(ids)
                lengths[owner] += len(ids)
                if position + 1 == len(owners) or owners[position + 1] != owner:
                    buffer.append(eos)
                    lengths[owner] += 1
        return np.frombuffer(buffer, dtype=self.dtype), lengths
