"""What routing returns, for the PyTorch reference (``pipeline.model.routing``) and the fused kernels
(``cuda_ext.moe_routing``) alike. It lives here, below the model, so that the kernels need nothing of the
model's package: the model imports the extension, never the other way round."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RoutingPlan:
    weights: torch.Tensor  # float32 [T, k]
    expert_ids: torch.Tensor  # int32 [T, k]
    dropped: torch.Tensor  # bool [T, k]
    expert_counts: torch.Tensor  # int32 [E], kept assignments per expert
    expert_offsets: torch.Tensor  # int32 [E + 1], exclusive prefix sum of expert_counts
    source_index: torch.Tensor  # int32 [N], N = expert_counts.sum()

    @property
    def num_tokens(self) -> int:
        return self.expert_ids.shape[0]

    @property
    def top_k(self) -> int:
        return self.expert_ids.shape[1]

    @property
    def token_index(self) -> torch.Tensor:
        """Token row feeding each grouped position."""
        return torch.div(self.source_index.long(), self.top_k, rounding_mode="floor")
