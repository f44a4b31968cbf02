"""Tensor-level calls into the compiled kernels (``cuda_ext._C``), one function per kernel.

The extension takes raw addresses, so everything it could get wrong is checked here first: device, dtype,
shape, contiguity and 16-byte alignment, each with an error naming the argument. Outputs are allocated here
with torch (on the input's device, through its caching allocator) and CUDA kernels run on the current stream.
"""

from __future__ import annotations

import contextlib
import itertools
from types import ModuleType

import torch

# Element type codes shared with csrc/common.h.
DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}
FLOAT_DTYPES = tuple(DTYPE_CODES)
SCORE_CODES = {"softmax": 0, "sigmoid": 1}
# GEMM kernel codes shared with csrc/gemm_plan.h (its table is also cuda_ext._C.GEMM_KERNELS, in code order).
GEMM_KERNEL_CODES = {"auto": -1, "wmma_128x256": 0, "mma_128x256": 1, "mma_128x128": 2}
ALIGNMENT = 16

_native: ModuleType | None = None
_import_error: str | None = None


def native() -> ModuleType:
    """The compiled module; raises ImportError with the reason when it is not built."""
    global _native, _import_error
    if _native is None and _import_error is None:
        try:
            from cuda_ext import _C
        except ImportError as exc:
            _import_error = (
                f"cuda_ext._C is not built ({exc}); build it with `pip install --no-build-isolation -e .`"
            )
        else:
            _native = _C
    if _native is None:
        raise ImportError(_import_error)
    return _native


def is_built() -> bool:
    try:
        native()
    except ImportError:
        return False
    return True


def has_cuda_kernels() -> bool:
    """True when the module was compiled with its CUDA kernels (whether or not a GPU is present)."""
    return is_built() and bool(native().WITH_CUDA)


def check_tensor(
    tensor: object,
    name: str,
    *,
    dtypes: tuple[torch.dtype, ...],
    ndim: int,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Raises TypeError/ValueError unless ``tensor`` is what a kernel may read through a raw pointer."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in dtypes:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name} must have dtype {allowed}; got {str(tensor.dtype).removeprefix('torch.')}")
    if tensor.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(tensor.shape)}")
    if device is not None and tensor.device != device:
        raise ValueError(f"{name} is on {tensor.device}, expected {device} (all inputs on one device)")
    if not tensor.is_contiguous():
        raise ValueError(f"{name} must be contiguous (row-major); call .contiguous() first")
    if tensor.numel() and tensor.data_ptr() % ALIGNMENT:
        raise ValueError(
            f"{name} must start on a {ALIGNMENT}-byte boundary (address {tensor.data_ptr():#x}); "
            "a sliced view can be misaligned: pass a fresh tensor (.clone())"
        )
    return tensor


def backend(device: torch.device) -> str:
    """'cpu' or 'cuda' for a tensor device, or a clear error when the build cannot serve it."""
    if device.type == "cpu":
        native()
        return "cpu"
    if device.type == "cuda":
        if not has_cuda_kernels():
            raise RuntimeError(
                "cuda_ext was built without CUDA kernels (nvcc was not found, or PRETRAIN_BUILD_CUDA=0); "
                "rebuild on a machine with nvcc: PRETRAIN_BUILD_CUDA=1 pip install --no-build-isolation -e ."
            )
        return "cuda"
    raise ValueError(f"cuda_ext kernels run on CPU or CUDA tensors, not on {device.type}")


def _launch_context(device: torch.device):
    # The extension launches on the thread's current CUDA device: make it the tensors' device.
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


def _run(kind: str, kernel: str, args: tuple, device: torch.device) -> object:
    """Calls ``<kernel>_cpu(*args)``, or ``<kernel>_cuda(*args, stream)`` on the device's current stream."""
    lib = native()
    if kind == "cpu":
        return getattr(lib, f"{kernel}_cpu")(*args)
    with _launch_context(device):
        return getattr(lib, f"{kernel}_cuda")(*args, _stream(device))


def _address(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.data_ptr()


def _int32_views(device: torch.device, sizes: list[int]) -> list[torch.Tensor]:
    padded = [-(-size // 16) * 16 for size in sizes]
    storage = torch.empty(sum(padded), dtype=torch.int32, device=device)
    starts = [0, *itertools.accumulate(padded)]
    return [storage[start : start + size] for start, size in zip(starts, sizes, strict=False)]


def route_forward(
    logits: torch.Tensor, top_k: int, capacity: int | None, score: str
) -> tuple[torch.Tensor, ...]:
    """Fused routing: (weights [T,k] f32, ids [T,k] i32, dropped [T,k] bool, counts [E] i32,
    offsets [E+1] i32, source_index [N] i32, position [T,k] i32: grouped row of each assignment or -1)."""
    check_tensor(logits, "logits", dtypes=FLOAT_DTYPES, ndim=2)
    num_tokens, num_experts = logits.shape
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in [1, {num_experts}], got {top_k}")
    if score not in SCORE_CODES:
        raise ValueError(f"unknown router score {score!r}; use 'softmax' or 'sigmoid'")
    if num_tokens * top_k >= 2**31:
        raise ValueError("num_tokens * top_k must fit int32 (the index dtype)")
    lib, device = native(), logits.device
    kind = backend(device)
    if kind == "cuda" and num_experts > lib.MAX_CUDA_EXPERTS:
        raise ValueError(
            f"the CUDA routing kernels support at most {lib.MAX_CUDA_EXPERTS} experts, got {num_experts}"
        )
    # A capacity below zero admits nothing, as in the reference; None is unlimited (-1 for the kernels).
    cap = -1 if capacity is None else max(int(capacity), 0)
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=device)
    dropped = torch.empty(num_tokens, top_k, dtype=torch.bool, device=device)
    # The int32 outputs share one allocation (fewer allocator calls per route), each view 64-byte aligned.
    assignments = num_tokens * top_k
    ids, position, source_index, counts, offsets = _int32_views(
        device, [assignments, assignments, assignments, num_experts, num_experts + 1]
    )
    ids, position = ids.view(num_tokens, top_k), position.view(num_tokens, top_k)
    buffers = [weights, ids, dropped, counts, offsets, source_index, position]
    args = (
        logits.data_ptr(),
        DTYPE_CODES[logits.dtype],
        num_tokens,
        num_experts,
        top_k,
        cap,
        SCORE_CODES[score],
    )
    if kind == "cpu":
        kept = lib.route_forward_cpu(*args, *map(_address, buffers))
    else:
        workspace = torch.empty(
            lib.route_workspace_bytes(num_tokens, num_experts, top_k), dtype=torch.uint8, device=device
        )
        with _launch_context(device):
            lib.route_forward_cuda(
                *args, *map(_address, buffers), workspace.data_ptr(), workspace.numel(), _stream(device)
            )
        # Without a capacity every assignment is kept; with one, N is known only on the device (one sync,
        # as the reference's nonzero() does).
        kept = num_tokens * top_k if cap < 0 else int(offsets[-1].item())
    return weights, ids, dropped, counts, offsets, source_index[:kept], position


def route_backward(
    logits: torch.Tensor, ids: torch.Tensor, grad_weights: torch.Tensor, score: str
) -> torch.Tensor:
    """d loss / d logits [T, E] (dtype of logits) from d loss / d weights [T, k]."""
    check_tensor(logits, "logits", dtypes=FLOAT_DTYPES, ndim=2)
    device = logits.device
    check_tensor(ids, "ids", dtypes=(torch.int32,), ndim=2, device=device)
    check_tensor(grad_weights, "grad_weights", dtypes=(torch.float32,), ndim=2, device=device)
    num_tokens, num_experts = logits.shape
    top_k = ids.shape[1]
    if ids.shape[0] != num_tokens or grad_weights.shape != ids.shape:
        raise ValueError(
            f"ids {tuple(ids.shape)} and grad_weights {tuple(grad_weights.shape)} must be [T, k]"
        )
    kind = backend(device)
    grad_logits = torch.empty_like(logits)
    args = (
        logits.data_ptr(),
        DTYPE_CODES[logits.dtype],
        num_tokens,
        num_experts,
        top_k,
        SCORE_CODES[score],
        ids.data_ptr(),
        grad_weights.data_ptr(),
        grad_logits.data_ptr(),
    )
    _run(kind, "route_backward", args, device)
    return grad_logits


def permute_rows(hidden: torch.Tensor, source_index: torch.Tensor, top_k: int) -> torch.Tensor:
    """out[p] = hidden[source_index[p] // top_k]: token rows [T, H] into grouped order [N, H]."""
    check_tensor(hidden, "hidden", dtypes=FLOAT_DTYPES, ndim=2)
    device = hidden.device
    check_tensor(source_index, "source_index", dtypes=(torch.int32,), ndim=1, device=device)
    kind = backend(device)
    out = torch.empty(source_index.shape[0], hidden.shape[1], dtype=hidden.dtype, device=device)
    row_bytes = hidden.shape[1] * hidden.element_size()
    args = (hidden.data_ptr(), out.data_ptr(), source_index.data_ptr(), out.shape[0], top_k, row_bytes)
    _run(kind, "permute", args, device)
    return out


def unpermute_rows(rows: torch.Tensor, position: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """out[t] = sum_j weights[t, j] * rows[position[t, j]] over kept j (position >= 0); weights None = 1."""
    check_tensor(rows, "expert_output", dtypes=FLOAT_DTYPES, ndim=2)
    device = rows.device
    check_tensor(position, "position", dtypes=(torch.int32,), ndim=2, device=device)
    if weights is not None:
        check_tensor(weights, "weights", dtypes=(torch.float32,), ndim=2, device=device)
        if weights.shape != position.shape:
            raise ValueError(f"weights {tuple(weights.shape)} must match position {tuple(position.shape)}")
    kind = backend(device)
    num_tokens, top_k = position.shape
    out = torch.empty(num_tokens, rows.shape[1], dtype=rows.dtype, device=device)
    args = (
        DTYPE_CODES[rows.dtype],
        rows.data_ptr(),
        position.data_ptr(),
        _address(weights),
        num_tokens,
        top_k,
        rows.shape[1],
        out.data_ptr(),
    )
    _run(kind, "unpermute", args, device)
    return out


def unpermute_backward(
    grad_out: torch.Tensor, rows: torch.Tensor, position: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of unpermute_rows: (d rows [N, H], d weights [T, k] f32)."""
    check_tensor(rows, "expert_output", dtypes=FLOAT_DTYPES, ndim=2)
    device = rows.device
    check_tensor(grad_out, "grad_output", dtypes=(rows.dtype,), ndim=2, device=device)
    check_tensor(position, "position", dtypes=(torch.int32,), ndim=2, device=device)
    check_tensor(weights, "weights", dtypes=(torch.float32,), ndim=2, device=device)
    kind = backend(device)
    num_tokens, top_k = position.shape
    # Every grouped row is written: each kept row has exactly one (t, j) pointing at it.
    grad_rows = torch.empty_like(rows)
    grad_weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=device)
    args = (
        DTYPE_CODES[rows.dtype],
        grad_out.data_ptr(),
        rows.data_ptr(),
        position.data_ptr(),
        weights.data_ptr(),
        num_tokens,
        top_k,
        rows.shape[1],
        grad_rows.data_ptr(),
        grad_weights.data_ptr(),
    )
    _run(kind, "unpermute_backward", args, device)
    return grad_rows, grad_weights


def gemm(
    a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype | None = None, kernel: str = "auto"
) -> torch.Tensor:
    """a [M, K] @ b [K, N] on tensor cores (CUDA only): fp16/bf16 in, fp32 accumulate, fp32 or input-type out.

    ``kernel`` "auto" picks one for the shape and device (``gemm_kernel_for``); a name from
    ``GEMM_KERNEL_CODES`` forces it (tests, benchmarks), and a ValueError says when it cannot run the shape
    (the mma kernels need K and N multiples of 8)."""
    if kernel not in GEMM_KERNEL_CODES:
        raise ValueError(f"unknown gemm kernel {kernel!r}; use one of {', '.join(GEMM_KERNEL_CODES)}")
    check_tensor(a, "a", dtypes=(torch.bfloat16, torch.float16), ndim=2)
    check_tensor(b, "b", dtypes=(a.dtype,), ndim=2, device=a.device)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"inner dimensions differ: a {tuple(a.shape)} @ b {tuple(b.shape)}")
    out_dtype = a.dtype if out_dtype is None else out_dtype
    if out_dtype not in (torch.float32, a.dtype):
        raise TypeError(f"out_dtype must be float32 or {a.dtype}, got {out_dtype}")
    if a.device.type != "cuda":
        raise ValueError(f"gemm runs on CUDA tensors only; a is on {a.device}")
    backend(a.device)
    (m, k), n = a.shape, b.shape[1]
    out = torch.empty(m, n, dtype=out_dtype, device=a.device)
    with _launch_context(a.device):
        native().gemm_cuda(
            a.data_ptr(),
            b.data_ptr(),
            out.data_ptr(),
            m,
            n,
            k,
            DTYPE_CODES[a.dtype],
            DTYPE_CODES[out_dtype],
            _stream(a.device),
            GEMM_KERNEL_CODES[kernel],
        )
    return out


def gemm_kernel_for(m: int, n: int, k: int, device: torch.device | str | int | None = None) -> str:
    """The kernel ``gemm(kernel="auto")`` runs for [M, K] @ [K, N] on a CUDA device (default: the current one)."""
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    backend(device)
    with _launch_context(device):
        code = native().gemm_cuda_kernel_for(m, n, k)
    return native().GEMM_KERNELS[code]
