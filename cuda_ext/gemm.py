"""Tensor-core GEMM (mma.sync / nvcuda::wmma, cp.async pipelines): ``matmul(a, b)`` for CUDA fp16/bf16 matrices.

``a`` [M, K] and ``b`` [K, N] must be contiguous, 16-byte aligned, on one CUDA device and of one dtype
(float16 or bfloat16); any M, N, K works. Accumulates in fp32; the result is ``out_dtype`` (float32 or the
input dtype, the default). The kernel is picked per shape and device (``cuda_ext.kernels.gemm_kernel_for``
says which; ``cuda_ext.kernels.gemm(..., kernel=...)`` forces one). There is no CPU kernel: on CPU use
``torch.matmul``.
"""

from __future__ import annotations

import torch

from cuda_ext import kernels


def is_available() -> bool:
    """True when the CUDA kernels are compiled in and a GPU is usable."""
    return kernels.has_cuda_kernels() and torch.cuda.is_available()


def matmul(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    return kernels.gemm(a, b, out_dtype)
