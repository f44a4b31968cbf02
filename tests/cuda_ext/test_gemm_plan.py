"""Which GEMM kernel `auto` picks (csrc/gemm_plan.h, through the built module) and the wrapper's kernel
argument, on CPU. The kernels themselves run in test_gpu.py; their index maps are checked in test_gemm_layout.py."""

from __future__ import annotations

import pytest
import torch

from cuda_ext import kernels

# (SM count, opt-in shared memory per block) of the GPUs the build targets.
H100 = (132, 232448)  # H100/H200 SXM, sm_90
A100 = (108, 166912)  # sm_80
RTX_3090 = (82, 101376)  # sm_86: 99 KiB per block


def chosen(m: int, n: int, k: int, device: tuple[int, int] = H100) -> str:
    native = kernels.native()
    return native.GEMM_KERNELS[native.choose_gemm_kernel(m, n, k, *device)]


def test_kernel_table_matches_the_wrapper_codes():
    names = kernels.native().GEMM_KERNELS
    assert {name: code for code, name in enumerate(names)} == {
        name: code for name, code in kernels.GEMM_KERNEL_CODES.items() if name != "auto"
    }
    assert kernels.GEMM_KERNEL_CODES["auto"] == -1


@pytest.mark.parametrize(
    ("shape", "kernel"),
    [
        ((4096, 4096, 4096), "mma_128x256"),  # 512 tiles of 128x256 on 132 SMs
        ((8192, 8192, 8192), "mma_128x256"),
        ((16384, 2048, 1024), "mma_128x256"),  # 128 x 8 tiles
        ((2048, 2048, 2048), "mma_128x128"),  # 128 tiles of 128x256 < 132 SMs
        ((300, 520, 1000), "mma_128x128"),
        ((1000, 40, 72), "mma_128x128"),
        ((64, 64, 0), "mma_128x128"),
        ((1, 8, 8), "mma_128x128"),
        ((7, 13, 5), "wmma_128x256"),  # K and N not multiples of 8: no 16-byte copies
        ((200, 24, 100), "wmma_128x256"),  # K % 8 == 4
        ((4096, 4100, 4096), "wmma_128x256"),  # N % 8 == 4
        ((4096, 4096, 4095), "wmma_128x256"),
    ],
)
def test_auto_picks_the_kernel_for_the_shape_on_h100(shape, kernel):
    assert chosen(*shape) == kernel


def test_auto_follows_the_device_limits():
    assert chosen(4096, 4096, 4096, A100) == "mma_128x256"  # 144 KiB fits sm_80's 163 KiB
    assert chosen(2048, 1024, 4096, A100) == "mma_128x128"  # 64 tiles < 108 SMs
    assert chosen(4096, 4096, 4096, RTX_3090) == "mma_128x128"  # 144 KiB does not fit, 96 KiB does
    assert chosen(4096, 4096, 4096, (80, 65536)) == "wmma_128x256"  # last resort, whatever it needs


def test_kernel_support_rules():
    native = kernels.native()
    codes = kernels.GEMM_KERNEL_CODES
    for name in ("mma_128x256", "mma_128x128"):
        assert native.gemm_kernel_supports(codes[name], 64, 64, H100[1])
        assert native.gemm_kernel_supports(codes[name], 8, 0, H100[1])
        assert not native.gemm_kernel_supports(codes[name], 64, 60, H100[1])  # K % 8
        assert not native.gemm_kernel_supports(codes[name], 60, 64, H100[1])  # N % 8
    assert native.gemm_kernel_supports(codes["wmma_128x256"], 13, 5, H100[1])
    assert not native.gemm_kernel_supports(codes["mma_128x256"], 64, 64, RTX_3090[1])
    assert native.gemm_kernel_supports(codes["mma_128x128"], 64, 64, RTX_3090[1])
    assert not native.gemm_kernel_supports(7, 64, 64, H100[1])


def test_gemm_rejects_an_unknown_kernel_name():
    a = torch.randn(8, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="unknown gemm kernel 'fastest'"):
        kernels.gemm(a, a, kernel="fastest")
