"""The `tokenizer` (BPE training) and `tokenize` (encoding into shards) config sections."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from pipeline.core.config import Section, UnicodeForm

_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
TOKENIZER_CHOICE = re.compile(rf"^(?:{_NAME}/)?{_NAME}$")


class TokenizerConfig(Section):
    vocab_size: int = Field(2048, ge=300, le=1 << 20)
    sample_docs: int = Field(20_000, gt=0)
    min_frequency: int = Field(2, ge=1)
    eos_token: str = "<|endoftext|>"
    pad_token: str = "<|pad|>"
    reserved_tokens: int = Field(4, ge=0)
    unicode_form: UnicodeForm = Field(
        "NFC",
        description="the tokenizer's normaliser, as clean.unicode_form (NFKC folds full-width punctuation)",
    )
    split_cjk: bool = Field(
        False, description="isolate each CJK ideograph before BPE (like BERT's tokenize_chinese_chars)"
    )


class TokenizeConfig(Section):
    tokenizer: str = Field(
        "default",
        description="default: the corpus's shared tokenizer (the first snapshot tokenized trains and stores it "
        "when the corpus has none); NAME or CORPUS/NAME: a stored one (`pretrain tokenizer`); snapshot: a BPE "
        "trained on this snapshot alone",
    )
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

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_choice(cls, choice: str) -> str:
        if not TOKENIZER_CHOICE.fullmatch(choice):
            raise ValueError(
                f"{choice!r} is not a tokenizer choice: 'default', 'snapshot', a stored tokenizer's NAME or "
                "CORPUS/NAME"
            )
        return choice
