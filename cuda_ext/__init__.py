"""C++/CUDA kernels with pybind11 bindings (``cuda_ext._C``) and their torch-facing wrappers.

* ``cuda_ext.moe_routing``: route / permute / unpermute with the contract of ``pipeline.model.routing``
  (CPU and CUDA kernels, autograd), picked up by ``routing_ops()`` when ``is_available()``.
* ``cuda_ext.gemm``: a tensor-core GEMM (CUDA only; mma.sync and WMMA kernels).
* ``cuda_ext.kernels``: the validated tensor-level calls both are built on.

Build and design notes: docs/cuda_ext.md.
"""
