"""Pipeline parallelism: the model cut by layers into stages over the "pp" dimension of a ("pp", "dp")
DeviceMesh, run by the ``torch.distributed.pipelining`` schedules.

torchtitan's approach: every stage is a deep copy of the whole model with the blocks of the other stages
removed, the embedding kept on the first stage only and the final norm and head on the last only (``GPT``
accepts either missing). Each copy runs in a ``PipelineStage``, handed to ``ScheduleGPipe``, ``Schedule1F1B``
or ``ScheduleInterleaved1F1B``. Stage i sits on pp rank i % pp (the loop placement interleaving expects), so
with ``train.pp_virtual_stages`` v a rank holds stages r, r + pp, ... Each stage is data parallel over its "dp" group
through the trainer's own DDP / ZeRO-1 path; the schedules reduce DDP gradients once, on a step's last
backward.

**Split** (``balanced_split``): contiguous blocks per stage, by training FLOPs per token of each block
(``GPTConfig.layer_flops_per_token``), the head's FLOPs counted on the last stage and the embedding (a
lookup, no FLOPs) on the first. Rule: minimise the costliest stage, since a pipeline runs at the pace of its
slowest stage; among the splits that do, earlier stages take as many blocks as fit under that cost. So with
uneven counts the surplus blocks go to the first stages and the stage carrying the head gets fewer.

**Tied embedding and head**: kept as two copies in sync, not untied. After backward the two gradients are
summed over the first and last stage (Megatron's "embedding group"), so both copies get the gradient the
one tied matrix gets in a single process, take the same optimizer step and stay bit-identical; the global
gradient norm counts the matrix once. A pipeline thus trains the very model one process trains.

**Loss** on the last stage is the trainer's: each micro-batch's loss weighted by its share of the step's
tokens over all data-parallel ranks, with the MoE router aux and z losses of every stage, which each stage
adds to and passes on beside the residual stream. Off the last stage the logged loss is 0, so the trainer's
one all-reduce gives every rank (rank 0 included) the loss. The schedule hands the loss function the last
stage's output, so that output is the logits and training stays on the plain cross-entropy whatever the
model's ``fused_cross_entropy``; ``validation_loss`` passes the targets into the model and uses it.

**Bubble**: the theoretical idle share of a step is (p-1)/(v·m + p-1) for p ranks, m micro-batches and v
stages per rank (v = 1 for GPipe and 1F1B). Measured: each stage adds up the time it computes (forward,
backward, loss); the rest of the schedule's step is time spent waiting for a neighbour.
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.distributed.tensor import DTensor, distribute_tensor

from pipeline.config import PipelineConfig
from pipeline.data.sequences import IGNORE_INDEX, Batch
from pipeline.model.checkpoint import shard_folder
from pipeline.model.config import GPTConfig
from pipeline.model.gpt import GPT, training_loss
from pipeline.train.components.amp import MixedPrecision
from pipeline.train.distributed.parallelism import (
    Parallelism,
    ShardedModelState,
    ShardedOptimizerState,
    StepLoss,
    fully_shard_model,
    local_shards,
    placeholder_batch,
)
from pipeline.train.distributed.process_groups import DistributedContext, data_parallel

log = logging.getLogger(__name__)

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved_1f1b": ScheduleInterleaved1F1B}
_RELATIVE = 1e-12  # float slack when comparing stage costs summed in different orders


@dataclass(frozen=True)
class PipelineSplit:
    """Which blocks each stage holds, ``[first, end)`` per stage, and what each stage costs."""

    layers: tuple[tuple[int, int], ...]
    flops_per_token: tuple[float, ...]  # training FLOPs per token of each stage (the head on the last)

    @property
    def num_stages(self) -> int:
        return len(self.layers)

    def describe(self) -> str:
        parts = []
        for stage, ((first, end), flops) in enumerate(zip(self.layers, self.flops_per_token, strict=True)):
            extra = " + embedding" if stage == 0 else ""
            extra += " + norm, head, loss" if stage == self.num_stages - 1 else ""
            parts.append(f"stage {stage}: layers {first}-{end - 1}{extra} ({flops / 1e6:.3f} MFLOP/token)")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"layers": [list(span) for span in self.layers], "flops_per_token": list(self.flops_per_token)}


def balanced_split(config: GPTConfig, stages: int, seq_len: int) -> PipelineSplit:
    """The split of the module docstring: least costly slowest stage, surplus blocks to the earlier stages."""
    count = config.num_hidden_layers
    if not 1 <= stages <= count:
        raise ValueError(f"cannot split {count} layers into {stages} pipeline stages of at least one layer")
    costs = [config.layer_flops_per_token(layer, seq_len) for layer in range(count)]
    head = config.head_flops_per_token()

    def cost(first: int, end: int) -> float:
        return sum(costs[first:end]) + (head if end == count else 0.0)

    # tail[s][i]: the least possible slowest-stage cost of layers i.. split into s stages.
    tail = [[float("inf")] * (count + 1) for _ in range(stages + 1)]
    for first in range(count):
        tail[1][first] = cost(first, count)
    for parts in range(2, stages + 1):
        for first in range(count - parts + 1):
            tail[parts][first] = min(
                max(cost(first, end), tail[parts - 1][end]) for end in range(first + 1, count - parts + 2)
            )
    bound = tail[stages][0] * (1 + _RELATIVE)
    layers, first = [], 0
    for parts in range(stages, 1, -1):
        end = max(
            end
            for end in range(first + 1, count - parts + 2)
            if max(cost(first, end), tail[parts - 1][end]) <= bound
        )
        layers.append((first, end))
        first = end
    layers.append((first, count))
    return PipelineSplit(tuple(layers), tuple(cost(first, end) for first, end in layers))


def theoretical_bubble(ranks: int, microbatches: int, virtual_stages: int = 1) -> float:
    """Idle share of a step for ``ranks`` pipeline ranks: (p-1)/(v·m + p-1)."""
    return (ranks - 1) / (virtual_stages * microbatches + ranks - 1)


def model_part(model: GPT, split: PipelineSplit, stage: int) -> GPT:
    """A deep copy of ``model`` holding only what pipeline stage ``stage`` runs (torchtitan's model part)."""
    part = copy.deepcopy(model)
    first, end = split.layers[stage]
    part.blocks = nn.ModuleList(part.blocks[first:end])
    # GPT runs without the parts a stage does not hold (its forward checks for each).
    if stage > 0:
        part.embed_tokens = None  # type: ignore[assignment]
    if stage < split.num_stages - 1:
        part.norm = None  # type: ignore[assignment]
        part.lm_head = None  # type: ignore[assignment]
    return part


def full_name(name: str, first_layer: int) -> str:
    """A stage's parameter name as the unsplit model calls it (its blocks are numbered from 0)."""
    if not name.startswith("blocks."):
        return name
    index, rest = name.removeprefix("blocks.").split(".", 1)
    return f"blocks.{int(index) + first_layer}.{rest}"


class ModelPartForward(nn.Module):
    """What one ``PipelineStage`` runs: its model part under autocast. With MoE layers in the model it
    also carries the router aux and z losses summed so far, so that they reach the loss on the last stage."""

    def __init__(self, model: GPT, autocast: Callable, carries_router_losses: bool) -> None:
        super().__init__()
        self.model = model
        self.autocast = autocast
        self.carries_router_losses = carries_router_losses

    def forward(self, x, aux_loss=None, z_loss=None, document_ids=None):
        with self.autocast():
            out = self.model(x, document_ids=document_ids)
        if not self.carries_router_losses:
            return out.logits
        if aux_loss is None:  # the first stage starts the sums
            aux_loss = z_loss = out.logits.new_zeros((), dtype=torch.float32)
        if out.aux_loss is not None:
            aux_loss, z_loss = aux_loss + out.aux_loss, z_loss + out.z_loss
        else:  # a stage without MoE layers passes the sums on, as tensors of its own
            aux_loss, z_loss = aux_loss.clone(), z_loss.clone()
        return out.logits, aux_loss, z_loss


class TimedPipelineStage(PipelineStage):
    """A ``PipelineStage`` that adds up the time it computes; the rest of a schedule step is waiting."""

    busy_s = 0.0

    def _timed(self, method, *args, **kwargs):
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            self.busy_s += time.perf_counter() - started

    def forward_one_chunk(self, *args, **kwargs):
        return self._timed(super().forward_one_chunk, *args, **kwargs)

    def backward_one_chunk(self, *args, **kwargs):
        return self._timed(super().backward_one_chunk, *args, **kwargs)

    def backward_weight_one_chunk(self, *args, **kwargs):
        return self._timed(super().backward_weight_one_chunk, *args, **kwargs)


def _sub_context(ctx: DistributedContext, mesh: DeviceMesh, dim: str) -> DistributedContext:
    """One mesh dimension as a DistributedContext: rank and size within this rank's group of that dimension,
    collectives over it, and a gloo twin of the group for the CPU-side messages."""
    group = mesh.get_group(dim)
    control = group
    if dist.get_backend(group) != "gloo":
        members = mesh.mesh.tolist() if dim == "dp" else mesh.mesh.t().tolist()
        control, _ = dist.new_subgroups_by_enumeration(members, backend="gloo")
    return DistributedContext(
        rank=mesh.get_local_rank(dim),
        world_size=dist.get_world_size(group),
        local_rank=ctx.local_rank,
        device=ctx.device,
        backend=ctx.backend,
        control_group=control,
        owns_process_group=False,
        group=group,
    )


class PipelineParallelism(Parallelism):
    """This rank's share of a pipeline-parallel model: its stages, their schedule, and one step's work.

    ``model_parts`` are its stages (copies of the model cut as ``model_part`` says), ``data`` its "dp" group."""

    def __init__(
        self, model: GPT, ctx: DistributedContext, config: PipelineConfig, precision: MixedPrecision
    ) -> None:
        super().__init__(ctx, config, precision)
        train = config.train
        ranks = train.pp_degree
        self.config = model.config
        # GradScaler creates its scale on the first scale() call, which only the last stage makes: start it
        # on every stage (the gradients arriving from the next stage are scaled alike).
        precision.scale(torch.ones((), device=ctx.device))
        self.microbatches = train.pp_microbatch_count
        self.pp_virtual_stages = train.pp_virtual_stages
        self.mesh = init_device_mesh(
            ctx.device.type, (ranks, ctx.world_size // ranks), mesh_dim_names=("pp", "dp")
        )
        self.pp = _sub_context(ctx, self.mesh, "pp")
        self.dp = self.data = _sub_context(ctx, self.mesh, "dp")
        self.split = balanced_split(model.config, train.pp_stage_count, train.seq_len)
        self.stage_indices = [self.pp.rank + k * ranks for k in range(train.pp_virtual_stages)]
        self.models = self.model_parts = [
            model_part(model, self.split, stage) for stage in self.stage_indices
        ]
        self.module = nn.ModuleList(self.models)  # the optimizer's parameters: every stage this rank holds
        self.first_layers = [self.split.layers[stage][0] for stage in self.stage_indices]
        self.has_first = 0 in self.stage_indices
        self.has_last = self.split.num_stages - 1 in self.stage_indices
        self.carries_router_losses = bool(model.config.moe_layer_indices)
        if self.has_last and model.config.fused_cross_entropy != "off":
            log.info(
                "pipeline: the training loss takes the last stage's full logits; fused_cross_entropy=%s "
                "applies to the validation loss only",
                model.config.fused_cross_entropy,
            )
        self.fsdp = train.data_parallel == "fsdp"
        self.lockstep_forward = self.fsdp
        if self.fsdp:
            # Each part is an FSDP root over the "dp" dimension (pp x dp_shard), so the validation forward
            # (which calls the part itself) gathers its parameters too; every micro-batch's backward then
            # reduce-scatters, accumulating into the sharded gradients.
            for part in self.models:
                fully_shard_model(part, self.mesh["dp"], train, precision)
        self.modules = [
            ModelPartForward(part, precision.autocast, self.carries_router_losses)
            if self.fsdp
            else data_parallel(
                ModelPartForward(part, precision.autocast, self.carries_router_losses), self.dp, train
            )
            for part in self.models
        ]
        self.stages = [
            TimedPipelineStage(module, stage, self.split.num_stages, ctx.device, group=self.pp.group)
            for module, stage in zip(self.modules, self.stage_indices, strict=True)
        ]
        schedule = SCHEDULES[train.pp_schedule]
        # The loss is already each micro-batch's share of the step: no extra division by m.
        options = {"n_microbatches": self.microbatches, "loss_fn": self._loss, "scale_grads": False}
        self.schedule = schedule(self.stages if len(self.stages) > 1 else self.stages[0], **options)
        self._tied = self._tied_weight(model.config, ranks)
        self._step_tokens = 1
        self._losses: list[torch.Tensor] = []
        self._loss_busy_s = 0.0
        self._wall_s = 0.0
        self._steps = 0
        self.settle(placeholder_batch(train, ctx.device))

    def _tied_weight(self, config: GPTConfig, ranks: int) -> tuple[Any, torch.Tensor, bool] | None:
        """(group, this rank's copy, whether it is the head's) for a tied embedding, else None.

        Every rank joins the creation of every embedding group (first and last pp rank of each dp index)."""
        if not config.tie_word_embeddings:
            return None
        mesh = self.mesh.mesh
        members = [[int(mesh[0, d]), int(mesh[ranks - 1, d])] for d in range(mesh.size(1))]
        group, _ = dist.new_subgroups_by_enumeration(members)
        if self.has_first:
            return group, self.models[self.stage_indices.index(0)].embed_tokens.weight, False
        if self.has_last:
            return group, self.models[-1].lm_head.weight, True
        return None

    # --- one step ---------------------------------------------------------------------------------------

    def _loss(self, output, targets: torch.Tensor) -> torch.Tensor:
        """The last stage's loss of one micro-batch, as the one-process trainer weights it."""
        started = time.perf_counter()
        logits, aux_loss, z_loss = output if self.carries_router_losses else (output, None, None)
        loss, lm_loss = training_loss(self.config, logits, targets, aux_loss, z_loss)
        share = int((targets != IGNORE_INDEX).sum()) / self._step_tokens
        self._losses.append(lm_loss.detach().float() * share)
        scaled = self.precision.scale(loss * (share * self.dp.world_size))
        self._loss_busy_s += time.perf_counter() - started
        return scaled

    def forward_backward(self, batches: list[Batch]) -> StepLoss:
        """Every micro-batch of this dp rank's one batch (``train.pp_microbatches`` slices of it) forward and
        backward through the pipeline; the loss is this rank's part of the step's token-mean loss over all
        ranks (0 off the last stage)."""
        (batch,) = batches
        batch = batch.to(self.ctx.device)
        step_tokens = self._step_tokens = batch.num_tokens * self.dp.world_size  # packed: every row is full
        self._losses = []
        kwargs = {"document_ids": batch.document_ids} if self.document_masking else {}
        args = (batch.inputs,) if self.has_first else ()
        started = time.perf_counter()
        self.schedule.step(*args, target=batch.targets, return_outputs=False, **kwargs)
        self._wall_s += time.perf_counter() - started
        self._steps += 1
        total = torch.zeros((), device=self.ctx.device)
        if self.has_last:
            # The last m calls: a first step also runs the loss once while the stages infer their shapes.
            for loss in self._losses[-self.microbatches :]:
                total += loss  # in micro-batch order, as the one-process trainer sums
        return StepLoss(total, step_tokens)

    def finish_gradients(self) -> None:
        """Sum the embedding's and the head's gradients, so the two copies take the same step."""
        if self._tied is not None:
            group, weight, _ = self._tied
            # Under FSDP both copies are sharded alike over the same dp ranks: sum the matching shards.
            grad = weight.grad.to_local() if isinstance(weight.grad, DTensor) else weight.grad
            dist.all_reduce(grad, group=group)

    def step_options(self) -> dict[str, Any]:
        return {"total_norm": self.total_norm, "agree_found_inf": self.agree_found_inf}

    def total_norm(self, parameters: list[torch.Tensor]) -> torch.Tensor:
        """The gradient norm over every stage (the tied matrix counted once, on the first stage)."""
        skipped = self._tied[1] if self._tied is not None and self._tied[2] else None
        grads = [p.grad for p in parameters if p is not skipped and p.grad is not None]
        local = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros((), device=self.ctx.device)
        if isinstance(local, DTensor):  # FSDP: this stage's norm over its dp shards
            local = local.full_tensor()
        return self.pp.all_reduce(local.square()).sqrt()

    def agree_found_inf(self, found_inf: torch.Tensor) -> None:
        self.pp.all_reduce(found_inf, op=dist.ReduceOp.MAX)

    def settle(self, placeholder: Batch) -> None:
        """``process_groups.settle_buckets`` for DDP stages: one throw-away forward/backward of each stage on its
        own (no pipeline), RNG forked, gradients dropped. DDP lays its buckets out again after its first
        backward; left to the first step, GPipe's run of backwards without a forward between them records
        the gradient order m times over and DDP's rebuild fails."""
        if self.dp.world_size == 1 or self.fsdp:
            return
        rows = placeholder.inputs.size(0) // self.microbatches
        tokens = placeholder.inputs[:rows]
        hidden = torch.zeros(*tokens.shape, self.config.hidden_size, device=self.ctx.device)
        devices = [self.ctx.device.index] if self.ctx.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            for module, stage in zip(self.modules, self.stage_indices, strict=True):
                inputs = [tokens] if stage == 0 else [hidden.requires_grad_()]
                if self.carries_router_losses and stage > 0:
                    inputs += [torch.zeros((), device=self.ctx.device, requires_grad=True)] * 2
                kwargs = {"document_ids": placeholder.document_ids[:rows]} if self.document_masking else {}
                outputs = module(*inputs, **kwargs)
                outputs = outputs if isinstance(outputs, tuple) else (outputs,)
                sum(output.float().sum() for output in outputs).backward()
        for part in self.models:
            part.zero_grad(set_to_none=True)

    @torch.no_grad()
    def validation_loss(
        self, inputs: torch.Tensor, targets: torch.Tensor, document_ids: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """The mean ``lm_loss`` of one validation batch, forward only through the stages in order: each
        stage's residual stream goes to the next stage's rank by point-to-point send/recv over the pp group
        (no schedule: one batch, any size, no micro-batches, no autograd). Every pp rank of a dp group calls
        it with the same batch; returns the loss on the rank holding the last stage, None elsewhere.

        The residual stream travels as float32, which it is under autocast too (the embedding's output is
        float32 and each block adds to it), so the figure is the one-process validator's."""
        ranks, last = self.pp.world_size, self.split.num_stages - 1
        shape = (*inputs.shape[:2], self.config.hidden_size)
        loss = None
        modes = [part.training for part in self.models]
        for part in self.models:
            part.eval()
        try:
            for stage in range(self.split.num_stages):
                if stage % ranks != self.pp.rank:
                    continue
                part = self.models[self.stage_indices.index(stage)]
                x = inputs
                if stage > 0:
                    x = torch.empty(shape, dtype=torch.float32, device=self.ctx.device)
                    dist.recv(x, group=self.pp.group, group_src=(stage - 1) % ranks)
                with self.precision.autocast():
                    out = part(x, targets if stage == last else None, document_ids)
                if stage == last:
                    loss = out.lm_loss
                else:
                    dist.send(
                        out.logits.float().contiguous(), group=self.pp.group, group_dst=(stage + 1) % ranks
                    )
        finally:
            for part, mode in zip(self.models, modes, strict=True):
                part.train(mode)
        return loss

    # --- figures ------------------------------------------------------------------------------------------

    def reset_timers(self) -> None:
        for stage in self.stages:
            stage.busy_s = 0.0
        self._loss_busy_s = self._wall_s = 0.0
        self._steps = 0

    @property
    def theoretical_bubble(self) -> float:
        return theoretical_bubble(self.pp.world_size, self.microbatches, self.pp_virtual_stages)

    def metrics(self) -> dict[str, float]:
        """Collective (every rank): idle share and idle seconds per step of each pp rank since the last call,
        averaged over its dp ranks, on rank 0 (empty elsewhere)."""
        busy = sum(stage.busy_s for stage in self.stages) + self._loss_busy_s
        mine = (self.pp.rank, max(self._wall_s - busy, 0.0), self._wall_s, max(self._steps, 1))
        self.reset_timers()
        gathered = self.ctx.gather_objects(mine)
        if gathered is None:
            return {}
        figures: dict[str, float] = {"pipeline/bubble_theory": round(self.theoretical_bubble, 5)}
        shares = []
        for rank in range(self.pp.world_size):
            rows = [row for row in gathered if row[0] == rank]
            idle, wall = sum(row[1] for row in rows), sum(row[2] for row in rows)
            share = idle / wall if wall else 0.0
            shares.append(share)
            figures[f"pipeline/idle_fraction/rank{rank}"] = round(share, 5)
            figures[f"pipeline/idle_s/rank{rank}"] = round(idle / sum(row[3] for row in rows), 6)
        figures["pipeline/bubble_measured"] = round(sum(shares) / len(shares), 5)
        return figures

    def router_stats(self) -> list[dict]:
        """Collective: every MoE layer's routing on rank 0 (each pp rank's from its dp rank 0), [] elsewhere."""
        mine = []
        if self.dp.rank == 0:
            for part, first in zip(self.models, self.first_layers, strict=True):
                mine += [{**layer, "layer": layer["layer"] + first} for layer in part.router_stats()]
        gathered = self.ctx.gather_objects(mine)
        return sorted((layer for rows in gathered or [] for layer in rows), key=lambda layer: layer["layer"])

    def named_parameters(self):
        """The rank's parameters under the unsplit model's names."""
        for part, first in zip(self.models, self.first_layers, strict=True):
            for name, parameter in local_shards(part.named_parameters()):
                yield full_name(name, first), parameter

    def layout(self) -> dict[str, Any]:
        """What the log, the checkpoints and the manifest record about the pipeline."""
        return {
            "pp_degree": self.pp.world_size,
            "data_parallel_ranks": self.dp.world_size,
            "pp_virtual_stages": self.pp_virtual_stages,
            "pp_microbatches": self.microbatches,
            "schedule": type(self.schedule).__name__,
            "split": self.split.to_dict(),
            "tied_embedding": "copies kept in sync" if self.config.tie_word_embeddings else "untied",
            "bubble_theory": round(self.theoretical_bubble, 5),
        }

    def checkpoint_folder(self, checkpoints: Path) -> Path:
        return checkpoints / shard_folder(self.pp.rank, self.pp.world_size)

    def model_state(self) -> Stateful:
        return PipelineModelState(self)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> Stateful:
        if not self.fsdp:
            return super().optimizer_state(optimizer)
        return WholeTensorsOptimizerState(optimizer, self.dp.rank)

    def checkpoint_metadata(self) -> dict[str, Any]:
        return {"pipeline": {**self.layout(), "stages": self.stage_indices}}

    def sharded_states(self, optimizer: torch.optim.Optimizer) -> dict[str, Stateful]:
        """Each stage's state under the unsplit model's names, so a pipeline's shards load at another number
        of stages or none; a tied head's optimizer state under the embedding's name, as one process (which
        steps the one matrix) keeps it."""
        parts = [
            (part, functools.partial(full_name, first_layer=first))
            for part, first in zip(self.models, self.first_layers, strict=True)
        ]

        def optimizer_name(name: str) -> str:  # "<part index>.<name in the part>" in self.module
            index, local = name.split(".", 1)
            name = full_name(local, self.first_layers[int(index)])
            if self.config.tie_word_embeddings and name.startswith("lm_head.weight"):
                name = "embed_tokens.weight" + name.removeprefix("lm_head.weight")
            return name

        return {
            "model": ShardedModelState(parts),
            "optimizer": ShardedOptimizerState(self.module, optimizer, optimizer_name),
        }

    def describe(self) -> str:
        return (
            f"pipeline: {self.split.num_stages} stage(s) on {self.pp.world_size} pp rank(s) x "
            f"{self.dp.world_size} dp rank(s), {type(self.schedule).__name__}, {self.microbatches} "
            f"micro-batches, theoretical bubble {self.theoretical_bubble:.3f}; {self.split.describe()}; "
            f"this rank holds stage(s) {self.stage_indices}"
        )


class PipelineModelState(Stateful):
    """The rank's stages as the checkpoint part ``model``: their parameters under the unsplit model's names,
    so the shards of all pp ranks together are the unsplit model's state dict."""

    def __init__(self, pipeline: PipelineParallelism) -> None:
        self.pipeline = pipeline

    def state_dict(self) -> dict[str, Any]:
        """Collective over the dp group under FSDP (each sharded tensor gathered whole)."""
        state = {}
        for part, first in zip(self.pipeline.models, self.pipeline.first_layers, strict=True):
            state.update(
                {full_name(name, first): whole(tensor) for name, tensor in part.state_dict().items()}
            )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for part, first in zip(self.pipeline.models, self.pipeline.first_layers, strict=True):
            if not self.pipeline.fsdp:
                part.load_state_dict({name: state[full_name(name, first)] for name in part.state_dict()})
                continue
            with torch.no_grad():
                for name, tensor in part.state_dict().items():
                    tensor.copy_(like(state[full_name(name, first)], tensor))


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered whole (collective over its mesh); any other tensor as it is."""
    return tensor.full_tensor().cpu() if isinstance(tensor, DTensor) else tensor


def like(value: torch.Tensor, template: torch.Tensor) -> torch.Tensor:
    """``value`` (a whole tensor) laid out as ``template``: this rank's shard of it for a DTensor, cut
    locally (every rank holds the whole value)."""
    if not isinstance(template, DTensor):
        return value.to(template.device)
    return distribute_tensor(
        value.to(template.device), template.device_mesh, template.placements, src_data_rank=None
    )


class WholeTensorsOptimizerState(Stateful):
    """An optimizer over FSDP shards as the checkpoint part ``optimizer``, in a plain optimizer's layout:
    every sharded state tensor gathered whole (collective over the dp group), kept on dp rank 0; on load each
    rank cuts its shard of each whole tensor, laid out as its parameter."""

    def __init__(self, optimizer: torch.optim.Optimizer, rank: int) -> None:
        self.optimizer = optimizer
        self.rank = rank

    def state_dict(self) -> dict[str, Any]:
        state = self.optimizer.state_dict()
        gathered = {
            number: {key: whole(value) if torch.is_tensor(value) else value for key, value in entry.items()}
            for number, entry in state["state"].items()
        }
        return {"state": gathered, "param_groups": state["param_groups"]} if self.rank == 0 else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        parameters = [param for group in self.optimizer.param_groups for param in group["params"]]
        sharded = {}
        for number, entry in state["state"].items():
            param = parameters[int(number)]
            sharded[number] = {
                key: like(value, param) if torch.is_tensor(value) and value.shape == param.shape else value
                for key, value in entry.items()
            }
        self.optimizer.load_state_dict({"state": sharded, "param_groups": state["param_groups"]})
