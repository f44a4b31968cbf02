"""cuda_ext.moe_routing against the contract (float64 loops) and the PyTorch reference, on the CPU kernels.

These run on every machine: the CPU kernels are always built. The CUDA kernels get the same checks in
test_gpu.py when a GPU is present.
"""

from __future__ import annotations

import pytest
import torch

from cuda_ext import kernels, moe_routing
from pipeline.model import routing as reference
from tests.cuda_ext.references import route_loop, sanitized

INT_FIELDS = ("expert_ids", "dropped", "expert_counts", "expert_offsets", "source_index")


def assert_same_plan(plan, expected) -> None:
    """Integer outputs equal exactly (values and dtypes); weights close."""
    for name in INT_FIELDS:
        got, want = getattr(plan, name), getattr(expected, name)
        assert got.dtype == want.dtype, name
        assert torch.equal(got, want), f"{name}: {got.tolist()} != {want.tolist()}"
    assert plan.weights.dtype == torch.float32
    torch.testing.assert_close(plan.weights, expected.weights, rtol=2e-6, atol=1e-7)


def assert_matches_loop(plan, logits, k, capacity, score="softmax") -> None:
    want = route_loop(logits, k, capacity, score)
    assert plan.expert_ids.tolist() == want["ids"]
    assert plan.dropped.tolist() == want["dropped"]
    assert plan.expert_counts.tolist() == want["counts"]
    assert plan.expert_offsets.tolist() == want["offsets"]
    assert plan.source_index.tolist() == want["source_index"]
    torch.testing.assert_close(plan.weights.double(), want["weights"], rtol=1e-5, atol=1e-7)


CASES = [
    # tokens, experts, k, capacity factor
    (0, 4, 2, 1.0),
    (0, 5, 3, None),
    (1, 3, 1, None),
    (1, 7, 7, 1.0),
    (37, 6, 2, 1.0),
    (50, 7, 3, 0.5),
    (64, 8, 8, 1.25),
    (97, 13, 4, 0.3),
    (300, 12, 5, None),
    (260, 3, 1, 0.8),
    (129, 10, 6, 0.7),
]


@pytest.mark.parametrize(("num_tokens", "num_experts", "k", "factor"), CASES)
@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_route_matches_contract_and_reference(num_tokens, num_experts, k, factor, score):
    torch.manual_seed(1000 * num_tokens + 10 * num_experts + k)
    logits = torch.randn(num_tokens, num_experts) * 3
    capacity = reference.expert_capacity(num_tokens, num_experts, k, factor)
    plan = moe_routing.route(logits, k, capacity, score)
    assert isinstance(plan, reference.RoutingPlan)
    assert_same_plan(plan, reference.route(logits, k, capacity, score))
    assert_matches_loop(plan, logits, k, capacity, score)


@pytest.mark.parametrize("k", range(1, 9))
def test_every_k_from_one_to_eight(k):
    torch.manual_seed(k)
    logits = torch.randn(45, 11)
    capacity = reference.expert_capacity(45, 11, k, 1.0)
    assert_same_plan(moe_routing.route(logits, k, capacity), reference.route(logits, k, capacity))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_logit_dtypes(dtype):
    torch.manual_seed(7)
    logits = (torch.randn(70, 9) * 2).to(dtype)
    plan = moe_routing.route(logits, 3, 20)
    assert_same_plan(plan, reference.route(logits, 3, 20))


def test_an_expert_without_tokens_gets_an_empty_group():
    torch.manual_seed(3)
    logits = torch.randn(40, 6)
    logits[:, 4] = -50.0  # never among the top 2
    plan = moe_routing.route(logits, 2, None)
    assert plan.expert_counts[4] == 0
    assert plan.expert_offsets[4] == plan.expert_offsets[5]
    assert_same_plan(plan, reference.route(logits, 2, None))


def test_capacity_overflow_drops_in_admission_order():
    torch.manual_seed(4)
    logits = torch.randn(60, 5)
    logits[:, 1] += 4.0  # expert 1 is everyone's first choice and overflows
    capacity = 7
    plan = moe_routing.route(logits, 2, capacity)
    assert plan.expert_counts.max() <= capacity
    assert plan.dropped.any()
    # First choices are admitted in token order: the first `capacity` tokens keep expert 1.
    first_choice_kept = ~plan.dropped[:, 0] & (plan.expert_ids[:, 0] == 1)
    assert first_choice_kept.nonzero().squeeze(1).tolist() == list(range(capacity))
    assert_same_plan(plan, reference.route(logits, 2, capacity))
    assert_matches_loop(plan, logits, 2, capacity)


@pytest.mark.parametrize("capacity", [0, -3])
def test_zero_or_negative_capacity_drops_everything(capacity):
    logits = torch.randn(12, 4)
    plan = moe_routing.route(logits, 2, capacity)
    assert plan.dropped.all() and plan.source_index.numel() == 0
    assert_same_plan(plan, reference.route(logits, 2, capacity))


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_forced_ties_go_to_the_lower_expert(score):
    torch.manual_seed(5)
    logits = torch.randint(-1, 2, (90, 7)).float()  # three distinct values: ties everywhere
    plan = moe_routing.route(logits, 3, 30, score)
    assert_same_plan(plan, reference.route(logits, 3, 30, score))
    assert_matches_loop(plan, logits, 3, 30, score)
    assert moe_routing.route(torch.full((1, 5), 0.5), 3).expert_ids.tolist() == [[0, 1, 2]]


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_nan_and_inf_logits_give_finite_weights_and_valid_ids(score):
    torch.manual_seed(6)
    logits = torch.randn(80, 9)
    special = torch.tensor([float("nan"), float("inf"), -float("inf")])
    mask = torch.rand(80, 9) < 0.3
    logits[mask] = special[torch.randint(0, 3, (int(mask.sum()),))]
    logits[0] = float("nan")
    logits[1] = float("inf")
    logits[2] = -float("inf")
    logits[3, :4] = float("inf")
    plan = moe_routing.route(logits, 4, 40, score)
    assert torch.isfinite(plan.weights).all()
    assert ((plan.expert_ids >= 0) & (plan.expert_ids < 9)).all()
    assert_same_plan(plan, reference.route(logits, 4, 40, score))
    assert plan.expert_ids[0].tolist() == [0, 1, 2, 3]


def test_route_weights_gradient_matches_reference_and_float64():
    torch.manual_seed(8)
    logits = torch.randn(33, 7) * 2
    logits[0, 3] = float("nan")
    logits[1, 2] = float("inf")
    grad_weights = torch.randn(33, 3)
    for score in ("softmax", "sigmoid"):
        mine = logits.clone().requires_grad_()
        plan = moe_routing.route(mine, 3, 10, score)
        (plan.weights * grad_weights).sum().backward()

        ref = logits.clone().requires_grad_()
        (reference.route(ref, 3, 10, score).weights * grad_weights).sum().backward()
        torch.testing.assert_close(mine.grad, ref.grad, rtol=1e-5, atol=1e-6)

        # float64: scores of the sanitized logits, the same chosen experts, renormalised.
        x = sanitized(logits).requires_grad_()
        scores = torch.softmax(x, -1) if score == "softmax" else torch.sigmoid(x)
        top = scores.gather(1, plan.expert_ids.long())
        ((top / top.sum(-1, keepdim=True)) * grad_weights.double()).sum().backward()
        expected = x.grad * torch.isfinite(logits)
        torch.testing.assert_close(mine.grad.double(), expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hidden_size", [8, 13])
def test_permute_and_unpermute_against_float64(dtype, hidden_size):
    torch.manual_seed(9)
    logits = torch.randn(50, 6)
    plan = moe_routing.route(logits, 2, 12)
    hidden = torch.randn(50, hidden_size).to(dtype)
    grouped = moe_routing.permute(hidden, plan)
    assert torch.equal(grouped, reference.permute(hidden, plan)), "a gather copies rows exactly"

    rows = torch.randn(plan.source_index.numel(), hidden_size).to(dtype)
    combined = moe_routing.unpermute(rows, plan)
    assert combined.dtype == dtype and combined.shape == (50, hidden_size)
    expected = torch.zeros(50, hidden_size, dtype=torch.float64)
    tokens = plan.source_index.long() // 2
    weights = plan.weights.reshape(-1)[plan.source_index.long()].double()
    expected.index_add_(0, tokens, rows.double() * weights[:, None])
    tol = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(combined.double(), expected, rtol=tol, atol=tol)


def test_permute_keeps_trailing_dims_and_accepts_reference_plans():
    torch.manual_seed(10)
    logits = torch.randn(20, 5)
    ref_plan = reference.route(logits, 2, 6)
    hidden = torch.randn(20, 3, 4, dtype=torch.float64)
    assert torch.equal(moe_routing.permute(hidden, ref_plan), reference.permute(hidden, ref_plan))
    rows = torch.randn(ref_plan.source_index.numel(), 4, dtype=torch.float64)
    torch.testing.assert_close(moe_routing.unpermute(rows, ref_plan), reference.unpermute(rows, ref_plan))


def test_permute_unpermute_gradcheck_float64():
    torch.manual_seed(11)
    plan = moe_routing.route(torch.randn(15, 5), 3, 7)
    hidden = torch.randn(15, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda h: moe_routing.permute(h, plan), (hidden,))
    rows = torch.randn(plan.source_index.numel(), 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda r: moe_routing.unpermute(r, plan), (rows,))


def test_unpermute_weight_gradient_matches_reference():
    torch.manual_seed(12)
    logits = torch.randn(25, 6)
    grads = []
    for ops in (moe_routing, reference):
        leaf = logits.clone().requires_grad_()
        plan = ops.route(leaf, 2, 6)
        torch.manual_seed(13)
        rows = torch.randn(plan.source_index.numel(), 5, dtype=torch.float64)
        out = ops.unpermute(rows, plan)
        (out * torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view_as(out)).sum().backward()
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)


def test_empty_inputs():
    plan = moe_routing.route(torch.randn(0, 4), 2, 0)
    assert plan.expert_counts.tolist() == [0] * 4 and plan.expert_offsets.tolist() == [0] * 5
    assert moe_routing.permute(torch.randn(0, 8), plan).shape == (0, 8)
    assert moe_routing.unpermute(torch.randn(0, 8), plan).shape == (0, 8)


def test_routing_ops_picks_the_extension():
    assert moe_routing.is_available()
    ops = reference.routing_ops(use_extension=True)
    assert ops.name == "cuda_ext" and ops.route is moe_routing.route
    assert reference.routing_ops(use_extension=False) is reference.REFERENCE_OPS


# Failure paths: every bad input names itself.


def test_route_rejects_bad_arguments():
    logits = torch.randn(10, 4)
    with pytest.raises(ValueError, match="top_k"):
        moe_routing.route(logits, 5)
    with pytest.raises(ValueError, match="top_k"):
        moe_routing.route(logits, 0)
    with pytest.raises(ValueError, match="router score"):
        moe_routing.route(logits, 2, score="relu")
    with pytest.raises(TypeError, match="logits must have dtype"):
        moe_routing.route(torch.randint(0, 3, (10, 4)), 2)
    with pytest.raises(ValueError, match=r"\[tokens, experts\]"):
        moe_routing.route(torch.randn(10), 2)
    with pytest.raises(ValueError, match="CPU or CUDA"):
        moe_routing.route(torch.randn(10, 4, device="meta"), 2)


def test_permute_and_unpermute_reject_mismatched_shapes():
    plan = moe_routing.route(torch.randn(10, 4), 2)
    with pytest.raises(ValueError, match="10 rows"):
        moe_routing.permute(torch.randn(9, 3), plan)
    with pytest.raises(ValueError, match="N = 20"):
        moe_routing.unpermute(torch.randn(19, 3), plan)
    with pytest.raises(TypeError, match="dtype"):
        moe_routing.permute(torch.ones(10, 3, dtype=torch.int64), plan)


def test_kernel_layer_checks_contiguity_alignment_dtype_and_device():
    source_index = torch.zeros(4, dtype=torch.int32)
    base = torch.randn(8, 9)
    with pytest.raises(ValueError, match="contiguous"):
        kernels.permute_rows(base.t(), source_index, 2)
    misaligned = torch.randn(73)[1:].view(8, 9)  # starts 4 bytes into its allocation
    assert misaligned.is_contiguous()
    with pytest.raises(ValueError, match="16-byte"):
        kernels.permute_rows(misaligned, source_index, 2)
    with pytest.raises(TypeError, match="source_index must have dtype int32"):
        kernels.permute_rows(base, source_index.long(), 2)
    with pytest.raises(ValueError, match="expected cpu"):
        kernels.permute_rows(base, torch.zeros(4, dtype=torch.int32, device="meta"), 2)
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        kernels.permute_rows(base.numpy(), source_index, 2)
    # The contract layer copies such views instead of failing.
    plan = moe_routing.route(torch.randn(8, 3), 2)
    assert torch.equal(moe_routing.permute(misaligned, plan), misaligned[plan.token_index])


def test_gemm_wrapper_rejects_what_it_cannot_run():
    a = torch.randn(16, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA tensors only"):
        kernels.gemm(a, torch.randn(8, 4, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="b must have dtype bfloat16"):
        kernels.gemm(a, torch.randn(8, 4, dtype=torch.float16))
    with pytest.raises(TypeError, match="a must have dtype"):
        kernels.gemm(a.float(), torch.randn(8, 4))
    with pytest.raises(ValueError, match="inner dimensions"):
        kernels.gemm(a, torch.randn(9, 4, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="out_dtype"):
        kernels.gemm(a, torch.randn(8, 4, dtype=torch.bfloat16), torch.float16)
