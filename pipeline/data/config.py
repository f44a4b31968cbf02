"""The `data` config section: what the trainer reads (one snapshot, or a weighted mixture) and how it batches
token shards (pipeline.data)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from pipeline.core.config import FROZEN_INPUTS, Section
from pipeline.core.snapshots import SnapshotSelection, as_selection

CORPUS_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"  # project.corpus's


class MixtureSource(Section):
    """One source of a training mixture: some snapshots of one corpus, drawn with a share of the tokens."""

    corpus: str = Field(pattern=CORPUS_PATTERN)
    snapshots: str | list[str] = Field(
        "all",
        description="'all' (every complete snapshot), names, 'last:N', 'FROM..TO' (name order: ISO dates make "
        "it a date range) or a glob such as '2026-11-*'",
    )
    weight: float = Field(
        1.0, gt=0, description="share of the training tokens, relative to the other sources"
    )
    name: str | None = Field(
        None,
        pattern=CORPUS_PATTERN,
        description="how logs and per-source metrics name it; default the corpus (corpus:snapshots when the "
        "corpus is in the mixture twice)",
    )

    @field_validator("snapshots", mode="before")
    @classmethod
    def _names(cls, snapshots: object) -> object:
        return as_selection(snapshots)

    @field_validator("snapshots")
    @classmethod
    def _selection(cls, snapshots: str | list[str]) -> str | list[str]:
        SnapshotSelection.parse(snapshots)  # a ValueError here names the key and the grammar
        return snapshots

    @property
    def selection(self) -> SnapshotSelection:
        return SnapshotSelection.parse(self.snapshots)


class FrozenSource(Section):
    """One ``data.mixture`` source as resolved when the run's config was frozen."""

    name: str
    corpus: str = Field(pattern=CORPUS_PATTERN)
    selection: str = Field(description="the snapshots as declared ('all', 'last:2', ...), for the lineage")
    weight: float = Field(gt=0, description="normalised: the sources' weights add up to 1")
    snapshots: list[str] = Field(min_length=1, description="the complete outputs it chose, in name order")
    digests: list[str] = Field(min_length=1, description="each snapshot's manifest digest then")

    @model_validator(mode="after")
    def _one_digest_per_snapshot(self) -> FrozenSource:
        if len(self.digests) != len(self.snapshots):
            raise ValueError(f"{len(self.snapshots)} snapshot(s) but {len(self.digests)} digest(s)")
        return self


class FrozenMixture(Section):
    """``data.mixture`` resolved once, when the run's config was frozen: the stage read and each source."""

    stage: str
    sources: list[FrozenSource] = Field(min_length=1)


class DataConfig(Section):
    """What the trainer reads and how it batches token shards (pipeline.data)."""

    mixture: list[MixtureSource] | None = Field(
        None,
        min_length=1,
        description="train on a weighted mixture of corpora and snapshots (docs/training.md); null: the one "
        "snapshot being trained, as before",
    )
    resolved_mixture: FrozenMixture | None = Field(
        None,
        description="written when a run's config is frozen, not set by hand: data.mixture resolved then (the "
        "snapshots each source chose, with their manifest digests), which the training tasks and ranks read "
        "instead of resolving it again, refusing a snapshot that changed since",
        json_schema_extra=FROZEN_INPUTS,
    )
    batching: Literal["packed", "token_budget"] = Field(
        "packed",
        description="packed: fixed [batch_size, seq_len] windows over the token stream; token_budget: one "
        "document per row, rows of similar length batched up to max_tokens_per_batch (dynamic batching)",
    )
    max_tokens_per_batch: int | None = Field(
        None, gt=1, description="token_budget: padded tokens per rank batch; default batch_size * seq_len"
    )
    order_seed: int | None = Field(
        None,
        ge=0,
        description="the seed of the data order (which windows each step reads); null: project.seed, which "
        "also sets the initial weights. An ablation's A/A control keeps the weights' seed and changes this one",
    )
    verify_shards: bool = Field(
        True,
        description="before the first step, check every token shard against the tokenize manifest's sha256 "
        "and its token ids against the vocabulary (reads the shards once); false skips it for corpora too "
        "large to read twice, with a warning on every run",
    )

    def shuffle_seed(self, project_seed: int) -> int:
        """The data order's seed: ``order_seed``, else the project's."""
        return project_seed if self.order_seed is None else self.order_seed

    @model_validator(mode="after")
    def _distinct_source_names(self) -> DataConfig:
        if self.mixture:
            names = self.source_names()
            repeated = sorted({name for name in names if names.count(name) > 1})
            if repeated:
                raise ValueError(
                    f"mixture: two sources are both called {repeated}; give each a distinct name"
                )
        return self

    def source_names(self) -> list[str]:
        """Each mixture source's name: its ``name``, else its corpus, else corpus:snapshots."""
        sources = self.mixture or []
        corpora = [source.corpus for source in sources]
        return [
            source.name
            or (
                source.corpus
                if corpora.count(source.corpus) == 1
                else f"{source.corpus}:{source.selection.describe()}"
            )
            for source in sources
        ]
