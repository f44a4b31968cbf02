"""The training loader: endless batches from a mixture of sources, split by data-parallel rank, resumable to
the exact batch.

One ``TrainLoader`` reads every kind of run. Its parts:

- **sources**: the mixture's, one dataset each (``pipeline.data.sequences``). A single snapshot (no
  ``data.mixture``) is a mixture of one source.
- **batching** (``pipeline.data.batching``, chosen by ``data.batching``): what one unit of the order is (a
  packed window, or a token-budget batch of documents), how one epoch of a source orders its units, and how a
  rank's units become a ``Batch``.
- **order**: which unit of which source each step reads. Epoch e of source i is its units in the order seeded
  by ``key_i + [e]``. The one-snapshot order and the mixture's differ, and each is kept as it always was, so
  that runs and their checkpoints continue unchanged:

  - ``EpochOrder`` (a single snapshot; key ``[seed]``): the epochs of the one source in turn; a step takes
    the next ``world_size`` shares of the epoch, rank r taking share r; the last units of an epoch that
    cannot fill a step are skipped. The state is the epoch and the position in it, so a run resumed with
    another data-parallel size continues at the same position with the rest of the epoch split over the new
    ranks (only the incomplete last step of the epoch, dropped in any case, differs).
  - ``BlendOrder`` (a declared ``data.mixture``, even of one source; key ``[seed, i]``): Megatron's blend
    (``pipeline.data.blend``) over the sources; the j-th unit drawn from source i is the (j mod n_i)-th of
    its epoch (j div n_i), so a source smaller than its share is repeated, every time in a fresh order
    (``source_epochs()`` counts how often). The blend is one sequence of units, the same for any number of
    ranks; each step takes the next ``world_size`` runs of ``units_per_rank`` and rank r takes run r. The
    state is the position in the sequence; nothing is skipped. With ``packed`` batching units of every
    source hold ``seq_len`` tokens, so shares of units are shares of tokens; with ``token_budget`` batches
    hold different numbers of tokens, and the rule runs on ``w_i / t_i``, normalised, where ``t_i`` is source
    i's mean tokens per batch (its first epoch's tokens over its batches), so the token shares match the
    weights on average. Each batch is a ``SourcedBatch``: ``batch.sources[b]`` is the index (in
    ``source_names``) of row b's source.

``state_dict()`` holds the order's position plus the seed, the sources' fingerprints and the batching
settings that define the order; a checkpoint made with other ones is refused naming the difference. Its
``kind`` (``packed``, ``token_budget``, ``blended_packed``, ``blended_token_budget``) and fields are those
every earlier run wrote, so their checkpoints still resume.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from pipeline.data.batching import Batching, Dataset, EpochUnits, batching_for
from pipeline.data.blend import Blend
from pipeline.data.mixture import Mixture
from pipeline.data.sequences import Batch, SourcedBatch

log = logging.getLogger(__name__)
STATE_VERSION = 1


class SourceEpochs:
    """One source's units, epoch e in the order seeded by ``key + [e]``; the j-th unit drawn is unit
    j mod (epoch size) of epoch j div (epoch size)."""

    def __init__(self, dataset: Dataset, key: list[int], batching: Batching) -> None:
        self.dataset = dataset
        self.key = key
        self.batching = batching
        self._epochs: dict[int, EpochUnits] = {}
        first = self.units(0)
        self.tokens_per_unit = batching.tokens_per_unit(dataset, first)
        self.fixed_size = batching.fixed_epoch_size(dataset, first)
        self._starts = [0, len(first)]  # first unit of each epoch, as far as known

    def units(self, epoch: int) -> EpochUnits:
        units = self._epochs.get(epoch)
        if units is None:
            units = self.batching.epoch_units(self.dataset, [*self.key, epoch])
            # Keep this epoch and the one before: a step may straddle the two.
            self._epochs = {e: u for e, u in self._epochs.items() if e == epoch - 1} | {epoch: units}
        return units

    def size(self, epoch: int) -> int:
        return self.fixed_size if self.fixed_size is not None else len(self.units(epoch))

    def epoch_of(self, drawn: int) -> tuple[int, int]:
        """(epoch, index in it) of the unit drawn after ``drawn`` others."""
        if self.fixed_size is not None:
            return divmod(drawn, self.fixed_size)
        while self._starts[-1] <= drawn:
            epoch = len(self._starts) - 1
            self._starts.append(self._starts[-1] + len(self.units(epoch)))
        epoch = bisect.bisect_right(self._starts, drawn) - 1
        return epoch, drawn - self._starts[epoch]

    def drawn(self, drawn: int) -> Any:
        epoch, index = self.epoch_of(drawn)
        return self.units(epoch)[index]

    def fingerprint(self) -> str:
        return self.dataset.fingerprint()


class EpochOrder:
    """A single snapshot: its one source's epochs in turn, a step never straddling two."""

    kind_prefix = ""
    names_sources = False  # its batches are plain ``Batch``es

    def __init__(self, source: SourceEpochs, units_per_step: int) -> None:
        self.source = source
        self.units_per_step = units_per_step
        self.epoch = 0
        self.position = 0  # units of this epoch's order consumed by all ranks together

    @property
    def batches_per_epoch(self) -> int:
        """Steps in the current epoch."""
        return self.source.size(self.epoch) // self.units_per_step

    def take(self, rank: int, world_size: int, per_rank: int) -> list[tuple[int, Any]]:
        step = self.units_per_step
        if self.position + step > self.source.size(self.epoch):
            self.epoch += 1
            self.position = 0
        units = self.source.units(self.epoch)
        first = self.position + rank * per_rank
        self.position += step
        return [(0, units[index]) for index in range(first, first + per_rank)]

    def position_state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def identity(self) -> dict[str, Any]:
        return {"dataset": self.source.fingerprint()}

    def figures(self) -> dict[str, Any]:
        return {}

    def restore(self, state: dict[str, Any], world_size: int) -> None:
        epoch, position = int(state["epoch"]), int(state["position"])
        if not 0 <= position <= self.source.size(epoch):
            raise ValueError(f"checkpoint position {position} is outside epoch {epoch}")
        if state["world_size"] != world_size:
            log.warning(
                "resharding the data loader: checkpoint from %d data-parallel ranks, this run has %d; "
                "continuing epoch %d at position %d with the rest split over the new ranks",
                state["world_size"],
                world_size,
                epoch,
                position,
            )
        self.epoch, self.position = epoch, position


class BlendOrder:
    """A declared mixture: Megatron's blend of the sources, one endless sequence of units."""

    kind_prefix = "blended_"
    names_sources = True  # its batches are ``SourcedBatch``es

    def __init__(
        self, names: Sequence[str], weights: Sequence[float], sources: Sequence[SourceEpochs]
    ) -> None:
        self.names = list(names)
        self.weights = list(weights)
        self.sources = list(sources)
        # Units of one source carry t_i tokens on average: draw w_i / t_i of them for w_i of the tokens.
        rates = [
            weight / source.tokens_per_unit for weight, source in zip(self.weights, sources, strict=True)
        ]
        self.blend = Blend(rates, self.names)
        self.position = 0  # units of the blend consumed by all ranks together

    def take(self, rank: int, world_size: int, per_rank: int) -> list[tuple[int, Any]]:
        first = self.position + rank * per_rank
        owners, drawn = self.blend.locate(np.arange(first, first + per_rank, dtype=np.int64))
        self.position += per_rank * world_size
        return [
            (owner, self.sources[owner].drawn(number))
            for owner, number in zip(owners.tolist(), drawn.tolist(), strict=True)
        ]

    def position_state(self) -> dict[str, Any]:
        return {"position": self.position}

    def identity(self) -> dict[str, Any]:
        return {
            "sources": list(self.names),
            "weights": list(self.weights),
            "period": self.blend.period,
            "datasets": [source.fingerprint() for source in self.sources],
        }

    def source_samples(self) -> dict[str, int]:
        return dict(zip(self.names, map(int, self.blend.drawn(self.position)), strict=True))

    def source_epochs(self) -> dict[str, float]:
        epochs = {}
        for name, source, drawn in zip(
            self.names, self.sources, self.blend.drawn(self.position), strict=True
        ):
            epoch, index = source.epoch_of(int(drawn))
            epochs[name] = epoch + index / source.size(epoch)
        return epochs

    def figures(self) -> dict[str, Any]:
        # For people reading a checkpoint; recomputed from the position on resume.
        return {"source_samples": self.source_samples(), "source_epochs": self.source_epochs()}

    def restore(self, state: dict[str, Any], world_size: int) -> None:
        position = int(state["position"])
        if position < 0:
            raise ValueError(f"checkpoint position {position} is negative")
        if state["world_size"] != world_size:
            log.warning(
                "resharding the mixture loader: checkpoint from %d data-parallel ranks, this run has %d; "
                "continuing at sample %d with the rest split over the new ranks",
                state["world_size"],
                world_size,
                position,
            )
        self.position = position


class TrainLoader:
    """Endless batches of ``datasets`` (one per mixture source), batched by ``batching``, in the order of a
    single snapshot (``one_snapshot``) or of a declared mixture (``mixture``); see the module's docstring."""

    def __init__(
        self,
        names: Sequence[str],
        datasets: Sequence[Dataset],
        batching: Batching,
        weights: Sequence[float] | None,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
    ) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a data-parallel group of size {world_size}")
        self.source_names = list(names)
        self.datasets = list(datasets)
        self.batching = batching
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.order: EpochOrder | BlendOrder
        if weights is None:
            (dataset,) = datasets
            batching.check(datasets, ["the snapshot"])
            source = SourceEpochs(dataset, [seed], batching)
            units_per_step = batching.units_per_rank * world_size
            if source.size(0) < units_per_step:
                raise ValueError(batching.too_few(source.size(0), world_size))
            self.order = EpochOrder(source, units_per_step)
        else:
            weights = _mixture_weights(names, datasets, weights)
            batching.check(datasets, [f"source {name}" for name in names])
            sources = [
                SourceEpochs(dataset, [seed, index], batching) for index, dataset in enumerate(datasets)
            ]
            self.order = BlendOrder(names, weights, sources)
        self.kind = self.order.kind_prefix + batching.kind

    @classmethod
    def one_snapshot(
        cls, dataset: Dataset, batching: Batching, rank: int = 0, world_size: int = 1, seed: int = 0
    ) -> TrainLoader:
        return cls(["snapshot"], [dataset], batching, None, rank=rank, world_size=world_size, seed=seed)

    @classmethod
    def mixture(
        cls,
        names: Sequence[str],
        datasets: Sequence[Dataset],
        weights: Sequence[float],
        batching: Batching,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
    ) -> TrainLoader:
        return cls(names, datasets, batching, weights, rank=rank, world_size=world_size, seed=seed)

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        picks = self.order.take(self.rank, self.world_size, self.batching.units_per_rank)
        batch, rows = self.batching.batch([(self.datasets[source], unit) for source, unit in picks])
        if not self.order.names_sources:
            return batch
        sources = torch.tensor([picks[row][0] for row in rows], dtype=torch.int64)
        return SourcedBatch(*batch, sources)

    # --- what the trainer logs and records -------------------------------------------------------------

    @property
    def reports_sources(self) -> bool:
        """Whether the run's figures are kept per source (``loss.<source>``, ``val_loss.<source>``,
        ``epochs.<source>``, the mixture's names in its lineage): a declared mixture's, whose batches name
        their rows' sources; a single snapshot's figures are the run's own. Its order declares it."""
        return self.order.names_sources

    def source_figures(self) -> dict[str, Any]:
        """A declared mixture's ``source_samples`` (units each source has given so far, all ranks) and
        ``source_epochs`` (passes over each source so far: 2.25 means twice through and a quarter of the
        third; above 1 the source is being repeated); empty for a single snapshot."""
        return self.order.figures()

    # --- checkpointing ---------------------------------------------------------------------------------

    def _identity(self) -> dict[str, Any]:
        """Settings that define the order; a checkpoint is only valid with the same ones."""
        return {"seed": self.seed, **self.order.identity(), **self.batching.identity()}

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "kind": self.kind,
            **self.order.position_state(),
            "world_size": self.world_size,
            **self._identity(),
            **self.order.figures(),
            **self.batching.recorded(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` left off. Raises ValueError, naming the difference, if the checkpoint was
        made with another kind of loader, seed, sources, weights, data or batching setting; a different
        data-parallel size is resharded: the next step starts at the saved position, split over this run's
        ranks."""
        if state.get("version") != STATE_VERSION or state.get("kind") != self.kind:
            raise ValueError(
                f"the checkpoint's data loader state ({state.get('kind')!r}, version {state.get('version')}) "
                f"is not a {self.kind!r} state of version {STATE_VERSION}; it cannot be resumed by this loader"
            )
        for key, value in self._identity().items():
            if state.get(key) != value:
                raise ValueError(
                    f"cannot resume the data loader: the checkpoint has {key}={state.get(key)!r}, this run has "
                    f"{value!r}; resuming would not continue the same sample order"
                )
        self.order.restore(state, self.world_size)


def _mixture_weights(
    names: Sequence[str], datasets: Sequence[Dataset], weights: Sequence[float]
) -> list[float]:
    """The weights normalised, after checking there is one name and one positive weight per source."""
    if not (len(names) == len(weights) == len(datasets)) or not names:
        raise ValueError("a mixture needs one name and one weight per source, and at least one source")
    if len(set(names)) != len(names):
        raise ValueError(f"mixture source names must be distinct, got {list(names)}")
    if any(not weight > 0 for weight in weights):
        raise ValueError(f"mixture weights must be positive, got {list(weights)}")
    total = sum(weights)
    return [weight / total for weight in weights]


def build_loader(mixture: Mixture, config, rank: int = 0, world_size: int = 1) -> TrainLoader:
    """The training loader for ``mixture`` (``pipeline.data.mixture.resolve_mixture``), batched as
    ``config.data`` says (batching, max_tokens_per_batch), sized by ``config.train`` (seq_len, batch_size).
    No ``data.mixture`` (the mixture is the one snapshot being trained): the one-snapshot order."""
    batching = batching_for(config, mixture.tokenizer.get("pad_id"))
    datasets = [batching.dataset(source.folders(), config.train.seq_len) for source in mixture.sources]
    weights = None if mixture.is_default else mixture.weights
    seed = config.data.shuffle_seed(config.project.seed)
    return TrainLoader(
        mixture.names, datasets, batching, weights, rank=rank, world_size=world_size, seed=seed
    )
