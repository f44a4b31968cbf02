"""The `tokenizer` (BPE training) and `tokenize` (encoding into shards) config sections."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.core.config import Section


class TokenizerConfig(Section):
    vocab_size: int = Field(2048, ge=300, le=1 << 20)
    sample_docs: int = Field(20_000, gt=0)
    min_frequency: int = Field(2, ge=1)
    eos_token: str = "<|endoftext|>"
    pad_token: str = "<|pad|>"
    reserved_tokens: int = Field(4, ge=0)
    unicode_form: Literal["NFC", "NFKC"] = Field(
        "NFC",
        description="the tokenizer's normaliser, as clean.unicode_form (NFKC folds full-width punctuation)",
    )
    split_cjk: bool = Field(
        False, description="isolate each CJK ideograph before BPE (like BERT's tokenize_chinese_chars)"
    )


class TokenizeConfig(Section):
    validation_fraction: float = Field(0.05, ge=0, lt=1)
    max_tokens_per_shard: int = Field(
        50_000_000, gt=0, description="a shard file rolls over to the next one at this many tokens"
    )
    num_shards: int = Field(2, gt=0, description="minimum number of writer tasks (shard files per split)")
    chunk_chars: int = Field(
        100_000, ge=1000, description="documents longer than this are encoded in pieces of this size"
    )
    threads_per_task: int | None = Field(
        None, gt=0, description="tokenizer threads per Spark task; default: spark.task.cpus"
    )
