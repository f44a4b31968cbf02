"""The `export` config section: how a training run leaves as a Hugging Face model folder."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.core.config import Section


class ExportConfig(Section):
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="dtype of the exported safetensors weights (float32 gives the exact logits)"
    )
    max_shard_size: str = Field("5GB", description="safetensors files are split at this size")
