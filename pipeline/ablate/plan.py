"""The plan of an ablation: for each variant, the corpus stages it runs and where their outputs go; which of
them another variant (or an earlier ablation) already made; the trainings and their token budget.

**Where a variant's outputs go.** Never into the base snapshot: each stage output of a variant lives at
``<root>/<corpus>/<stage>/<snapshot>.ab-<identity>/``, a snapshot name derived from the source snapshot and the
output's identity.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.ablate.spec import AblationSpec, Variant, corpus_chain
from pipeline.config import PipelineConfig, load_config
from pipeline.core.lineage import code_version
from pipeline.core.snapshots import variant_snapshot
from pipeline.core.storage import DatasetRef
from pipeline.stages import stage as registered_stage

ABLATE_FOLDER = "ablate"  # <root>/<corpus>/ablate/<name>/: the comparison (published) and its work files


@dataclass(frozen=True)
class StageStep:
    """One corpus stage of one variant: its input, its output and whether this plan runs it."""

    variant: str
    stage: str
    identity: str
    input: DatasetRef
    output: DatasetRef
    action: str  # "run" | "reuse" (complete already) | "shared" (an earlier variant of this plan runs it)


@dataclass(frozen=True)
class Training:
    variant: str
    seed: int
    tokens: DatasetRef  # the variant's token shards
    run_id: str

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
    variant_outputs: dict[str, dict[str, str]] = field(default_factory=dict)  # variant -> stage -> snapshot

    @property
    def tokens(self) -> int:
        """What every training sees: the budget rounded up to whole optimizer steps."""
        return self.train_steps * self.tokens_per_step

    def final_tokens(self, variant: str) -> DatasetRef:
        return next(s.output for s in reversed(self.steps) if s.variant == variant)

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec.to_dict(),
            "tokenizer": self.tokenizer,
            "stages": [
                {
                    "variant": s.variant,
                    "stage": s.stage,
                    "snapshot": s.output.snapshot,
                    "input": f"{s.input.stage}/{s.input.snapshot}",
                    "identity": s.identity,
                    "action": s.action,
                }
                for s in self.steps
            ],
            "trainings": [
                {"variant": t.variant, "seed": t.seed, "snapshot": t.tokens.snapshot, "run_id": t.run_id}
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
            f"from {self.spec.source.stage}/{self.spec.source.snapshot}; base {self.spec.base}; "
            f"tokenizer {self.tokenizer}",
            "corpus stages:",
        ]
        for s in self.steps:
            lines.append(
                f"  {s.variant:<16} {s.stage:<14} {s.action:<7} -> {s.output.stage}/{s.output.snapshot}"
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
            done = DatasetRef(
                t.tokens.root, t.tokens.corpus, "train", t.tokens.snapshot, t.run_id
            ).is_complete()
            lines.append(f"  {t.variant:<16} seed {t.seed:<4} run {t.run_id}{' (done)' if done else ''}")
        return "\n".join(lines)


def tokenizer_name(spec: AblationSpec) -> str:
    return spec.tokenizer or f"ablate-{spec.name}"


def base_config(spec: AblationSpec, config_path: str | Path | None, overrides: list[str]) -> PipelineConfig:
    return load_config(config_path, [*overrides, f"tokenize.tokenizer={tokenizer_name(spec)}"])


def variant_config(
    spec: AblationSpec, variant: Variant, config_path: str | Path | None, overrides: list[str]
) -> PipelineConfig:
    return load_config(
        config_path, [*overrides, f"tokenize.tokenizer={tokenizer_name(spec)}", *variant.overrides]
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
    data_parallel = train.nproc_per_node * train.nnodes // train.pipeline_stages
    return train.batch_size * train.seq_len * train.grad_accum * data_parallel


def make_plan(spec: AblationSpec, config_path: str | Path | None, overrides: list[str]) -> Plan:
    config = base_config(spec, config_path, overrides)
    root, corpus = config.project.data_root, config.project.corpus
    source = DatasetRef(root, corpus, spec.source.stage, spec.source.snapshot)
    source_identity = source.manifest().digest  # MissingInputError names the missing source
    steps: list[StageStep] = []
    planned: set[str] = set()
    outputs: dict[str, dict[str, str]] = {}
    for variant in spec.variants:
        vconfig = variant_config(spec, variant, config_path, overrides)
        upstream, identity = source, source_identity
        outputs[variant.name] = {}
        for name in corpus_chain():
            identity = stage_identity(vconfig, name, identity)
            output = DatasetRef(root, corpus, name, variant_snapshot(spec.source.snapshot, identity))
            action = "shared" if identity in planned else ("reuse" if output.is_complete() else "run")
            planned.add(identity)
            steps.append(StageStep(variant.name, name, identity, upstream, output, action))
            outputs[variant.name][name] = output.snapshot
            upstream = output
    per_step = tokens_per_step(config)
    train_steps = max(1, math.ceil(spec.tokens / per_step))
    every = max(1, train_steps // spec.eval_points)
    recipe = training_recipe(config, train_steps, every)
    trainings = []
    for variant in spec.variants:
        final = next(s.output for s in reversed(steps) if s.variant == variant.name)
        for seed in spec.seeds:
            run_id = f"ab-{spec.name}-{variant.slug}-s{seed}-{recipe}"
            trainings.append(Training(variant.name, seed, final, run_id))
    return Plan(spec, tokenizer_name(spec), steps, trainings, train_steps, per_step, every, outputs)


def training_recipe(config: PipelineConfig, train_steps: int, every: int) -> str:
    """A short digest of what every training shares (model, optimizer, schedule, batches, steps), in each run's
    name: a rerun with the same recipe finds its finished runs, a changed recipe trains new ones."""
    sections = {name: getattr(config, name).model_dump(mode="json") for name in ("model", "train", "data")}
    sections["train"].pop("run_id", None)
    payload = {"sections": sections, "steps": train_steps, "every": every}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:8]


def training_overrides(plan: Plan, training: Training) -> list[str]:
    """What makes every training the same but its seed: steps (so tokens), checkpoints at the eval points,
    packed batches (every step exactly tokens_per_step tokens), the seed and the run's name."""
    checkpoints = math.ceil(plan.train_steps / plan.checkpoint_every)
    return [
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
