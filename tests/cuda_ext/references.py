"""Shared references for the cuda_ext tests: the routing contract as float64 loops, and a tiny routed MoE."""

from __future__ import annotations

import torch


def sanitized(logits: torch.Tensor) -> torch.Tensor:
    """The contract's NaN/Inf rule on float32 logits, widened to float64."""
    finfo = torch.finfo(torch.float32)
    return torch.nan_to_num(logits.float(), nan=finfo.min, posinf=finfo.max, neginf=finfo.min).double()


def route_loop(logits: torch.Tensor, k: int, capacity: int | None, score: str = "softmax"):
    """The routing contract written as loops over float64 scores: ids, weights, dropped, counts, grouping."""
    x = sanitized(logits)
    scores = torch.softmax(x, dim=-1) if score == "softmax" else torch.sigmoid(x)
    num_tokens, num_experts = logits.shape
    ids, weights = [], []
    for row in scores.tolist():
        ranked = sorted(range(num_experts), key=lambda e: (-row[e], e))[:k]
        total = sum(row[e] for e in ranked)
        ids.append(ranked)
        weights.append([row[e] / total for e in ranked])
    dropped = [[False] * k for _ in range(num_tokens)]
    load = [0] * num_experts
    for j in range(k):
        for t in range(num_tokens):
            e = ids[t][j]
            if capacity is not None and load[e] >= capacity:
                dropped[t][j] = True
            else:
                load[e] += 1
    grouped = [
        t * k + j
        for e in range(num_experts)
        for t in range(num_tokens)
        for j in range(k)
        if ids[t][j] == e and not dropped[t][j]
    ]
    return {
        "ids": ids,
        "weights": torch.tensor(weights, dtype=torch.float64).reshape(num_tokens, k),
        "dropped": dropped,
        "counts": load,
        "offsets": [sum(load[:e]) for e in range(num_experts + 1)],
        "source_index": grouped,
    }


def moe_forward(ops, x, router, experts, k, capacity):
    """A routed MoE layer from routing ops: route, permute, one linear map per expert, unpermute."""
    plan = ops.route(x @ router, k, capacity)
    grouped = ops.permute(x, plan)
    offsets = plan.expert_offsets.tolist()
    outputs = [grouped[offsets[e] : offsets[e + 1]] @ experts[e] for e in range(experts.shape[0])]
    return ops.unpermute(torch.cat(outputs), plan)
