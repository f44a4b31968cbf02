"""How a rank trains its share of the model: the parallelism component the trainer composes.

torchtitan's trainer holds ``model_parts`` and lets the parallelism own the step; so does ours. A
``Parallelism`` owns forward and backward of one step (``forward_backward``), the gradients' last
reductions, the global gradient norm and the optimizer step through the precision's scaler
(``clip_and_step``), the validation forward (``validation_loss``), the loss report (``reported_loss``), the
model's checkpoint part and where its files go, and its own figures. The trainer's step is then the same
whatever the parallelism:

    optimizer.zero_grad(); loss = parallelism.forward_backward(batches); parallelism.clip_and_step(...)

Three kinds exist: ``DataParallelism`` (one process, or DDP / ZeRO-1 over every rank, with optional gradient
compression and ``torch.compile``) and ``FullyShardedParallelism`` (FSDP2 over every rank), here, and ``PipelineParallelism`` (stages over a pp x dp mesh,
``pipeline.train.distributed.pipeline_parallel``). ``pipeline.train.trainer.build_parallelism`` picks one from the config.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.stateful import Stateful
from torch.nn.parallel import DistributedDataParallel

from pipeline.config import PipelineConfig
from pipeline.data.sequences import IGNORE_INDEX, Batch
from pipeline.model.gpt import GPT
from pipeline.train.components.amp import MixedPrecision
from pipeline.train.components.optimizer import OptimizerState
from pipeline.train.distributed.compression import CompressionState, GradientCompression, build_compression
from pipeline.train.distributed.process_groups import DistributedContext, data_parallel, settle_buckets


@dataclass
class StepLoss:
    """One step's loss as this rank knows it: its part of the token-mean ``lm_loss`` over all ranks (summed
    by ``Parallelism.reported_loss``), and the tokens the step trained on over all ranks."""

    loss_sum: torch.Tensor
    tokens: int
    rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    """For batches that name each row's mixture source (``SourcedBatch``): this rank's summed ``lm_loss`` per
    row, its predicted tokens per row and its source, over the step's micro-batches (per-source loss);
    None when the parallelism cannot tell (a pipeline, or a fused cross-entropy that builds no logits)."""


@contextlib.contextmanager
def eval_mode(parts: list[nn.Module]) -> Iterator[None]:
    """Every part in eval mode (no dropout, MoE's eval capacity) for the block; their modes restored after."""
    modes = [part.training for part in parts]
    for part in parts:
        part.eval()
    try:
        yield
    finally:
        for part, mode in zip(parts, modes, strict=True):
            part.train(mode)


class Parallelism(ABC):
    """This rank's share of the model and how it trains. ``ctx``: every rank; ``data``: the ranks that share the
    data (the loader, the validator and ZeRO-1 split over them); ``module``: this rank's parameters as one module
    (the optimizer's); ``model_parts``: the models this rank runs."""

    ctx: DistributedContext
    data: DistributedContext
    precision: MixedPrecision
    module: nn.Module
    model_parts: list[GPT]
    lockstep_forward: bool = False
    """Whether every forward is collective (FSDP gathers parameters in it), so every rank must run as many
    validation forwards as the others."""

    def __init__(self, ctx: DistributedContext, config: PipelineConfig, precision: MixedPrecision) -> None:
        """What every kind shares: the ranks (all of them share the data unless a subclass narrows
        ``data``), the precision, and how batches are built (packed rows, document masking)."""
        self.ctx = self.data = ctx
        self.precision = precision
        self.packed = config.data.batching == "packed"
        self.document_masking = config.train.document_masking

    # --- one step -------------------------------------------------------------------------------------

    @abstractmethod
    def forward_backward(self, batches: list[Batch]) -> StepLoss:
        """Gradients of the step's token-mean loss over all ranks' micro-batches (``train.grad_accum`` of
        them; one batch under a pipeline, which it cuts into its own micro-batches)."""

    def finish_gradients(self) -> None:
        """What the gradients still need after backward before they are the whole model's (none by default)."""
        return None

    def step_options(self) -> dict[str, Any]:
        """``MixedPrecision.step``'s options for a rank holding part of the model (the norm over all parts, the
        scalers' agreement); none when every rank holds the whole model."""
        return {}

    def clip_and_step(self, optimizer: torch.optim.Optimizer, max_norm: float) -> torch.Tensor:
        """Finish the gradients, clip them to ``max_norm`` by the global norm and step unless one is not finite
        (``MixedPrecision.step``); returns the norm before clipping."""
        self.finish_gradients()
        return self.precision.step(optimizer, self.module.parameters(), max_norm, **self.step_options())

    def reported_loss(self, step: StepLoss) -> float:
        """The step's loss over all ranks, the figure logged (collective)."""
        return self.ctx.all_reduce(step.loss_sum.clone()).item()

    # --- evaluation and samples -----------------------------------------------------------------------

    @abstractmethod
    def validation_loss(
        self, inputs: torch.Tensor, targets: torch.Tensor, document_ids: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """The mean ``lm_loss`` of one validation batch in eval mode, forward only; None on a rank that does
        not compute it (its windows are counted where the loss is)."""

    @property
    def whole_model(self) -> GPT | None:
        """The whole model, when this rank holds it (for sample generations), else None."""
        return None

    @abstractmethod
    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """This rank's parameters under the unsplit model's names."""

    @abstractmethod
    def router_stats(self) -> list[dict]:
        """Every MoE layer's routing of the latest forward, on rank 0 (collective)."""

    def metrics(self) -> dict[str, float]:
        """The parallelism's own figures since the last call (collective)."""
        return {}

    # --- checkpoint -----------------------------------------------------------------------------------

    @abstractmethod
    def model_state(self) -> Stateful:
        """The checkpoint part ``model``: this rank's parameters under the unsplit model's names."""

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> Stateful:
        """The checkpoint part ``optimizer``: the whole optimizer's state, as a plain AdamW's."""
        return OptimizerState(optimizer, self.data.rank)

    def sharded_states(self, optimizer: torch.optim.Optimizer) -> dict[str, Stateful]:
        """The parts ``model`` and ``optimizer`` as ``train.checkpoint_format=dcp`` saves them: this rank's
        sharded state dicts (``torch.distributed.checkpoint.state_dict``: DTensor shards under FSDP, whole
        tensors otherwise) under the unsplit model's names, so that any layout reads any other's."""
        return {
            "model": ShardedModelState([(self.module, _same_name)]),
            "optimizer": ShardedOptimizerState(self.module, optimizer, _same_name),
        }

    def rank_states(self) -> dict[str, Stateful]:
        """Parts each rank checkpoints for itself besides its RNG streams."""
        return {}

    def checkpoint_folder(self, checkpoints: Path) -> Path:
        """Where this rank's checkpoint files go (its data rank 0 writes them)."""
        return checkpoints

    def layout(self) -> dict[str, Any] | None:
        """What the manifest records about the split; None when nothing is split."""
        return None

    def checkpoint_metadata(self) -> dict[str, Any]:
        """What this rank's checkpoint files record about the split, for their readers."""
        return {}

    def describe(self) -> str:
        return f"{type(self).__name__} on {self.ctx.world_size} rank(s)"


class DataParallelism(Parallelism):
    """The whole model on every rank: one process, or DDP (``train.data_parallel`` ddp, or zero1 with the
    optimizer sharded) over every rank, reducing gradients once per step on the last micro-batch, optionally
    through a compression hook (``train.grad_compression``) and compiled (``train.compile``)."""

    def __init__(
        self, model: GPT, ctx: DistributedContext, config: PipelineConfig, precision: MixedPrecision
    ) -> None:
        super().__init__(ctx, config, precision)
        train = config.train
        self.model = model
        self.module = model
        self.model_parts = [model]
        self.parallel_model = data_parallel(model, ctx, train)
        self.ddp = self.parallel_model if isinstance(self.parallel_model, DistributedDataParallel) else None
        settle_buckets(self.parallel_model, lambda: _placeholder(train, ctx.device), precision.autocast)
        self.compression: GradientCompression | None = None
        if self.ddp is not None:
            self.compression = build_compression(
                train.grad_compression,
                ctx.world_size,
                powersgd_rank=train.powersgd_rank,
                powersgd_start_step=train.powersgd_start_step,
                seed=config.project.seed,
            )
            if self.compression is not None:
                self.compression.register(self.ddp)
        self.forward_model = torch.compile(self.parallel_model) if train.compile else self.parallel_model

    def forward_backward(self, batches: list[Batch]) -> StepLoss:
        ctx = self.ctx
        local_tokens = [batch.num_tokens for batch in batches]
        if self.packed:
            step_tokens = sum(local_tokens) * ctx.world_size  # every row is full
        else:
            step_tokens = ctx.sum_cpu(sum(local_tokens))
        loss_sum = torch.zeros((), device=ctx.device)
        rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        for index, batch in enumerate(batches):
            batch = batch.to(ctx.device, non_blocking=True)
            last = index == len(batches) - 1
            # Reduce gradients once per step, on the last micro-batch.
            with self.gradient_sync(last):
                with self.precision.autocast():
                    out = self.forward_model(
                        batch.inputs, batch.targets, batch.document_ids if self.document_masking else None
                    )
                share = local_tokens[index] / step_tokens
                self.precision.backward(out.loss * (share * ctx.world_size))
            loss_sum += out.lm_loss.detach().float() * share
            if batch.sources is not None and out.logits is not None:
                rows.append(row_losses(out.logits.detach(), batch.targets, batch.sources))
        stacked = None
        if rows and len(rows) == len(batches):
            row_loss, row_tokens, row_sources = zip(*rows, strict=True)
            stacked = (torch.cat(row_loss), torch.cat(row_tokens), torch.cat(row_sources))
        return StepLoss(loss_sum, step_tokens, stacked)

    def gradient_sync(self, last: bool) -> contextlib.AbstractContextManager:
        """The context of one micro-batch's backward: DDP reduces only on the last one."""
        return contextlib.nullcontext() if last or self.ddp is None else self.ddp.no_sync()

    @torch.no_grad()
    def validation_loss(self, inputs, targets, document_ids=None):
        with eval_mode(self.model_parts), self.precision.autocast():
            return self.model(inputs, targets, document_ids).lm_loss

    @property
    def whole_model(self) -> GPT:
        return self.model

    def named_parameters(self):
        return self.model.named_parameters()

    def router_stats(self) -> list[dict]:
        return self.model.router_stats()

    def metrics(self) -> dict[str, float]:
        return self.compression.stats.collect() if self.compression is not None else {}

    def model_state(self) -> Stateful:
        return self.model

    def rank_states(self) -> dict[str, Stateful]:
        if self.compression is None:
            return {}
        return {"compression": CompressionState(self.compression, self.ctx.device)}

    def describe(self) -> str:
        if self.ddp is None:
            return "one process"
        return f"data parallel over {self.ctx.world_size} ranks"


class FullyShardedParallelism(DataParallelism):
    """FSDP2 (``train.data_parallel`` fsdp): every transformer block, then the root (embedding, final norm and
    head, tied or not), is ``fully_shard``-ed over a one-dimensional ``DeviceMesh`` of every rank, torchtitan's
    pattern. Each rank holds 1/world of every parameter, gradient and optimizer state (the optimizer steps
    the DTensor shards); a block's parameters are all-gathered just before its forward and backward and its
    gradients reduce-scattered (averaged, in fp32) after its backward, once per step on the last micro-batch.

    ``train.precision`` bf16 gathers the parameters as bf16 for compute (``MixedPrecisionPolicy``) while the
    sharded master weights, the gradient reduction and the optimizer stay fp32; autocast stays on too, so the
    ops it keeps in fp32 (softmax, the loss) still are. Checkpoints hold the whole model and a plain AdamW's
    optimizer state, gathered to rank 0 (``torch.distributed.checkpoint.state_dict``'s full state dicts), so
    they are the files a DDP run writes: export reads them, and either kind resumes from either. With
    ``train.checkpoint_format=dcp`` each rank writes its own shards instead (``sharded_states``)."""

    lockstep_forward = True

    def __init__(
        self, model: GPT, ctx: DistributedContext, config: PipelineConfig, precision: MixedPrecision
    ) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        Parallelism.__init__(self, ctx, config, precision)  # not DataParallelism's: no DDP here
        train = config.train
        self.compression = None
        self.ddp = None
        self.replicas = train.dp_replicate
        if self.replicas > 1:
            # HSDP, torchtitan's layout: a 2-D mesh whose rows each shard the model and whose columns hold
            # replicas of one shard. fully_shard then reduce-scatters gradients within a row and all-reduces the
            # shards across rows: the average over every rank, as plain FSDP's.
            self.mesh = init_device_mesh(
                ctx.device.type,
                (self.replicas, ctx.world_size // self.replicas),
                mesh_dim_names=("dp_replicate", "dp_shard"),
            )
        else:
            self.mesh = init_device_mesh(ctx.device.type, (ctx.world_size,), mesh_dim_names=("dp_shard",))
        fully_shard_model(model, self.mesh, train, precision)
        self.model = model
        self.module = model
        self.model_parts = [model]
        self.parallel_model = model
        self.forward_model = torch.compile(model) if train.compile else model

    def gradient_sync(self, last: bool) -> contextlib.AbstractContextManager:
        # Micro-batches before the last accumulate unsharded gradients; the last one reduce-scatters.
        self.model.set_requires_gradient_sync(last)  # type: ignore[operator]  # FSDPModule's, added by fully_shard
        return contextlib.nullcontext()

    def step_options(self) -> dict[str, Any]:
        return {"total_norm": _sharded_total_norm}

    @torch.no_grad()
    def validation_loss(self, inputs, targets, document_ids=None):
        with eval_mode(self.model_parts), self.precision.autocast():
            return self.model(inputs, targets, document_ids).lm_loss.float()

    @property
    def whole_model(self) -> None:  # type: ignore[override]  # each rank holds a shard: no samples
        return None

    def named_parameters(self):
        return local_shards(self.model.named_parameters())

    def metrics(self) -> dict[str, float]:
        return {}

    def model_state(self) -> Stateful:
        return FullModelState(self.model)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> Stateful:
        return FullOptimizerState(self.model, optimizer, self.ctx.rank)

    def rank_states(self) -> dict[str, Stateful]:
        return {}

    def describe(self) -> str:
        if self.replicas > 1:
            return (
                f"hybrid sharded (HSDP, FSDP2): {self.replicas} replicas x "
                f"{self.ctx.world_size // self.replicas} shards"
            )
        return f"fully sharded (FSDP2) over {self.ctx.world_size} ranks"


def local_shards(named: Iterator[tuple[str, nn.Parameter]]) -> Iterator[tuple[str, nn.Parameter]]:
    """Each FSDP parameter's shard on this rank (with its gradient's) under its name, any other parameter as
    it is: what histograms see (rank 0's shards; a DTensor has no numpy view)."""
    from torch.distributed.tensor import DTensor

    for name, param in named:
        if not isinstance(param, DTensor):
            yield name, param
            continue
        local = nn.Parameter(param.to_local(), requires_grad=False)
        local.grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
        yield name, local


def fully_shard_model(model: GPT, mesh: Any, train: Any, precision: MixedPrecision) -> None:
    """``fully_shard`` every block of ``model`` (a whole model or a pipeline stage's part), then the model
    itself, over ``mesh`` (one dimension: the ranks that shard it; two, (dp_replicate, dp_shard): HSDP),
    torchtitan's pattern."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(
        param_dtype=precision.dtype,  # None (fp32) leaves them as they are
        reduce_dtype=torch.float32,
    )
    for block in model.blocks:
        fully_shard(
            block, mesh=mesh, mp_policy=policy, reshard_after_forward=train.fsdp_reshard_after_forward
        )
    # The root's parameters are used last in forward and first in backward: resharding them would only
    # gather them again at once.
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)


def _sharded_total_norm(parameters: list[torch.Tensor]) -> torch.Tensor:
    """The whole model's gradient norm from DTensor gradient shards: each rank's partial norm, reduced over
    the mesh (``full_tensor``), so clipping scales every shard by the same factor one process would."""
    from torch.distributed.tensor import DTensor

    norm = torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None])
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


class FullModelState(Stateful):
    """An FSDP model as the checkpoint part ``model``: the whole model's state dict under its usual names on
    rank 0 (empty elsewhere; collective), loaded on every rank from the whole state dict."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(
            self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(self.model, state, options=StateDictOptions(full_state_dict=True))


class FullOptimizerState(Stateful):
    """An optimizer over FSDP's shards as the checkpoint part ``optimizer``: on rank 0 the whole state in a
    plain optimizer's layout (parameters numbered in group order, as ``Optimizer.state_dict`` numbers them;
    ``torch.distributed.checkpoint.state_dict`` keys them by name), so DDP and FSDP checkpoints are one
    format; collective. Loading renames the numbers back and gives each rank its shard."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, rank: int) -> None:
        self.model = model
        self.optimizer = optimizer
        self.rank = rank

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        by_name: Any = get_optimizer_state_dict(
            self.model, self.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        if self.rank != 0:
            return {}
        number: dict[str, int] = {}
        groups = []
        for group in by_name["param_groups"]:
            numbers = [number.setdefault(name, len(number)) for name in group["params"]]
            groups.append({**group, "params": numbers})
        return {
            "state": {number[name]: value for name, value in by_name["state"].items()},
            "param_groups": groups,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        names = {id(param): name for name, param in self.model.named_parameters()}
        ordered = [names[id(param)] for group in self.optimizer.param_groups for param in group["params"]]
        by_name: Any = {
            "state": {ordered[int(number)]: value for number, value in state["state"].items()},
            "param_groups": [
                {**group, "params": [ordered[int(number)] for number in group["params"]]}
                for group in state["param_groups"]
            ],
        }
        set_optimizer_state_dict(
            self.model, self.optimizer, by_name, options=StateDictOptions(full_state_dict=True)
        )


def _same_name(name: str) -> str:
    return name


class ShardedModelState(Stateful):
    """Model parts as the DCP checkpoint part ``model``: each part's sharded state dict
    (``get_model_state_dict``), its names turned into the unsplit model's by the part's ``rename``."""

    def __init__(self, parts: Sequence[tuple[nn.Module, Callable[[str], str]]]) -> None:
        self.parts = parts

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return {
            rename(name): value
            for part, rename in self.parts
            for name, value in get_model_state_dict(part).items()
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

        for part, rename in self.parts:
            set_model_state_dict(part, {name: state[rename(name)] for name in get_model_state_dict(part)})


class ShardedOptimizerState(Stateful):
    """An optimizer as the DCP checkpoint part ``optimizer``: ``get_optimizer_state_dict``'s flattened form
    (``state.<parameter>.<key>`` and ``param_groups.<parameter>.<key>``: one entry per parameter, so ranks
    holding other parameters, pipeline stages, never write the same key with other values), the parameter
    names turned into the unsplit model's by ``rename``. Loading initialises the optimizer's state if it
    has none yet, so DCP has tensors of this rank's layout to read into (Muon's momentum as AdamW's moments)."""

    def __init__(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, rename: Callable[[str], str]
    ) -> None:
        self.module = module
        self.optimizer = optimizer
        self.rename = rename

    def _options(self) -> Any:
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(flatten_optimizer_state_dict=True)

    def _key(self, key: str) -> str:
        kind, name = key.split(".", 1)
        return f"{kind}.{self.rename(name)}"

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        flat: Any = get_optimizer_state_dict(self.module, self.optimizer, options=self._options())
        return {self._key(key): value for key, value in flat.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

        own: Any = get_optimizer_state_dict(self.module, self.optimizer, options=self._options())
        set_optimizer_state_dict(
            self.module,
            self.optimizer,
            {key: state[self._key(key)] for key in own},
            options=self._options(),
        )


@torch.no_grad()
def row_losses(
    logits: torch.Tensor, targets: torch.Tensor, sources: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(summed cross-entropy, predicted tokens, source) of each row: the per-source loss's parts."""
    per_token = F.cross_entropy(
        logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
    )
    return (
        per_token.view_as(targets).sum(dim=1),
        (targets != IGNORE_INDEX).sum(dim=1),
        sources.to(targets.device),
    )


def _placeholder(train, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Throw-away inputs and targets of one micro-batch's shape (DDP's bucket settling)."""
    zeros = torch.zeros((train.batch_size, train.seq_len), dtype=torch.long, device=device)
    return zeros, zeros


def placeholder_batch(train, device: torch.device) -> Batch:
    inputs, targets = _placeholder(train, device)
    return Batch(inputs, targets, inputs)
