"""The CUDA kernels against float64 references and against the CPU kernels. Skipped without a GPU (or when
the module was built without its CUDA kernels)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cuda_ext import gemm, kernels, moe_routing
from pipeline.model import routing as reference
from tests.cuda_ext.references import moe_forward, route_loop

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and kernels.has_cuda_kernels()),
    reason="needs a CUDA GPU and cuda_ext built with its CUDA kernels",
)

INT_FIELDS = ("expert_ids", "dropped", "expert_counts", "expert_offsets", "source_index")


def assert_same_plan(got, want) -> None:
    for name in INT_FIELDS:
        a, b = getattr(got, name).cpu(), getattr(want, name).cpu()
        assert a.dtype == b.dtype, name
        assert torch.equal(a, b), name
    torch.testing.assert_close(got.weights.cpu(), want.weights.cpu(), rtol=2e-6, atol=1e-7)


GEMM_KERNELS = list(kernels.GEMM_KERNEL_CODES)  # "auto" and each kernel forced
# Edges of every tile (M, N around 128/256, K around BK = 32/64 and not a multiple of it), K % 8 != 0 or
# N % 8 != 0 (the WMMA kernel's element-wise loads; the mma kernels refuse them), K = 0.
GEMM_SHAPES = [
    (1, 1, 1),
    (7, 13, 5),
    (129, 257, 33),
    (128, 256, 32),
    (300, 520, 1000),
    (1000, 40, 72),
    (64, 64, 0),
    (1, 8, 8),
    (129, 264, 72),
    (257, 136, 200),
    (130, 392, 1096),
    (255, 128, 64),
    (384, 512, 8),
    (200, 24, 100),
]


def mma_cannot_run(kernel: str, n: int, k: int) -> bool:
    return kernel.startswith("mma_") and (n % 8 != 0 or k % 8 != 0)


def matmul(a, b, out_dtype=None, kernel="auto"):
    """The public call for "auto", the forced kernel otherwise."""
    return gemm.matmul(a, b, out_dtype) if kernel == "auto" else kernels.gemm(a, b, out_dtype, kernel=kernel)


@pytest.mark.parametrize("kernel", GEMM_KERNELS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("m", "n", "k"), GEMM_SHAPES)
def test_gemm_matches_float64_on_any_shape(kernel, dtype, m, n, k):
    torch.manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda").to(dtype)
    b = torch.randn(k, n, device="cuda").to(dtype)
    if mma_cannot_run(kernel, n, k):
        with pytest.raises(ValueError, match="multiples of 8"):
            kernels.gemm(a, b, kernel=kernel)
        return
    expected = a.double() @ b.double()
    out32 = matmul(a, b, torch.float32, kernel)
    assert out32.dtype == torch.float32 and out32.shape == (m, n)
    # fp32 accumulation of exact products: error grows like sqrt(K) ulps of the partial sums.
    torch.testing.assert_close(out32.double(), expected, rtol=1e-4, atol=1e-4 * max(1, k) ** 0.5)
    out16 = matmul(a, b, kernel=kernel)
    assert out16.dtype == dtype
    torch.testing.assert_close(out16.double(), out32.to(dtype).double(), rtol=0, atol=0)


@pytest.mark.parametrize("kernel", GEMM_KERNELS)
def test_gemm_large_square_matches_cublas(kernel):
    torch.manual_seed(0)
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(
        matmul(a, b, torch.float32, kernel), (a.float() @ b.float()), rtol=1e-3, atol=1e-2
    )


def test_gemm_many_waves_and_k_tiles_match_cublas():
    # 4096^2: 4 waves of 128x256 tiles on an H100, 64 k-tiles through the 3-stage ring.
    torch.manual_seed(1)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    want = a.float() @ b.float()
    for kernel in ("mma_128x256", "mma_128x128"):
        torch.testing.assert_close(
            kernels.gemm(a, b, torch.float32, kernel=kernel), want, rtol=1e-3, atol=2e-2
        )


def test_gemm_auto_runs_the_planned_kernel():
    native = kernels.native()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    for m, n, k in [(4096, 4096, 4096), (2048, 2048, 2048), (1000, 40, 72), (7, 13, 5)]:
        name = kernels.gemm_kernel_for(m, n, k)
        assert name in native.GEMM_KERNELS
        if (props.major, props.multi_processor_count) == (9, 132):  # H100 / H200 SXM: see test_gemm_plan.py
            want = {4096: "mma_128x256", 2048: "mma_128x128", 1000: "mma_128x128", 7: "wmma_128x256"}[m]
            assert name == want


def test_gemm_rejects_misaligned_and_cpu_inputs():
    a = torch.randn(8 * 16 + 1, device="cuda", dtype=torch.bfloat16)[1:].view(8, 16)
    with pytest.raises(ValueError, match="16-byte"):
        gemm.matmul(a, torch.randn(16, 8, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="expected cuda"):
        gemm.matmul(torch.randn(8, 16, device="cuda", dtype=torch.bfloat16), torch.randn(16, 8).bfloat16())


ROUTE_CASES = [
    (0, 4, 2, 1.0),
    (1, 3, 1, None),
    (37, 6, 2, 1.0),
    (300, 7, 3, 0.5),
    (1000, 64, 8, 1.0),
    (5000, 13, 4, 0.7),  # several 256-token chunks, uneven last chunk
    (20000, 8, 2, 1.25),
    (3000, 200, 6, None),
    (700, 1500, 2, 2.0),  # many experts: one warp per block
]


@pytest.mark.parametrize(("num_tokens", "num_experts", "k", "factor"), ROUTE_CASES)
@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_cuda_route_matches_cpu_kernels_and_reference(num_tokens, num_experts, k, factor, score):
    torch.manual_seed(num_tokens + num_experts + k)
    logits = torch.randn(num_tokens, num_experts) * 2
    capacity = reference.expert_capacity(num_tokens, num_experts, k, factor)
    got = moe_routing.route(logits.cuda(), k, capacity, score)
    assert got.weights.is_cuda and got.source_index.is_cuda
    assert_same_plan(got, moe_routing.route(logits, k, capacity, score))
    assert_same_plan(got, reference.route(logits.cuda(), k, capacity, score))
    if num_tokens <= 300:
        want = route_loop(logits, k, capacity, score)
        assert got.expert_ids.tolist() == want["ids"]
        assert got.source_index.tolist() == want["source_index"]


def test_cuda_route_ties_nan_inf_and_dtypes():
    torch.manual_seed(1)
    ties = torch.randint(-1, 2, (600, 9)).float()
    assert_same_plan(moe_routing.route(ties.cuda(), 3, 150), moe_routing.route(ties, 3, 150))
    logits = torch.randn(400, 9)
    special = torch.tensor([float("nan"), float("inf"), -float("inf")])
    mask = torch.rand(400, 9) < 0.3
    logits[mask] = special[torch.randint(0, 3, (int(mask.sum()),))]
    logits[0] = float("nan")
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        plan = moe_routing.route(logits.to(dtype).cuda(), 4, 200)
        assert torch.isfinite(plan.weights).all()
        assert_same_plan(plan, moe_routing.route(logits.to(dtype), 4, 200))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hidden_size", [64, 13])
def test_cuda_permute_unpermute_and_backward_match_cpu(dtype, hidden_size):
    torch.manual_seed(2)
    logits = torch.randn(700, 8)
    hidden = torch.randn(700, hidden_size).to(dtype)
    gpu_plan = moe_routing.route(logits.cuda(), 2, 180)
    # The same plan on the CPU: routing weights from the two devices' kernels agree only to ~2e-6, which
    # would hide float64 errors in permute/unpermute.
    cpu_plan = dataclasses.replace(
        gpu_plan, **{f.name: getattr(gpu_plan, f.name).cpu() for f in dataclasses.fields(gpu_plan)}
    )
    x_cpu = hidden.clone().requires_grad_()
    x_gpu = hidden.cuda().requires_grad_()
    grouped_cpu = moe_routing.permute(x_cpu, cpu_plan)
    grouped_gpu = moe_routing.permute(x_gpu, gpu_plan)
    assert torch.equal(grouped_gpu.cpu(), grouped_cpu)
    scale = torch.randn(grouped_cpu.shape[0], 1).to(dtype)
    out_cpu = moe_routing.unpermute(grouped_cpu * scale, cpu_plan)
    out_gpu = moe_routing.unpermute(grouped_gpu * scale.cuda(), gpu_plan)
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(out_gpu.cpu(), out_cpu, rtol=tol, atol=tol)
    upstream = torch.randn(out_cpu.shape).to(dtype)
    (out_cpu * upstream).sum().backward()
    (out_gpu * upstream.cuda()).sum().backward()
    torch.testing.assert_close(x_gpu.grad.cpu(), x_cpu.grad, rtol=tol, atol=tol)


def test_cuda_moe_layer_gradients_match_reference():
    torch.manual_seed(3)
    tokens, hidden, num_experts, k = 1500, 32, 8, 2
    x = torch.randn(tokens, hidden, dtype=torch.float64, device="cuda")
    router = torch.randn(hidden, num_experts, dtype=torch.float64, device="cuda") / hidden**0.5
    experts = torch.randn(num_experts, hidden, hidden, dtype=torch.float64, device="cuda") / hidden**0.5
    upstream = torch.randn(tokens, hidden, dtype=torch.float64, device="cuda")
    results = []
    for ops in (moe_routing, reference):
        leaves = [t.clone().requires_grad_() for t in (x, router, experts)]
        out = moe_forward(ops, *leaves, k, 400)
        (out * upstream).sum().backward()
        results.append([out.detach(), *(leaf.grad for leaf in leaves)])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * max(1.0, float(want.abs().max())))


def test_cuda_kernels_follow_the_current_stream():
    torch.manual_seed(4)
    logits = torch.randn(4096, 16, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        plan = moe_routing.route(logits, 2, None)
    torch.cuda.current_stream().wait_stream(stream)
    assert_same_plan(plan, moe_routing.route(logits.cpu(), 2, None))
