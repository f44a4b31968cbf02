"""MoE routing on the fused kernels, with the contract of ``pipeline.model.routing`` and autograd.

``route``, ``permute`` and ``unpermute`` take and return what the PyTorch reference does (same signatures,
semantics, dtypes), so ``pipeline.model.routing.routing_ops()`` can hand them to the MoE layer unchanged.
Gradients: ``route`` -> logits (through the renormalised weights), ``permute`` -> hidden, ``unpermute`` ->
expert output and weights, each computed by a backward kernel from the saved indices.

Inputs are made contiguous and 16-byte aligned (copied only when they are not) before the kernels'
strict checks in ``cuda_ext.kernels``; wrong dtypes, shapes and devices raise there with a clear message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch.autograd.function import once_differentiable

from cuda_ext import kernels
from cuda_ext.routing_plan import RoutingPlan

__all__ = ["FusedRoutingPlan", "is_available", "permute", "route", "unpermute"]


def is_available() -> bool:
    """True when the compiled kernels can serve this process: the module is built and, when CUDA is
    usable here, it has its CUDA kernels too. Otherwise routing_ops() keeps the PyTorch reference."""
    if not kernels.is_built():
        return False
    return kernels.has_cuda_kernels() or not torch.cuda.is_available()


@dataclass
class FusedRoutingPlan(RoutingPlan):
    """A RoutingPlan that also keeps the inverse of ``source_index``: the grouped row of each (t, j)."""

    grouped_position: torch.Tensor | None = field(default=None, repr=False)  # int32 [T, k], -1 = dropped


# Dynamo cannot see into the pybind11 calls (and gets the CUDA stream object wrong tracing around them):
# under torch.compile each routing call is a graph break that runs eagerly. Routing syncs with the host
# for the expert offsets anyway.
_eager_only = torch.compiler.disable


def _kernel_ready(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.contiguous()
    if tensor.numel() and tensor.data_ptr() % kernels.ALIGNMENT:
        tensor = tensor.clone()  # a view starting mid-allocation; a fresh allocation is aligned
    return tensor


def _grouped_position(plan: RoutingPlan) -> torch.Tensor:
    position = getattr(plan, "grouped_position", None)
    if position is not None:
        return position
    # A plan made elsewhere (e.g. by the reference): invert source_index once.
    position = torch.full(
        (plan.num_tokens * plan.top_k,), -1, dtype=torch.int32, device=plan.source_index.device
    )
    position[plan.source_index.long()] = torch.arange(
        plan.source_index.numel(), dtype=torch.int32, device=position.device
    )
    return position.view(plan.num_tokens, plan.top_k)


class _Route(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, top_k, capacity, score):
        weights, ids, dropped, counts, offsets, source_index, position = kernels.route_forward(
            logits, top_k, capacity, score
        )
        ctx.save_for_backward(logits, ids)
        ctx.score = score
        ctx.mark_non_differentiable(ids, dropped, counts, offsets, source_index, position)
        return weights, ids, dropped, counts, offsets, source_index, position

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_weights, *_):
        logits, ids = ctx.saved_tensors
        grad = kernels.route_backward(logits, ids, _kernel_ready(grad_weights.float()), ctx.score)
        return grad, None, None, None


class _Permute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, source_index, position):
        ctx.save_for_backward(position)
        return kernels.permute_rows(hidden, source_index, position.shape[1])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        (position,) = ctx.saved_tensors
        # Each token row gathers the gradients of its kept copies: unpermute with unit weights.
        return kernels.unpermute_rows(_kernel_ready(grad_out), position, None), None, None


class _Unpermute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, expert_output, weights, position):
        ctx.save_for_backward(expert_output, weights, position)
        return kernels.unpermute_rows(expert_output, position, weights)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        expert_output, weights, position = ctx.saved_tensors
        grad_rows, grad_weights = kernels.unpermute_backward(
            _kernel_ready(grad_out), expert_output, position, weights
        )
        return grad_rows, grad_weights, None


@_eager_only
def route(
    logits: torch.Tensor,
    top_k: int,
    capacity: int | None = None,
    score: Literal["softmax", "sigmoid"] = "softmax",
) -> FusedRoutingPlan:
    """Same contract as ``pipeline.model.routing.route``; weights carry the gradient back to logits."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError(
            f"logits must be a [tokens, experts] tensor, got {getattr(logits, 'shape', logits)!r}"
        )
    weights, ids, dropped, counts, offsets, source_index, position = _Route.apply(
        _kernel_ready(logits), int(top_k), capacity, score
    )
    return FusedRoutingPlan(
        weights=weights,
        expert_ids=ids,
        dropped=dropped,
        expert_counts=counts,
        expert_offsets=offsets,
        source_index=source_index,
        grouped_position=position,
    )


@_eager_only
def permute(hidden: torch.Tensor, plan: RoutingPlan) -> torch.Tensor:
    """Gather token rows [T, ...] into the expert-grouped order [N, ...]."""
    if hidden.dim() < 1 or hidden.shape[0] != plan.num_tokens:
        raise ValueError(
            f"hidden must have {plan.num_tokens} rows (one per token), got shape {tuple(hidden.shape)}"
        )
    rows = _kernel_ready(hidden.reshape(plan.num_tokens, math.prod(hidden.shape[1:])))
    out = _Permute.apply(rows, _kernel_ready(plan.source_index), _grouped_position(plan))
    return out.view(out.shape[0], *hidden.shape[1:])


@_eager_only
def unpermute(expert_output: torch.Tensor, plan: RoutingPlan) -> torch.Tensor:
    """Weighted combine of grouped rows [N, H] back to tokens [T, H]; dropped assignments add nothing."""
    if expert_output.dim() != 2 or expert_output.shape[0] != plan.source_index.numel():
        raise ValueError(
            f"expert_output must be [N, H] with N = {plan.source_index.numel()} kept assignments, "
            f"got shape {tuple(expert_output.shape)}"
        )
    weights = plan.weights if plan.weights.dtype == torch.float32 else plan.weights.float()
    return _Unpermute.apply(_kernel_ready(expert_output), _kernel_ready(weights), _grouped_position(plan))
