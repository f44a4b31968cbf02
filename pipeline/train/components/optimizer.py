"""The optimizer, replicated (DDP) or sharded over the ranks (ZeRO-1): AdamW with weight decay on matrices
only, or (``train.optimizer=muon``) Muon on the blocks' 2-D weights with AdamW on the rest."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.optim import ZeroRedundancyOptimizer

from pipeline.train.config import TrainConfig

# Matrices that are not hidden-layer weights: a lookup table and the output classifier. Muon's
# orthogonalised update suits a linear map between hidden states, not these (Keller Jordan's post; modded-nanogpt,
# Moonlight and torchtitan leave both to AdamW). Names end so in the whole model and in a pipeline stage.
NOT_HIDDEN_MATRICES = ("embed_tokens.weight", "lm_head.weight")


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay on matrices (linear and embedding weights); norms and biases are left alone."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def muon_split(model: torch.nn.Module) -> tuple[list[str], list[str]]:
    """(names of the parameters Muon steps, names of those AdamW steps); a tied embedding/head counts once."""
    hidden, rest = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if param.dim() == 2 and not name.endswith(NOT_HIDDEN_MATRICES):
            hidden.append(name)
        else:
            rest.append(name)
    return hidden, rest


def muon_parameter_groups(model: torch.nn.Module, train: TrainConfig) -> list[dict[str, Any]]:
    """AdamW's groups first (so the logged ``lr``, the first group's, stays train.lr's schedule), then Muon's."""
    params = dict(model.named_parameters())
    hidden, rest = muon_split(model)
    return [
        {
            "params": [params[n] for n in rest if params[n].dim() >= 2],
            "weight_decay": train.weight_decay,
            "muon": False,
        },
        {"params": [params[n] for n in rest if params[n].dim() < 2], "weight_decay": 0.0, "muon": False},
        {
            "params": [params[n] for n in hidden],
            "lr": train.muon_lr,
            "momentum": train.muon_momentum,
            "weight_decay": train.muon_weight_decay,
            "adjust_lr_fn": train.muon_adjust_lr,
            "muon": True,
        },
    ]


class MuonWithAdamW(torch.optim.Optimizer):
    """``torch.optim.Muon`` on the groups marked ``muon``, ``torch.optim.AdamW`` on the others, as one optimizer.

    One ``param_groups`` list and one ``state``, shared with the two torch optimizers that do the steps: the LR
    scheduler, GradScaler's unscale, ``zero_grad``, the checkpoint (a plain optimizer state dict) and
    ZeRO-1 (which builds one of these per rank over its share of whole parameters, so Muon still sees each
    matrix whole) all see a single optimizer. ``adamw_options`` (lr, betas) are AdamW's defaults.
    """

    def __init__(self, params: Iterable[dict[str, Any]], **adamw_options: Any) -> None:
        self._adamw_options = adamw_options
        super().__init__(list(params), {})
        self._link()

    def _link(self) -> None:
        """Point the two torch optimizers at this one's groups and state (after a state load replaced them)."""
        self._parts: list[torch.optim.Optimizer] = []
        kinds: list[tuple[bool, Callable[..., torch.optim.Optimizer], dict[str, Any]]] = [
            (False, torch.optim.AdamW, self._adamw_options),
            (True, torch.optim.Muon, {}),
        ]
        for is_muon, optimizer_class, options in kinds:
            groups = [group for group in self.param_groups if bool(group.get("muon")) == is_muon]
            if groups:
                # Constructing fills each group's missing settings with the class's defaults, in place.
                part = optimizer_class(groups, **options)
                part.state = self.state
                self._parts.append(part)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if hasattr(self, "_adamw_options"):  # load_state_dict, not unpickling before __init__ ran
            self._link()

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("MuonWithAdamW.step takes no closure")
        for part in self._parts:
            part.step()


def build_optimizer(
    model: torch.nn.Module, train: TrainConfig, device: torch.device, process_group: Any = None
) -> torch.optim.Optimizer:
    """``process_group``: the ranks ZeRO-1 shards over (a pipeline stage's "dp" group); None: all."""
    options: dict[str, Any] = {"lr": train.lr, "betas": tuple(train.betas)}
    optimizer_class: type[torch.optim.Optimizer]
    if train.optimizer == "muon":
        # Not fused: the sync-free fused step (amp.py) would skip AdamW's part of a step but not Muon's.
        optimizer_class, groups = MuonWithAdamW, muon_parameter_groups(model, train)
    else:
        # The fused CUDA kernel is the fastest AdamW there; on CPU the default (foreach) is.
        if device.type == "cuda":
            options["fused"] = True
        optimizer_class, groups = torch.optim.AdamW, parameter_groups(model, train.weight_decay)
    if train.data_parallel == "zero1":
        return ZeroRedundancyOptimizer(
            groups, optimizer_class=optimizer_class, process_group=process_group, **options
        )
    return optimizer_class(groups, **options)


class OptimizerState(Stateful):
    """The optimizer as a checkpoint part.

    ``state_dict()`` is the full state on rank 0 (empty elsewhere: only rank 0 writes the checkpoint). Collective under ZeRO-1: every rank must call
    it, since each holds only its shard; the consolidated state has the same layout as a plain AdamW's.
    ``load_state_dict()`` takes that full state on every rank (ZeRO-1 keeps its own shard of it).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, rank: int) -> None:
        self.optimizer = optimizer
        self.rank = rank

    def state_dict(self) -> dict[str, Any]:
        if isinstance(self.optimizer, ZeroRedundancyOptimizer):
            self.optimizer.consolidate_state_dict(to=0)
        return self.optimizer.state_dict() if self.rank == 0 else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)
