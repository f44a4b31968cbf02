"""The routing contract, checked against a plain-Python loop written from the contract's words."""

import math

import pytest
import torch

from pipeline.model.routing import expert_capacity, permute, route, unpermute


def loop_reference(logits: torch.Tensor, k: int, capacity: int | None):
    probs = torch.softmax(logits.double(), dim=-1).tolist()
    num_tokens, num_experts = logits.shape
    choices = []
    for row in probs:
        ranked = sorted(range(num_experts), key=lambda e: (-row[e], e))[:k]
        total = sum(row[e] for e in ranked)
        choices.append([(e, row[e] / total) for e in ranked])
    admitted = [[0] * num_experts]
    dropped = [[False] * k for _ in range(num_tokens)]
    load = [0] * num_experts
    for j in range(k):
        for t in range(num_tokens):
            expert = choices[t][j][0]
            if capacity is not None and load[expert] >= capacity:
                dropped[t][j] = True
            else:
                load[expert] += 1
    del admitted
    grouped = [
        t * k + j
        for e in range(num_experts)
        for t in range(num_tokens)
        for j in range(k)
        if choices[t][j][0] == e and not dropped[t][j]
    ]
    return choices, dropped, load, grouped


@pytest.mark.parametrize(
    ("num_tokens", "num_experts", "k", "factor"),
    [(0, 4, 2, 1.0), (1, 3, 1, None), (37, 6, 2, 1.0), (50, 7, 3, 0.5), (64, 8, 8, 1.25)],
)
def test_route_matches_loop_reference(num_tokens, num_experts, k, factor):
    torch.manual_seed(num_tokens + num_experts)
    logits = torch.randn(num_tokens, num_experts) * 2
    capacity = expert_capacity(num_tokens, num_experts, k, factor)
    plan = route(logits, k, capacity)
    choices, dropped, load, grouped = loop_reference(logits, k, capacity)
    assert plan.expert_ids.tolist() == [[e for e, _ in row] for row in choices]
    torch.testing.assert_close(
        plan.weights.double(),
        torch.tensor([[w for _, w in row] for row in choices], dtype=torch.double).reshape(num_tokens, k),
        rtol=1e-5,
        atol=1e-6,
    )
    assert plan.dropped.tolist() == dropped
    assert plan.expert_counts.tolist() == load
    assert plan.expert_offsets.tolist() == [0, *[sum(load[: e + 1]) for e in range(num_experts)]]
    assert plan.source_index.tolist() == grouped


def test_ties_go_to_the_lower_expert_and_nan_inf_stay_finite():
    nan, inf = float("nan"), float("inf")
    logits = torch.tensor([[1.0, 1.0, 1.0, 1.0], [nan, 2.0, 1.0, -inf], [nan] * 4, [0.0, -inf, inf, 3.0]])
    plan = route(logits, 2)
    assert plan.expert_ids.tolist()[0] == [0, 1]
    assert plan.expert_ids.tolist()[1] == [1, 2], "NaN ranks below every real logit"
    assert plan.expert_ids.tolist()[2] == [0, 1], "an all-NaN row is a four-way tie"
    assert plan.expert_ids.tolist()[3][0] == 2, "+inf wins"
    assert torch.isfinite(plan.weights).all()
    torch.testing.assert_close(plan.weights.sum(-1), torch.ones(4))


def test_permute_unpermute_equals_dense_weighted_sum():
    torch.manual_seed(0)
    logits, hidden = torch.randn(20, 5), torch.randn(20, 8, dtype=torch.float64)
    plan = route(logits, 2, capacity=None)
    expert_scale = torch.randn(5, dtype=torch.float64)
    grouped = permute(hidden, plan)
    experts_of_rows = torch.repeat_interleave(torch.arange(5), plan.expert_counts.long())
    combined = unpermute(grouped * expert_scale[experts_of_rows, None], plan)
    dense = sum(
        plan.weights[:, j, None].double() * hidden * expert_scale[plan.expert_ids[:, j].long(), None]
        for j in range(2)
    )
    torch.testing.assert_close(combined, dense)


def test_capacity_formula():
    assert expert_capacity(100, 8, 2, 1.0) == math.ceil(100 * 2 / 8)
    assert expert_capacity(100, 8, 2, None) is None


def test_reference_backend_is_the_fallback():
    from pipeline.model.routing import REFERENCE_OPS, routing_ops

    assert routing_ops(use_extension=False) is REFERENCE_OPS
    assert routing_ops(use_extension=True).name in ("pytorch", "cuda_ext")
