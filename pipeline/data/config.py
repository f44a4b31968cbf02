"""The `data` config section: how the trainer batches token shards (pipeline.data)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.core.config import Section


class DataConfig(Section):
    """How the trainer batches token shards (pipeline.data)."""

    batching: Literal["packed", "token_budget"] = Field(
        "packed",
        description="packed: fixed [batch_size, seq_len] windows over the token stream; token_budget: one "
        "document per row, rows of similar length batched up to max_tokens_per_batch (dynamic batching)",
    )
    max_tokens_per_batch: int | None = Field(
        None, gt=1, description="token_budget: padded tokens per rank batch; default batch_size * seq_len"
    )
    verify_shards: bool = Field(
        True,
        description="before the first step, check every token shard against the tokenize manifest's sha256 "
        "and its token ids against the vocabulary (reads the shards once); false skips it for corpora too "
        "large to read twice, with a warning on every run",
    )
