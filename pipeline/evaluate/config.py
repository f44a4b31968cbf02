"""The `evaluate` config section: held-out loss by host and language, and fixed prompts."""

from __future__ import annotations

from pydantic import Field

from pipeline.core.config import Section


class EvaluateConfig(Section):
    max_documents: int = Field(
        2000, gt=0, description="validation documents evaluated at most (the first ones of the split's order)"
    )
    batch_size: int = Field(8, gt=0, description="windows per forward pass")
    top_hosts: int = Field(20, gt=0, description="hosts shown one by one; the rest are summed as 'other'")
    prompts: list[str] = Field(
        default_factory=lambda: ["The", "In the garden", "Bees are", "def main():", "今天的天气"],
        description="prompts whose greedy continuations are saved with every evaluation",
    )
    max_new_tokens: int = Field(48, ge=1, description="tokens per greedy continuation at most")
