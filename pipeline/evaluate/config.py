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
    lm_eval: bool = Field(
        True,
        description="run lm-evaluation-harness (when installed) on the exported model, on a multiple-choice "
        "task made from the held-out documents",
    )
    lm_eval_documents: int = Field(200, ge=2, description="held-out documents the lm-eval task is made from")
    lm_eval_choices: int = Field(4, ge=2, description="choices per lm-eval item (chance: 1 / choices)")
