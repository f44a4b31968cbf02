"""A routed MoE layer (router, routing, per-expert linear maps, weighted combine) built on the extension's
ops gives the reference's output and gradients for every parameter, and trains."""

from __future__ import annotations

import pytest
import torch

from cuda_ext import moe_routing
from pipeline.model import routing as reference
from tests.cuda_ext.references import moe_forward


def layer_grads(ops, x, router, experts, k, capacity, upstream):
    leaves = [t.clone().requires_grad_() for t in (x, router, experts)]
    out = moe_forward(ops, *leaves, k, capacity)
    (out * upstream).sum().backward()
    return out.detach(), [leaf.grad for leaf in leaves]


@pytest.mark.parametrize(("k", "capacity"), [(1, None), (2, 9), (3, None), (4, 6)])
def test_moe_layer_gradients_match_reference(k, capacity):
    torch.manual_seed(20 + k)
    tokens, hidden, num_experts = 40, 12, 6
    x = torch.randn(tokens, hidden, dtype=torch.float64)
    router = torch.randn(hidden, num_experts, dtype=torch.float64) / hidden**0.5
    experts = torch.randn(num_experts, hidden, hidden, dtype=torch.float64) / hidden**0.5
    upstream = torch.randn(tokens, hidden, dtype=torch.float64)
    got_out, got = layer_grads(moe_routing, x, router, experts, k, capacity, upstream)
    want_out, want = layer_grads(reference, x, router, experts, k, capacity, upstream)
    # The reference multiplies by the fp32 weights in fp32; the kernels accumulate fp64 rows in fp64.
    torch.testing.assert_close(got_out, want_out, rtol=1e-6, atol=1e-6)
    # Routing scores are float32 in both (the contract), so gradients through them carry float32 rounding,
    # which cancellation can expose in small entries: compare those at the scale of the largest entry.
    for name, g, w in zip(("x", "router", "experts"), got, want, strict=True):
        assert g is not None, name
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6 * max(1.0, float(w.abs().max())), msg=name)


def test_moe_layer_gradcheck_through_experts_and_tokens():
    """Numerical gradients (float64) of the layer with the routing decisions held fixed."""
    torch.manual_seed(30)
    tokens, hidden, num_experts, k = 10, 4, 3, 2
    plan = moe_routing.route(torch.randn(tokens, num_experts), k, 6)
    offsets = plan.expert_offsets.tolist()

    def layer(x, experts):
        grouped = moe_routing.permute(x, plan)
        outputs = [grouped[offsets[e] : offsets[e + 1]] @ experts[e] for e in range(num_experts)]
        return moe_routing.unpermute(torch.cat(outputs), plan)

    x = torch.randn(tokens, hidden, dtype=torch.float64, requires_grad=True)
    experts = torch.randn(num_experts, hidden, hidden, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer, (x, experts))


def test_moe_layer_trains_with_the_extension():
    torch.manual_seed(31)
    tokens, hidden, num_experts = 64, 8, 4
    x = torch.randn(tokens, hidden)
    target = torch.randn(tokens, hidden)
    router = torch.nn.Parameter(torch.randn(hidden, num_experts) * 0.1)
    experts = torch.nn.Parameter(torch.randn(num_experts, hidden, hidden) * 0.1)
    optimizer = torch.optim.Adam([router, experts], lr=0.05)
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(moe_forward(moe_routing, x, router, experts, 2, None), target)
        loss.backward()
        assert router.grad.abs().sum() > 0, "the router learns through the routing weights"
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]
