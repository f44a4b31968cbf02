"""The LM head's loss without its logits: linear + cross-entropy fused, behind one small function.

The reference is the model's plain path (``GPT.forward`` with ``fused_cross_entropy: off``)::

    F.cross_entropy((hidden @ weight.T).float(), targets, ignore_index=-100)

the mean over the targets that are not -100, in float32 (nan when every target is ignored). For ``base``
(batch 16 x 2048, vocabulary 32768) that logits tensor alone is 2 GiB in bf16 and 4 GiB more as float32.
``linear_cross_entropy`` computes the same loss, and its gradients for the hidden states and the head
weight, without ever holding more than one chunk of rows' logits:

* ``chunked``: the PyTorch implementation below, for the CPU and for GPUs without Triton. Forward: per
  chunk of rows, logits in float32, their logsumexp and the target's logit. Backward: each chunk's logits
  again, softmax minus one-hot, accumulated into the hidden states' and the weight's gradients. Peak
  memory is a few chunk x vocab float32 tensors, not tokens x vocab; the price is the head's forward matmul
  once more in backward.
* ``liger``: Liger Kernel's fused linear cross-entropy (Triton; computes the gradients in the forward,
  chunk by chunk, so no recompute).
* ``cce``: Apple's Cut Cross-Entropy (Triton; the logits never leave on-chip memory, and its backward
  recomputes them there). Called with ``filter_eps=None``: the library's default skips blocks of the
  gradient whose entries are all below bf16 eps / 32 = 2.4e-4, and pretraining starts from a near-uniform
  softmax (1 / 32768 = 3e-5 per entry), where that would drop most of the gradient. It needs 16-bit hidden
  states, and it sums both gradients across its blocks in their dtype (atomic adds).

The two libraries are optional (the ``gpu`` extra), imported on first use, CUDA only. ``auto`` takes cce
(for 16-bit hidden states), else liger, when installed and on CUDA, and the chunked path otherwise; that
order follows CCE's published figures and is to be confirmed on an H200 by ``benchmarks/train_gpu.py
--fused-cross-entropy``. Under autocast the operands are
first cast to autocast's dtype, as the plain path's ``lm_head`` matmul would be, and every backend returns
gradients in its inputs' dtype.
"""

from __future__ import annotations

import importlib

import torch

from pipeline.model.config import FUSED_CROSS_ENTROPY, GPTConfig

IGNORE_INDEX = -100
BACKENDS = tuple(name for name in FUSED_CROSS_ENTROPY if name != "off")

# backend: (module to import, package on the index, what it is)
_LIBRARIES = {
    "liger": ("liger_kernel.transformers.functional", "liger-kernel", "Liger Kernel"),
    "cce": ("cut_cross_entropy", "cut-cross-entropy", "Apple's Cut Cross-Entropy"),
}
_AVAILABLE: dict[str, bool] = {}


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    backend: str = "chunked",
    chunk_size: int = GPTConfig.fused_cross_entropy_chunk_size,
) -> torch.Tensor:
    """Token-mean cross-entropy of the logits ``hidden @ weight.T`` against ``targets`` (-100 ignored).

    hidden (..., H), weight (V, H), targets (...) with the leading shape of hidden. chunk_size: rows per
    chunk of the chunked backend (the others choose their own blocks).
    """
    if backend not in BACKENDS:
        raise ValueError(f"linear_cross_entropy backend must be one of {BACKENDS}, got {backend!r}")
    hidden, targets = hidden.reshape(-1, hidden.size(-1)), targets.reshape(-1)
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    if hidden.dtype != weight.dtype:
        raise ValueError(f"hidden states are {hidden.dtype} but the head weight is {weight.dtype}")
    with torch.autocast(device, enabled=False):
        name = resolve_backend(backend, hidden)
        if name == "chunked":
            return ChunkedLinearCrossEntropy.apply(hidden, weight, targets, chunk_size)
        return _library_loss(name, hidden, weight, targets, chunk_size)


def resolve_backend(backend: str, hidden: torch.Tensor) -> str:
    """The backend ``backend`` runs as for these hidden states: ``auto`` becomes a concrete one."""
    if backend != "auto":
        return backend
    if hidden.device.type == "cuda":
        if hidden.dtype in (torch.bfloat16, torch.float16) and backend_available("cce"):
            return "cce"  # its backward needs 16-bit hidden states
        if backend_available("liger"):
            return "liger"
    return "chunked"


@torch.compiler.assume_constant_result
def backend_available(name: str) -> bool:
    """Whether the library behind ``name`` imports here (once per process; compiled code sees a constant)."""
    if name not in _AVAILABLE:
        try:
            _import_library(name)
        except ImportError:
            _AVAILABLE[name] = False
        else:
            _AVAILABLE[name] = True
    return _AVAILABLE[name]


def _import_library(name: str):
    module, package, title = _LIBRARIES[name]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"fused_cross_entropy {name!r} needs {title}: pip install 'pretrain-pipeline[gpu]' (or {package}); "
            f"importing {module} failed: {exc}. 'chunked' needs no extra package."
        ) from exc


@torch.compiler.disable  # Triton kernels behind host syncs (both libraries count the kept targets)
def _library_loss(
    name: str, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_size: int
) -> torch.Tensor:
    library = _import_library(name)
    if hidden.device.type != "cuda":
        raise ValueError(
            f"fused_cross_entropy {name!r} runs on CUDA only; the hidden states are on {hidden.device.type} "
            "(use 'chunked', or 'auto', which falls back to it)"
        )
    if not bool((targets != IGNORE_INDEX).any()):
        # liger would give 0 and cce divide by zero in backward; the chunked path gives the plain path's nan.
        return ChunkedLinearCrossEntropy.apply(hidden, weight, targets, chunk_size)
    if name == "liger":
        return library.liger_fused_linear_cross_entropy(
            hidden, weight, targets, ignore_index=IGNORE_INDEX, reduction="mean", accum_dtype=torch.float32
        )
    if hidden.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(
            f"fused_cross_entropy 'cce' needs bf16 or fp16 hidden states (its backward does), got "
            f"{hidden.dtype}: train with precision bf16, or use 'liger' / 'chunked'"
        )
    return library.linear_cross_entropy(
        hidden, weight, targets, ignore_index=IGNORE_INDEX, reduction="mean", filter_eps=None, impl="cce"
    )


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """The chunked backend: ``F.cross_entropy((hidden @ weight.T).float(), targets, ignore_index=-100)``
    for hidden (N, H), weight (V, H), targets (N,), holding one chunk of rows' logits at a time.

    The matmuls run in the inputs' dtype (as the plain path's lm_head does), everything after them in float32;
    the weight's gradient is summed over chunks in float32 and returned in the weight's dtype.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_size):
        kept = targets != IGNORE_INDEX
        safe_targets = targets.masked_fill(~kept, 0)  # any valid index: an ignored row is masked out
        logsumexp = hidden.new_empty(len(hidden), dtype=torch.float32)
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, len(hidden), chunk_size):
            rows = slice(start, start + chunk_size)
            logits = (hidden[rows] @ weight.T).float()
            logsumexp[rows] = torch.logsumexp(logits, dim=-1)
            target_logit = logits.gather(1, safe_targets[rows, None]).squeeze(1)
            total = total + torch.where(kept[rows], logsumexp[rows] - target_logit, 0.0).sum()
        count = kept.sum()
        ctx.save_for_backward(hidden, weight, safe_targets, kept, logsumexp, count)
        ctx.chunk_size = chunk_size
        return total / count  # 0 / 0 = nan when every target is ignored, as F.cross_entropy gives

    @staticmethod
    def backward(ctx, grad_loss):
        hidden, weight, targets, kept, logsumexp, count = ctx.saved_tensors
        needs_hidden, needs_weight = ctx.needs_input_grad[:2]
        grad_hidden = torch.empty_like(hidden) if needs_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if needs_weight else None
        # d loss / d logits = (softmax - one_hot(target)) * grad_loss / count on kept rows, 0 on ignored ones.
        row_scale = torch.where(kept, grad_loss.float() / count, 0.0)
        for start in range(0, len(hidden), ctx.chunk_size):
            rows = slice(start, start + ctx.chunk_size)
            logits = (hidden[rows] @ weight.T).float()
            grad_logits = logits.sub_(logsumexp[rows, None]).exp_()
            grad_logits.scatter_add_(
                1, targets[rows, None], grad_logits.new_full((len(grad_logits), 1), -1.0)
            )
            grad_logits = grad_logits.mul_(row_scale[rows, None]).to(hidden.dtype)
            if needs_hidden:
                grad_hidden[rows] = grad_logits @ weight
            if needs_weight:
                grad_weight.add_(grad_logits.T @ hidden[rows])
        if needs_weight:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None
