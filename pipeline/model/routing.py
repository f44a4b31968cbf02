"""Top-k MoE routing behind one small interface: route, permute, unpermute.

This file is the PyTorch reference. The fused CUDA/CPU kernels in ``cuda_ext`` implement exactly the
same contract, so the MoE layer can call either.

Contract, for router logits ``[T, E]`` and ``k`` choices per token:

* scores: softmax (or sigmoid) over experts, computed in float32. NaN counts as the lowest possible
  logit and +/-inf as the largest/smallest finite float32, so weights are always finite and ids valid.
* top-k: the k highest scores in descending order; equal scores go to the lower expert id.
* weights: the chosen k scores renormalised to sum to 1 per token (float32).
* capacity: at most ``capacity`` assignments per expert. Assignments are admitted in
  (choice rank j, token t) order: every token's first choice in token order, then second choices, ...
  Overflowing assignments are marked dropped; a dropped assignment contributes nothing (the token's
  residual stream passes it through).
* grouping: the kept assignments, grouped by expert (expert 0 first), and inside an expert in token
  order (stable). ``source_index[p]`` is the flat assignment index ``t * k + j`` at grouped position p.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from cuda_ext.routing_plan import RoutingPlan


def expert_capacity(
    num_tokens: int, num_experts: int, top_k: int, capacity_factor: float | None
) -> int | None:
    """capacity_factor x tokens x k / experts, rounded up; None (or <= 0) means unlimited."""
    if capacity_factor is None or capacity_factor <= 0:
        return None
    return math.ceil(capacity_factor * num_tokens * top_k / num_experts)


def router_scores(logits: torch.Tensor, score: str = "softmax") -> torch.Tensor:
    finfo = torch.finfo(torch.float32)
    safe = torch.nan_to_num(logits.float(), nan=finfo.min, posinf=finfo.max, neginf=finfo.min)
    if score == "softmax":
        return torch.softmax(safe, dim=-1)
    if score == "sigmoid":
        return torch.sigmoid(safe)
    raise ValueError(f"unknown router score {score!r}; use 'softmax' or 'sigmoid'")


def route(
    logits: torch.Tensor,
    top_k: int,
    capacity: int | None = None,
    score: str = "softmax",
) -> RoutingPlan:
    num_tokens, num_experts = logits.shape
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in [1, {num_experts}], got {top_k}")
    scores = router_scores(logits, score)
    # A stable descending sort keeps the lower expert id first among equal scores.
    sorted_scores, sorted_ids = torch.sort(scores, dim=-1, descending=True, stable=True)
    top_scores, expert_ids = sorted_scores[:, :top_k], sorted_ids[:, :top_k]
    weights = top_scores / top_scores.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)

    dropped = torch.zeros_like(expert_ids, dtype=torch.bool)
    if capacity is not None:
        choice_major = expert_ids.t().reshape(-1)  # position = j * T + t: the admission order
        grouped = torch.sort(choice_major, stable=True).indices
        per_expert = torch.bincount(choice_major, minlength=num_experts)
        first_of_expert = torch.cumsum(per_expert, 0) - per_expert
        rank_in_expert = torch.empty_like(choice_major)
        rank_in_expert[grouped] = (
            torch.arange(len(choice_major), device=logits.device) - first_of_expert[choice_major[grouped]]
        )
        dropped = (rank_in_expert >= capacity).view(top_k, num_tokens).t()

    token_major = expert_ids.reshape(-1)  # position = t * k + j
    kept = torch.nonzero(~dropped.reshape(-1)).squeeze(1)
    source_index = kept[torch.sort(token_major[kept], stable=True).indices]
    counts = torch.bincount(token_major[kept], minlength=num_experts)
    offsets = torch.zeros(num_experts + 1, dtype=torch.int64, device=logits.device)
    offsets[1:] = torch.cumsum(counts, 0)
    return RoutingPlan(
        weights=weights,
        expert_ids=expert_ids.int(),
        dropped=dropped,
        expert_counts=counts.int(),
        expert_offsets=offsets.int(),
        source_index=source_index.int(),
    )


def permute(hidden: torch.Tensor, plan: RoutingPlan) -> torch.Tensor:
    """Gather token rows [T, H] into the expert-grouped order [N, H]."""
    return hidden[plan.token_index]


def unpermute(expert_output: torch.Tensor, plan: RoutingPlan) -> torch.Tensor:
    """Weighted combine of grouped rows [N, H] back to tokens [T, H]; dropped assignments add nothing."""
    weights = plan.weights.reshape(-1)[plan.source_index.long()].unsqueeze(1)
    weighted = (expert_output.float() * weights).to(expert_output.dtype)
    out = torch.zeros(
        plan.num_tokens, expert_output.shape[1], dtype=expert_output.dtype, device=expert_output.device
    )
    return out.index_add(0, plan.token_index, weighted)


@dataclass(frozen=True)
class RoutingOps:
    """The three routing functions, from one backend."""

    name: str
    route: Callable[..., RoutingPlan]
    permute: Callable[..., torch.Tensor]
    unpermute: Callable[..., torch.Tensor]


REFERENCE_OPS = RoutingOps("pytorch", route, permute, unpermute)


def routing_ops(use_extension: bool = True) -> RoutingOps:
    """The fused ``cuda_ext`` kernels when enabled and built, else the PyTorch reference above.

    ``cuda_ext.moe_routing`` must expose ``route``, ``permute`` and ``unpermute`` with the signatures
    and semantics of this module (and autograd support), plus ``is_available() -> bool``.
    """
    if use_extension:
        try:
            from cuda_ext import moe_routing
        except ImportError:
            return REFERENCE_OPS
        if moe_routing.is_available():
            return RoutingOps("cuda_ext", moe_routing.route, moe_routing.permute, moe_routing.unpermute)
    return REFERENCE_OPS
