"""cuda_ext on a GPU: build, check, then time the kernels against their PyTorch baselines (issue 10).

    python benchmarks/gpu_kernels.py            # on an H200 (or any sm_80+ GPU); under 5 minutes
    python benchmarks/gpu_kernels.py --dry-run  # on CPU: the same flow on small CPU shapes, GPU figures null
                                                # (also --smoke, what tests/benchmarks runs)

Steps:
1. build  - unless cuda_ext._C already has its CUDA kernels, `setup.py build_ext --inplace` with
            PRETRAIN_BUILD_CUDA=1 (sm_90 only, to keep it quick); needs no pip and no internet.
2. check  - GEMM vs torch.matmul on odd and square shapes; CUDA routing equal to the CPU kernels and the
            PyTorch reference (ids, counts, offsets, permutation exactly); MoE layer gradients close.
3. time   - CUDA events, medians: GEMM TFLOP/s vs torch.matmul (cuBLAS) at 4096^3 and 8192^3 bf16, for the
            kernel `auto` picks (what callers get) and for each kernel forced; routing
            (route forward, capacity factor 1.25) vs the unfused PyTorch reference for T in {1k, 16k, 128k},
            E in {8, 64}, k in {2, 8}; the model's MoE layer (pipeline.model.gpt.MoE) forward + backward
            with the extension and with the PyTorch reference routing.

Prints a table, writes everything to benchmarks/out/gpu_kernels.json, and ends with one JSON line:
{"gemm_frac_of_cublas_4096": ..., "gemm_frac_of_cublas_8192": ..., "routing_speedup_t16k": ...} (the GEMM
fractions are the `auto` kernel's; routing: geometric mean over E and k at T = 16k).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run from a checkout without installing it; as a script this folder is sys.path[0], so the root replaces it.
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [str(ROOT)] + [e for e in sys.path if os.path.abspath(e or os.curdir) != _HERE]

import torch  # noqa: E402

from benchmarks.smoke import HELP as SMOKE_HELP  # noqa: E402

CAPACITY_FACTOR = 1.25
GEMM_KERNELS = ("mma_128x256", "mma_128x128", "wmma_128x256")  # each forced, beside `auto`


def has_cuda_kernels_fresh() -> bool:
    """Asks a fresh interpreter, so a rebuild below is picked up by this one's first import."""
    probe = "import cuda_ext._C as c; print(bool(c.WITH_CUDA))"
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    return result.returncode == 0 and result.stdout.strip() == "True"


def build(force: bool) -> float | None:
    if not force and has_cuda_kernels_fresh():
        print("build: cuda_ext._C already has its CUDA kernels")
        return None
    env = {
        **os.environ,
        "PRETRAIN_BUILD_CUDA": "1",
        "PRETRAIN_CUDA_ARCHS": os.environ.get("PRETRAIN_CUDA_ARCHS", "90"),
    }
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=ROOT, env=env, check=True
    )
    seconds = time.perf_counter() - start
    print(f"build: compiled CPU + CUDA kernels in {seconds:.1f} s")
    return seconds


def median_ms(fn: Callable[[], object], device: str, warmup: int = 3, reps: int = 15) -> float:
    for _ in range(warmup):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def same_plan(a, b) -> bool:
    fields = ("expert_ids", "dropped", "expert_counts", "expert_offsets", "source_index")
    ints = all(torch.equal(getattr(a, f).cpu(), getattr(b, f).cpu()) for f in fields)
    return ints and torch.allclose(a.weights.cpu(), b.weights.cpu(), rtol=2e-6, atol=1e-7)


class MoELayer(torch.nn.Module):
    """Router + top-k routing + per-expert GELU MLPs + weighted combine, on any routing ops."""

    def __init__(self, ops, hidden: int, ffn: int, experts: int, k: int, dtype, device) -> None:
        super().__init__()
        self.ops, self.k = ops, k
        factory = dict(dtype=dtype, device=device)
        self.router = torch.nn.Parameter(torch.randn(hidden, experts, **factory) * hidden**-0.5)
        self.w_in = torch.nn.Parameter(torch.randn(experts, hidden, ffn, **factory) * hidden**-0.5)
        self.w_out = torch.nn.Parameter(torch.randn(experts, ffn, hidden, **factory) * ffn**-0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from pipeline.model.routing import expert_capacity

        experts = self.w_in.shape[0]
        capacity = expert_capacity(x.shape[0], experts, self.k, CAPACITY_FACTOR)
        plan = self.ops.route(x @ self.router, self.k, capacity)
        grouped = self.ops.permute(x, plan)
        offsets = plan.expert_offsets.tolist()
        outputs = [
            torch.nn.functional.gelu(grouped[offsets[e] : offsets[e + 1]] @ self.w_in[e]) @ self.w_out[e]
            for e in range(experts)
        ]
        return self.ops.unpermute(torch.cat(outputs), plan)


def check(device: str) -> dict[str, bool]:
    from cuda_ext import gemm, kernels, moe_routing
    from pipeline.model import routing as reference

    results = {}
    torch.manual_seed(0)
    if device == "cuda":
        ok = True
        for m, n, k in [(129, 257, 33), (1000, 520, 300), (4096, 4096, 4096)]:
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
            want = a.float() @ b.float()
            ok &= torch.allclose(gemm.matmul(a, b, torch.float32), want, rtol=1e-3, atol=1e-2 * k**0.5)
            for kernel in GEMM_KERNELS:
                try:
                    got = kernels.gemm(a, b, torch.float32, kernel=kernel)
                except ValueError:  # the mma kernels refuse K or N not a multiple of 8
                    continue
                ok &= torch.allclose(got, want, rtol=1e-3, atol=1e-2 * k**0.5)
        results["gemm_matches_torch"] = bool(ok)
    tokens = 16384 if device == "cuda" else 2048
    logits = torch.randn(tokens, 64) * 2
    capacity = reference.expert_capacity(tokens, 64, 8, CAPACITY_FACTOR)
    mine = moe_routing.route(logits.to(device), 8, capacity)
    results["routing_matches_reference"] = same_plan(mine, reference.route(logits.to(device), 8, capacity))
    if device == "cuda":
        results["routing_matches_cpu_kernels"] = same_plan(mine, moe_routing.route(logits, 8, capacity))

    grads = []
    for ops in (moe_routing, reference):
        torch.manual_seed(1)
        layer = MoELayer(ops, 64, 128, 8, 2, torch.float64, device)
        x = torch.randn(512, 64, dtype=torch.float64, device=device, requires_grad=True)
        layer(x).square().sum().backward()
        grads.append([x.grad, layer.router.grad, layer.w_in.grad, layer.w_out.grad])
    results["moe_gradients_match_reference"] = all(
        torch.allclose(g, w, rtol=1e-5, atol=1e-6 * max(1.0, float(w.abs().max())))
        for g, w in zip(*grads, strict=True)
    )
    return results


def time_gemm() -> list[dict]:
    """TFLOP/s of `auto` (gemm.matmul, what callers get) and of each kernel forced, against cuBLAS."""
    from cuda_ext import gemm, kernels

    rows = []
    for size in (4096, 8192):
        a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        flops = 2 * size**3
        cublas = median_ms(lambda a=a, b=b: torch.matmul(a, b), "cuda", warmup=5, reps=20)
        ours = median_ms(lambda a=a, b=b: gemm.matmul(a, b), "cuda", warmup=5, reps=20)
        per_kernel = {}
        for kernel in GEMM_KERNELS:
            ms = median_ms(lambda a=a, b=b, k=kernel: kernels.gemm(a, b, kernel=k), "cuda", warmup=3, reps=10)
            per_kernel[kernel] = {"tflops": flops / ms / 1e9, "frac_of_cublas": cublas / ms}
        rows.append(
            {
                "size": size,
                "auto_kernel": kernels.gemm_kernel_for(size, size, size),
                "auto_tflops": flops / ours / 1e9,
                "cublas_tflops": flops / cublas / 1e9,
                "frac_of_cublas": cublas / ours,
                "kernels": per_kernel,
            }
        )
        del a, b
    return rows


def time_routing(device: str, smoke: bool = False) -> list[dict]:
    from cuda_ext import moe_routing
    from pipeline.model import routing as reference

    token_counts = (256,) if smoke else (1024, 16384, 131072) if device == "cuda" else (1024, 4096)
    rows = []
    for tokens in token_counts:
        for experts in (8, 64):
            for k in (2, 8):
                logits = torch.randn(tokens, experts, device=device)
                capacity = reference.expert_capacity(tokens, experts, k, CAPACITY_FACTOR)
                reps = 15 if device == "cuda" else 3
                ref_ms = median_ms(
                    lambda x=logits, k=k, c=capacity: reference.route(x, k, c), device, reps=reps
                )
                ext_ms = median_ms(
                    lambda x=logits, k=k, c=capacity: moe_routing.route(x, k, c), device, reps=reps
                )
                rows.append(
                    {
                        "tokens": tokens,
                        "experts": experts,
                        "k": k,
                        "reference_ms": ref_ms,
                        "cuda_ext_ms": ext_ms,
                        "speedup": ref_ms / ext_ms,
                    }
                )
    return rows


def time_moe_layer(device: str, smoke: bool = False) -> list[dict]:
    """The model's MoE layer (pipeline.model.gpt.MoE), forward + backward, with each routing backend."""
    from pipeline.model.config import GPTConfig
    from pipeline.model.gpt import MoE

    if device == "cuda":
        tokens, hidden, ffn, experts, k, dtype = 16384, 1024, 2816, 8, 2, torch.bfloat16
    else:
        tokens, hidden, ffn, experts, k, dtype = 256 if smoke else 1024, 64, 128, 8, 2, torch.float32
    rows = []
    for fused in (False, True):
        config = GPTConfig(
            hidden_size=hidden,
            num_attention_heads=8,
            num_key_value_heads=8,
            num_experts=experts,
            moe_top_k=k,
            moe_intermediate_size=ffn,
            moe_capacity_factor=CAPACITY_FACTOR,
            moe_fused_routing=fused,
        )
        torch.manual_seed(2)
        layer = MoE(config).to(device=device, dtype=dtype)
        x = torch.randn(tokens, hidden, dtype=dtype, device=device, requires_grad=True)

        def step(layer=layer, x=x):
            layer.zero_grad(set_to_none=True)
            x.grad = None
            out, aux_loss, z_loss = layer(x)
            (out.float().square().mean() + aux_loss + z_loss).backward()

        ms = median_ms(step, device, warmup=2, reps=10 if device == "cuda" else 3)
        rows.append(
            {
                "routing": layer.ops.name,
                "tokens": tokens,
                "hidden": hidden,
                "experts": experts,
                "k": k,
                "fwd_bwd_ms": ms,
            }
        )
    return rows


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="run the flow on CPU; GPU figures are null")
    parser.add_argument(
        "--rebuild", action="store_true", help="rebuild the extension even if it has CUDA kernels"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "gpu_kernels.json")
    # The dry run's flow and checks, timing the smallest shapes only.
    parser.add_argument("--smoke", action="store_true", help=f"--dry-run, smaller: {SMOKE_HELP}")
    args = parser.parse_args(argv)

    device = "cpu" if args.dry_run or args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device: run on a GPU machine, or use --dry-run")
    report: dict = {"device": device, "torch": torch.__version__}
    if device == "cuda":
        report["card"] = torch.cuda.get_device_name()
        report["build_seconds"] = build(args.rebuild)
    from cuda_ext import kernels

    if device == "cuda" and not kernels.has_cuda_kernels():
        sys.exit("cuda_ext._C has no CUDA kernels after the build step")

    report["checks"] = check(device)
    print("checks:", ", ".join(f"{name}={'ok' if ok else 'FAILED'}" for name, ok in report["checks"].items()))
    report["gemm"] = time_gemm() if device == "cuda" else []
    for row in report["gemm"]:
        print(
            f"gemm {row['size']}^3 bf16: auto ({row['auto_kernel']}) {row['auto_tflops']:.0f} TFLOP/s, cuBLAS"
            f" {row['cublas_tflops']:.0f} TFLOP/s, fraction {row['frac_of_cublas']:.2f}; "
            + ", ".join(f"{name} {v['frac_of_cublas']:.2f}" for name, v in row["kernels"].items())
        )
    report["routing"] = time_routing(device, args.smoke)
    print(f"{'tokens':>7} {'E':>3} {'k':>2} {'reference ms':>13} {'cuda_ext ms':>12} {'speedup':>8}")
    for row in report["routing"]:
        print(
            f"{row['tokens']:>7} {row['experts']:>3} {row['k']:>2} {row['reference_ms']:>13.3f}"
            f" {row['cuda_ext_ms']:>12.3f} {row['speedup']:>8.2f}"
        )
    report["moe_layer"] = time_moe_layer(device, args.smoke)
    for row in report["moe_layer"]:
        print(f"MoE layer fwd+bwd ({row['routing']} routing, T={row['tokens']}): {row['fwd_bwd_ms']:.2f} ms")

    at_16k = [row["speedup"] for row in report["routing"] if row["tokens"] == 16384]
    gemm_frac = {row["size"]: round(row["frac_of_cublas"], 3) for row in report["gemm"]}
    summary = {
        "gemm_frac_of_cublas_4096": gemm_frac.get(4096),
        "gemm_frac_of_cublas_8192": gemm_frac.get(8192),
        "routing_speedup_t16k": round(geometric_mean(at_16k), 2) if at_16k else None,
    }
    report["summary"] = summary
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    if not all(report["checks"].values()):
        print("some checks FAILED: the timings above are not trustworthy", file=sys.stderr)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
