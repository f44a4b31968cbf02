"""The plan of an ablation: for each variant, the corpus stages it runs and where their outputs go; which of
them another variant (or an earlier ablation) already made; the trainings and their token budget.

**Where a variant's outputs go.** Never into the base snapshot: each stage output of a variant lives at
``<root>/<corpus>/<stage>/<snapshot>.ab-<identity>/``, a snapshot name derived from the source snapshot and the
output's identity. A mixture source has one such chain per variant and selected snapshot (a *part*), in that
snapshot's own corpus; the variant's trainings read all its parts as the spec's weighted ``data.mixture``.

**When an output is reused (the equality rule).** An output's identity is the sha256 of: the stage's name, the
identity of its input (for the first stage, the source's manifest digest: its files' checksums), the values
of the config sections the stage owns (as the stage registry declares them, e.g. ``clean``; ``dedup``;
``tokenizer`` and ``tokenize`` for tokenize), and the code version. Two variants' outputs of a stage are the
same output exactly when their identities are equal: the folder is named by it, so the second finds it
complete and reads it instead of running the stage again. A variant may override only corpus stages'
sections (``spec.variant_sections``) and everything else in the config is common to all variants, so the
sections a stage owns plus its input are all that can differ between variants at that stage: a ``dedup``
change leaves every variant's ``clean`` identity, and so its output, shared.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.ablate.heldout import read_reference
from pipeline.ablate.spec import AblationSpec, Variant, corpus_chain
from pipeline.config import PipelineConfig, load_config
from pipeline.core.config import ConfigError
from pipeline.core.lineage import code_version
from pipeline.core.snapshots import variant_snapshot
from pipeline.core.storage import DatasetRef
from pipeline.stages import stage as registered_stage

ABLATE_FOLDER = "ablate"  # <root>/<corpus>/ablate/<name>/: the comparison (published) and its work files
# The A/A control trains the base with each seed's initial weights and the data order of seed + this, so it
# differs from the base only as two variants' trainings of one seed do (same weights, another order).
CONTROL_ORDER_OFFSET = 1_000_003


@dataclass(frozen=True)
class StageStep:
    """One corpus stage of one variant: its input, its output and whether this plan runs it."""

    variant: str
    stage: str
    identity: str
    input: DatasetRef
    output: DatasetRef
    action: str  # "run" | "reuse" (complete already) | "shared" (an earlier variant of this plan runs it)
    part: int = 0  # which of the plan's source parts (one per source snapshot) this chain starts from


@dataclass(frozen=True)
class SourcePart:
    """One snapshot the corpus stages start from: the source's own, or one a mixture source selected."""

    source: str  # the mixture source's name (data.mixture's rule); the corpus for a single snapshot
    ref: DatasetRef


@dataclass(frozen=True)
class Training:
    variant: str
    seed: int
    tokens: tuple[DatasetRef, ...]  # the variant's token shards, one tokenize output per source part
    run_id: str
    snapshot: str  # the train stage's folder: the tokenize output's snapshot, or the mixture's own name
    mixture: tuple[dict[str, Any], ...] = ()  # data.mixture over the variant's outputs (a mixture source)
    order_seed: int | None = None  # the A/A control's data order (data.order_seed); None: the seed's own

    @property
    def key(self) -> str:
        return f"{self.variant}@{self.seed}"


@dataclass
class Plan:
    spec: AblationSpec
    tokenizer: str
    steps: list[StageStep]
    trainings: list[Training]
    train_steps: int
    tokens_per_step: int
    checkpoint_every: int
    parts: list[SourcePart]
    root: str  # project.data_root
    corpus: str  # project.corpus: where the trainings, the shared tokenizer and the comparison go

    @property
    def tokens(self) -> int:
        """What every training sees: the budget rounded up to whole optimizer steps."""
        return self.train_steps * self.tokens_per_step

    def stage_outputs(self, variant: str, stage: str) -> list[DatasetRef]:
        """The variant's outputs of one stage, one per source part, in part order."""
        return [s.output for s in self.steps if s.variant == variant and s.stage == stage]

    def stage_inputs(self, variant: str, stage: str) -> list[DatasetRef]:
        return [s.input for s in self.steps if s.variant == variant and s.stage == stage]

    def final_tokens(self, variant: str) -> list[DatasetRef]:
        """The variant's token shards (its tokenize outputs), one per source part."""
        return self.stage_outputs(variant, corpus_chain()[-1])

    def arm_tokens(self, arm: str) -> list[DatasetRef]:
        """What an arm trains on: a variant's token shards; the A/A control's are the base's."""
        return self.final_tokens(self.spec.base if arm == self.spec.control_name else arm)

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec.to_dict(),
            "tokenizer": self.tokenizer,
            "stages": [
                {
                    "variant": s.variant,
                    "stage": s.stage,
                    "snapshot": s.output.snapshot,
                    "input": f"{s.input.corpus}/{s.input.stage}/{s.input.snapshot}",
                    "identity": s.identity,
                    "action": s.action,
                }
                for s in self.steps
            ],
            "trainings": [
                {
                    "variant": t.variant,
                    "seed": t.seed,
                    "snapshot": t.snapshot,
                    "tokens": [f"{ref.corpus}/{ref.snapshot}" for ref in t.tokens],
                    "run_id": t.run_id,
                }
                for t in self.trainings
            ],
            "train_steps": self.train_steps,
            "tokens_per_step": self.tokens_per_step,
            "tokens": self.tokens,
            "checkpoint_every": self.checkpoint_every,
        }

    def describe(self) -> str:
        """The plan as a person reads it (``--dry-run``)."""
        lines = [
            f"ablation {self.spec.name}: {len(self.spec.variants)} variants x {len(self.spec.seeds)} seeds "
            f"from {self.spec.source.describe()}; base {self.spec.base}; "
            f"tokenizer {self.tokenizer}",
            "corpus stages:",
        ]
        for s in self.steps:
            corpus = f"{s.output.corpus}/" if len({p.ref.corpus for p in self.parts}) > 1 else ""
            lines.append(
                f"  {s.variant:<16} {s.stage:<14} {s.action:<7} -> {corpus}{s.output.stage}/{s.output.snapshot}"
            )
        counts = {
            action: sum(s.action == action for s in self.steps) for action in ("run", "shared", "reuse")
        }
        lines.append(
            f"  {counts['run']} to run, {counts['shared']} shared between variants, {counts['reuse']} reused "
            "(complete already)"
        )
        lines.append(
            f"trainings: {len(self.trainings)} ({self.train_steps} steps x {self.tokens_per_step:,} tokens = "
            f"{self.tokens:,} tokens each; eval every {self.checkpoint_every} steps)"
        )
        for t in self.trainings:
            done = train_output(self, t).is_complete()
            lines.append(f"  {t.variant:<16} seed {t.seed:<4} run {t.run_id}{' (done)' if done else ''}")
        return "\n".join(lines)


def tokenizer_name(spec: AblationSpec) -> str:
    return spec.tokenizer or f"ablate-{spec.name}"


def base_config(
    spec: AblationSpec, config_path: str | Path | None, overrides: list[str], tokenizer: str | None = None
) -> PipelineConfig:
    return load_config(
        config_path, [*spec.proxy, *overrides, f"tokenize.tokenizer={tokenizer or tokenizer_name(spec)}"]
    )


def variant_config(
    spec: AblationSpec,
    variant: Variant,
    config_path: str | Path | None,
    overrides: list[str],
    tokenizer: str | None = None,
    corpus: str | None = None,
) -> PipelineConfig:
    """The config a variant's stages run with: the common one, the shared tokenizer, the variant's
    overrides, and for a source part in another corpus that corpus (its stages read and write there)."""
    elsewhere = [f"project.corpus={corpus}"] if corpus else []
    return load_config(
        config_path,
        [
            *overrides,
            *elsewhere,
            f"tokenize.tokenizer={tokenizer or tokenizer_name(spec)}",
            *variant.overrides,
        ],
    )


def stage_identity(config: PipelineConfig, stage: str, input_identity: str) -> str:
    """The equality rule (module docstring): stage, input, the stage's own config sections, code version."""
    sections = {
        name: getattr(config, name).model_dump(mode="json")
        for name in sorted(registered_stage(stage).sections)
    }
    payload = {"stage": stage, "input": input_identity, "sections": sections, "code": code_version()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def tokens_per_step(config: PipelineConfig) -> int:
    """Tokens one optimizer step consumes with packed batches, over all data-parallel ranks."""
    train = config.train
    data_parallel = train.nproc_per_node * train.nnodes // train.pp_degree
    return train.batch_size * train.seq_len * train.grad_accum * data_parallel


def tokenizer_reference(spec: AblationSpec, home: str) -> str:
    """How every variant's tokenize names the one tokenizer: qualified by the corpus that stores it
    (``CORPUS/NAME``), since a source part in another corpus would look for a bare name in its own."""
    name = tokenizer_name(spec)
    return name if "/" in name else f"{home}/{name}"


def source_parts(spec: AblationSpec, config: PipelineConfig) -> list[SourcePart]:
    """The snapshots the corpus stages start from: the source snapshot, or each snapshot every mixture
    source selects among the complete outputs of the source stage (a MixtureError names the source)."""
    from pipeline.data.mixture import resolve_source

    root, corpus, stage = config.project.data_root, config.project.corpus, spec.source.stage
    if not spec.source.mixture:
        return [SourcePart(corpus, DatasetRef(root, corpus, stage, spec.source.snapshot))]
    parts: list[SourcePart] = []
    names = spec.source.source_names()
    for index, (name, source) in enumerate(zip(names, spec.source.mixture, strict=True)):
        refs, _ = resolve_source(root, f"source.mixture[{index}] ({name})", source, source.selection, stage)
        parts.extend(SourcePart(name, ref) for ref in refs)
    return parts


def make_plan(spec: AblationSpec, config_path: str | Path | None, overrides: list[str]) -> Plan:
    try:  # the last step reads it: a missing or empty one is refused before the first stage runs
        read_reference(spec.reference, spec.max_eval_documents)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"ablation spec: reference: {exc}") from None
    home = load_config(config_path, overrides)
    root = home.project.data_root
    parts = source_parts(spec, home)
    tokenizer = tokenizer_reference(spec, home.project.corpus)
    config = base_config(spec, config_path, overrides, tokenizer)
    steps: list[StageStep] = []
    planned: set[DatasetRef] = set()
    for variant in spec.variants:
        for index, part in enumerate(parts):
            vconfig = variant_config(spec, variant, config_path, overrides, tokenizer, part.ref.corpus)
            upstream = part.ref
            identity = part.ref.manifest().digest  # MissingInputError names the missing source
            for name in corpus_chain():
                identity = stage_identity(vconfig, name, identity)
                output = DatasetRef(
                    root, part.ref.corpus, name, variant_snapshot(part.ref.snapshot, identity)
                )
                action = "shared" if output in planned else ("reuse" if output.is_complete() else "run")
                planned.add(output)
                steps.append(StageStep(variant.name, name, identity, upstream, output, action, index))
                upstream = output
    per_step = tokens_per_step(config)
    train_steps = max(1, math.ceil(spec.tokens / per_step))
    every = max(1, train_steps // spec.eval_points)
    recipe = training_recipe(config, train_steps, every)
    trainings = []
    for variant in spec.variants:
        final = [s for s in steps if s.variant == variant.name and s.stage == corpus_chain()[-1]]
        tokens = tuple(step.output for step in final)
        snapshot, mixture = tokens[0].snapshot, tuple[dict[str, Any], ...]()
        if spec.source.mixture:
            # The run's folder, named after the ablation and the variant's token outputs.
            snapshot = variant_snapshot(spec.name, combined_identity([step.identity for step in final]))
            mixture = training_mixture(spec, parts, tokens)
        for seed in spec.seeds:
            run_id = f"ab-{spec.name}-{variant.slug}-s{seed}-{recipe}"
            trainings.append(Training(variant.name, seed, tokens, run_id, snapshot, mixture))
    if spec.control:
        base = [t for t in trainings if t.variant == spec.base]
        trainings += [
            Training(
                spec.control_name,
                t.seed,
                t.tokens,
                t.run_id.replace(f"-s{t.seed}-", f"-aa-s{t.seed}-"),
                t.snapshot,
                t.mixture,
                t.seed + CONTROL_ORDER_OFFSET,
            )
            for t in base
        ]
    return Plan(
        spec, tokenizer, steps, trainings, train_steps, per_step, every, parts, root, home.project.corpus
    )


def combined_identity(identities: list[str]) -> str:
    return hashlib.sha256("\n".join(identities).encode()).hexdigest()[:16]


def training_mixture(
    spec: AblationSpec, parts: list[SourcePart], tokens: tuple[DatasetRef, ...]
) -> tuple[dict[str, Any], ...]:
    """``data.mixture`` for one variant: the spec's sources, names and weights, each naming the variant's
    tokenize outputs of the snapshots that source selected."""
    mixture = []
    for name, source in zip(spec.source.source_names(), spec.source.mixture, strict=True):
        mine = [ref for part, ref in zip(parts, tokens, strict=True) if part.source == name]
        mixture.append(
            {
                "name": name,
                "corpus": source.corpus,
                "snapshots": [ref.snapshot for ref in mine],
                "weight": source.weight,
            }
        )
    return tuple(mixture)


def train_output(plan: Plan, training: Training) -> DatasetRef:
    """Where a training's run is published: ``train/<snapshot>/<run_id>`` of the project's corpus."""
    return DatasetRef(plan.root, plan.corpus, "train", training.snapshot, training.run_id)


def training_recipe(config: PipelineConfig, train_steps: int, every: int) -> str:
    """A short digest of what every training shares (model, optimizer, schedule, batches, steps), in each run's
    name: a rerun with the same recipe finds its finished runs, a changed recipe trains new ones."""
    sections = {name: getattr(config, name).model_dump(mode="json") for name in ("model", "train", "data")}
    for key in ("run_id", "threads_per_rank"):  # a run's name and its share of the cores change no result
        sections["train"].pop(key, None)
    payload = {"sections": sections, "steps": train_steps, "every": every}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:8]


def training_overrides(plan: Plan, training: Training) -> list[str]:
    """What makes every training the same but its seed: steps (so tokens), checkpoints at the eval points,
    packed batches (every step exactly tokens_per_step tokens), the seed and the run's name; for a mixture
    source, the variant's mixture; for the A/A control, its data order."""
    checkpoints = math.ceil(plan.train_steps / plan.checkpoint_every)
    mixture = [f"data.mixture={json.dumps(list(training.mixture))}"] if training.mixture else []
    order = [] if training.order_seed is None else [f"data.order_seed={training.order_seed}"]
    return [
        *mixture,
        *order,
        f"project.seed={training.seed}",
        f"train.steps={plan.train_steps}",
        f"train.checkpoint_every={plan.checkpoint_every}",
        f"train.keep_checkpoints={checkpoints}",
        "data.batching=packed",
        f"train.run_id={training.run_id}",
        "train.resume=true",
    ]


def ablation_ref(config: PipelineConfig, spec: AblationSpec) -> DatasetRef:
    return DatasetRef(config.project.data_root, config.project.corpus, ABLATE_FOLDER, spec.name)


def work_folder(config: PipelineConfig, spec: AblationSpec) -> Path:
    """Files an ablation keeps between its steps (reference shards, each training's evaluations): beside its
    published folder, hidden from snapshot listings, kept across reruns so a rerun resumes."""
    ref = ablation_ref(config, spec)
    return ref.path.parent / f".work-{spec.name}"
