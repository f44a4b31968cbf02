"""A training mixture resolved against the data root, and checked, before any training work starts.

``data.mixture`` (``pipeline.data.config.MixtureSource``) names corpora, snapshot selections and weights;
``resolve_mixture`` turns it into the token shards each source reads and refuses, with one line naming the
source, anything that would make training read the wrong thing: an unknown corpus, a snapshot without a
complete tokenize output, a selection that matches nothing, a snapshot with no training tokens, and
snapshots tokenized with different tokenizers (by digest, ``pipeline.data.tokenizer_files``), since their ids
would mean different words. With no ``data.mixture`` the mixture is the one snapshot being trained (the
default: a mixture of one source, which ``pipeline.data.loader`` reads in the single-snapshot order).

A run resolves its mixture once, when its config is frozen (``freeze_mixture`` writes the resolution into
``data.resolved_mixture``); the train task and every rank read that (``training_mixture``), checking each
snapshot's manifest digest, so they all train what was chosen then.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.config import ConfigError
from pipeline.core.manifest import Manifest
from pipeline.core.snapshots import SnapshotSelection, snapshot_folders
from pipeline.core.storage import DatasetRef, local_path
from pipeline.data.config import FrozenMixture, FrozenSource, MixtureSource
from pipeline.data.tokenizer_files import manifest_digest

log = logging.getLogger(__name__)
TOKENS_STAGE = "tokenize"
TRAIN_SPLIT = "train"
# What every snapshot of a mixture must agree on besides the digest (implied by it; checked for outputs whose
# manifests predate digests).
TOKENIZER_FACTS = ("vocab_size", "dtype", "eos_token", "eos_id", "pad_token", "pad_id")


class MixtureError(ConfigError):
    """The mixture cannot be read as declared; the message names the source and what to change."""


@dataclass(frozen=True)
class ResolvedSource:
    """One source: the complete tokenize outputs it reads, in name order, and its share of the tokens."""

    name: str
    corpus: str
    selection: str
    weight: float  # normalised: the sources' weights add up to 1
    refs: tuple[DatasetRef, ...]
    manifests: tuple[Manifest, ...]

    @property
    def snapshots(self) -> list[str]:
        return [ref.snapshot for ref in self.refs]

    @property
    def train_tokens(self) -> int:
        return sum(recorded_train_tokens(manifest) or 0 for manifest in self.manifests)

    def folders(self, split: str = TRAIN_SPLIT) -> list[Path]:
        return [ref.path / split for ref in self.refs]


@dataclass(frozen=True)
class Mixture:
    sources: tuple[ResolvedSource, ...]
    tokenizer_digest: str
    tokenizer: dict[str, Any]  # TOKENIZER_FACTS, from the tokenize manifests
    is_default: bool  # no data.mixture: the one snapshot being trained

    @property
    def names(self) -> list[str]:
        return [source.name for source in self.sources]

    @property
    def weights(self) -> list[float]:
        return [source.weight for source in self.sources]

    @property
    def refs(self) -> list[DatasetRef]:
        """Every tokenize output the mixture reads (the inputs of a training run)."""
        return [ref for source in self.sources for ref in source.refs]

    def lineage(self) -> list[dict[str, Any]]:
        """One entry per input snapshot: which source, corpus, snapshot, manifest digest and tokenizer."""
        return [
            {
                "source": source.name,
                "weight": source.weight,
                "corpus": ref.corpus,
                "snapshot": ref.snapshot,
                "path": str(ref.path),
                "digest": manifest.digest,
                "tokenizer_digest": self.tokenizer_digest,
                "train_tokens": recorded_train_tokens(manifest),
            }
            for source in self.sources
            for ref, manifest in zip(source.refs, source.manifests, strict=True)
        ]


def recorded_train_tokens(manifest: Manifest) -> int | None:
    """The training tokens a tokenize manifest counted; None for an output written without the count."""
    tokens = manifest.counters.get("tokens")
    if not isinstance(tokens, dict) or TRAIN_SPLIT not in tokens:
        return None
    return int(tokens[TRAIN_SPLIT])


def _corpora(root: str) -> list[str]:
    folder = local_path(root)
    return (
        sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        if folder.is_dir()
        else []
    )


def resolve_source(
    root: str, where: str, source: MixtureSource, selection: SnapshotSelection, stage: str
) -> tuple[list[DatasetRef], list[Manifest]]:
    """The complete ``stage`` outputs of one source's corpus that its selection picks (``where`` names the
    source in errors), with their manifests."""
    if not (local_path(root) / source.corpus).is_dir():
        raise MixtureError(
            f"{where}: unknown corpus {source.corpus!r}; corpora under {root}: {_corpora(root)}"
        )
    folders = snapshot_folders(root, source.corpus, stage)
    refs = {name: DatasetRef(root, source.corpus, stage, name) for name in folders}
    complete = [name for name in folders if refs[name].is_complete()]
    missing = selection.missing(folders)
    if missing:
        raise MixtureError(
            f"{where}: corpus {source.corpus} has no {stage} output for snapshot(s) {missing} "
            f"(complete: {complete or 'none'}); run `pretrain {stage} --snapshot ...` first"
        )
    if selection.explicit:
        incomplete = [name for name in selection.names if name not in complete]
        if incomplete:
            raise MixtureError(
                f"{where}: the {stage} output of {source.corpus} snapshot(s) {incomplete} is incomplete (no "
                f"_SUCCESS or manifest.json at {refs[incomplete[0]].path}): still being written, or it failed"
            )
    chosen = selection.select(complete)
    if not chosen:
        raise MixtureError(
            f"{where}: snapshots {selection.describe()!r} match no complete {stage} output of corpus "
            f"{source.corpus} (complete: {complete or 'none'})"
        )
    skipped = [name for name in selection.select(folders) if name not in complete]
    if skipped:
        log.warning("%s: leaving out incomplete %s outputs %s", where, stage, skipped)
    manifests = [refs[name].manifest() for name in chosen]
    for name, manifest in zip(chosen, manifests, strict=True):
        if recorded_train_tokens(manifest) == 0:
            raise MixtureError(f"{where}: {source.corpus} snapshot {name} has no {TRAIN_SPLIT} tokens")
    return [refs[name] for name in chosen], manifests


def _check_one_tokenizer(resolved: list[tuple[str, list[DatasetRef], list[Manifest]]]) -> tuple[str, dict]:
    """The one tokenizer digest (and its facts) every snapshot shares; else an error naming two that differ."""
    first: tuple[str, DatasetRef, str, dict] | None = None
    for name, refs, manifests in resolved:
        for ref, manifest in zip(refs, manifests, strict=True):
            digest = manifest_digest(manifest)
            facts = {key: manifest.extra.get(key) for key in TOKENIZER_FACTS}
            if first is None:
                first = (name, ref, digest, facts)
                continue
            first_name, first_ref, first_digest, first_facts = first
            if digest != first_digest or facts != first_facts:
                raise MixtureError(
                    f"data.mixture: snapshots tokenized with different tokenizers cannot be mixed (their ids "
                    f"mean different text): source {first_name} {first_ref.corpus}/{first_ref.snapshot} has "
                    f"tokenizer digest {first_digest}, source {name} {ref.corpus}/{ref.snapshot} has "
                    f"{digest}; tokenize both with one (tokenize.tokenizer, docs/token-shards.md)"
                )
    assert first is not None
    return first[2], first[3]


def resolve_mixture(config: Any, snapshot: str | None = None, stage: str = TOKENS_STAGE) -> Mixture:
    """``data.mixture`` of ``config`` (the pipeline's tree, ``pipeline.config.PipelineConfig``) resolved against
    ``project.data_root`` (or, when it is not set, ``snapshot`` of ``project.corpus`` alone); raises
    MixtureError naming the source at fault. A run resolves it once, when its config is frozen
    (``freeze_mixture``); its later processes read that (``training_mixture``)."""
    root = config.project.data_root
    declared = config.data.mixture
    is_default = not declared
    if is_default:
        if snapshot is None:
            raise MixtureError("no data.mixture and no snapshot: nothing to train on")
        declared = [MixtureSource(corpus=config.project.corpus, snapshots=[snapshot])]
        names = [config.project.corpus]
    else:
        names = config.data.source_names()
    total = sum(source.weight for source in declared)
    resolved = []
    for index, (source, name) in enumerate(zip(declared, names, strict=True)):
        where = f"data.mixture[{index}] ({name})" if not is_default else f"snapshot {snapshot}"
        refs, manifests = resolve_source(root, where, source, source.selection, stage)
        resolved.append(
            (name, source.corpus, source.selection.describe(), source.weight / total, refs, manifests)
        )
    return _mixture(resolved, is_default)


def _mixture(
    resolved: list[tuple[str, str, str, float, list[DatasetRef], list[Manifest]]], is_default: bool
) -> Mixture:
    """The mixture of sources (name, corpus, selection, normalised weight, refs, manifests), once their
    snapshots are known to share one tokenizer."""
    digest, facts = _check_one_tokenizer(
        [(name, refs, manifests) for name, _, _, _, refs, manifests in resolved]
    )
    sources = tuple(
        ResolvedSource(
            name=name,
            corpus=corpus,
            selection=selection,
            weight=weight,
            refs=tuple(refs),
            manifests=tuple(manifests),
        )
        for name, corpus, selection, weight, refs, manifests in resolved
    )
    mixture = Mixture(sources, digest, facts, is_default)
    if not is_default:
        for source in sources:
            log.info(
                "mixture source %s: %d token(s) in %s snapshot(s) of %s (%s), weight %.4f",
                source.name,
                source.train_tokens,
                len(source.refs),
                source.corpus,
                source.selection,
                source.weight,
            )
    return mixture


def freeze_mixture(config: Any, snapshot: str | None, stage: str = TOKENS_STAGE) -> Any:
    """``config`` with its ``data.mixture`` resolved, once, into ``data.resolved_mixture`` (each source's
    snapshots and their manifest digests), for a run whose config is about to be frozen; ``config`` itself
    when it declares no mixture (the one snapshot is all there is to resolve, by the process that trains it).
    A stale resolution is replaced."""
    if not config.data.mixture:
        return config
    mixture = resolve_mixture(config, snapshot=snapshot, stage=stage)
    frozen = FrozenMixture(
        stage=stage,
        sources=[
            FrozenSource(
                name=source.name,
                corpus=source.corpus,
                selection=source.selection,
                weight=source.weight,
                snapshots=source.snapshots,
                digests=[manifest.digest for manifest in source.manifests],
            )
            for source in mixture.sources
        ],
    )
    return config.with_values({"data.resolved_mixture": frozen.model_dump()}, source="the run's resolution")


def read_frozen_mixture(config: Any, stage: str = TOKENS_STAGE) -> Mixture:
    """The mixture ``data.resolved_mixture`` froze, checked against the data root: every snapshot still
    complete, with the manifest digest it had (else a MixtureError naming it: re-tokenized or replaced since),
    and the resolution made from this ``data.mixture`` for this ``stage``."""
    frozen: FrozenMixture = config.data.resolved_mixture
    declared = config.data.mixture or []
    made_from = [(s.name, s.corpus, s.selection, s.weight) for s in frozen.sources]
    total = sum(source.weight for source in declared)
    this = [
        (name, source.corpus, source.selection.describe(), source.weight / total)
        for name, source in zip(config.data.source_names(), declared, strict=True)
    ]
    if frozen.stage != stage or made_from != this:
        raise MixtureError(
            f"data.resolved_mixture was resolved from the {frozen.stage} outputs of the sources {made_from}, "
            f"not from data.mixture {this} of the {stage} outputs: leave it out, and the launcher resolves "
            "data.mixture again"
        )
    root = config.project.data_root
    resolved = []
    for source in frozen.sources:
        refs = [DatasetRef(root, source.corpus, stage, snapshot) for snapshot in source.snapshots]
        manifests = []
        for ref, digest in zip(refs, source.digests, strict=True):
            where = f"data.resolved_mixture ({source.name}): {stage} output {ref.corpus}/{ref.snapshot}"
            if not ref.is_complete():
                raise MixtureError(
                    f"{where} is no longer complete (no _SUCCESS or manifest.json at {ref.path})"
                )
            manifest = ref.manifest()
            if manifest.digest != digest:
                raise MixtureError(
                    f"{where} changed since the run's config was frozen (manifest digest {manifest.digest}, "
                    f"frozen {digest}): the run trains what it resolved; start a new run to train on it"
                )
            manifests.append(manifest)
        resolved.append((source.name, source.corpus, source.selection, source.weight, refs, manifests))
    return _mixture(resolved, is_default=False)


def training_mixture(config: Any, snapshot: str | None, stage: str = TOKENS_STAGE) -> Mixture:
    """What a run trains on: the resolution frozen into its config (``read_frozen_mixture``), else (no
    mixture, or a config nobody froze: a test's in-process trainer) ``resolve_mixture``."""
    if config.data.resolved_mixture is not None:
        return read_frozen_mixture(config, stage)
    return resolve_mixture(config, snapshot=snapshot, stage=stage)
