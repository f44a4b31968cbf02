"""Run an ablation: the corpus stages per variant (sharing what is identical, ``pipeline.ablate.plan``), one
tokenizer, the checked held-out reference, one training per variant and seed through the same torchrun
launch as `pretrain train`, each checkpoint scored on the fixed eval sets, and the comparison.

Three steps, so a DAG can map the middle one: ``prepare`` (corpus stages, tokenizer, reference),
``train_and_evaluate`` (one training; a finished one is skipped, its evaluation kept) and ``compare``.
``run_ablation`` runs the three in order. A rerun of a killed ablation skips every finished stage output
(complete outputs are reused) and training (a complete run is never trained again; an unfinished one
resumes from its newest checkpoint through the trainer's own resume).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.ablate import heldout
from pipeline.ablate.plan import (
    Plan,
    Training,
    base_config,
    make_plan,
    train_output,
    training_overrides,
    variant_config,
    work_folder,
)
from pipeline.ablate.spec import AblationSpec, corpus_chain
from pipeline.config import PipelineConfig, load_config
from pipeline.core.config import ConfigError
from pipeline.core.manifest import Manifest
from pipeline.core.storage import DatasetRef, StageFailure
from pipeline.evaluate.harness import TASK
from pipeline.stages import stage as registered_stage

log = logging.getLogger(__name__)
REFERENCE = "reference"  # the eval set the user names
BASE_VALIDATION = "base_validation"  # the base variant's validation split
CONTINUATION = "continuation.jsonl"  # the continuation task's items, made from the reference
LOCAL_TASKS = "tasks"  # beside it: the spec's local lm-eval tasks, one <task>.jsonl of items each
EVALUATION_VERSION = 3  # kept evaluations of another version are scored again (3: per-document losses)
TOKENIZER_STAGE_INPUT = "documents"


@dataclass
class Progress:
    """What a call did, for the caller (and the tests' counted runs)."""

    stages_run: list[tuple[str, str]] = field(default_factory=list)  # (variant, stage)
    trainings_run: list[str] = field(default_factory=list)
    trainings_skipped: list[str] = field(default_factory=list)


def stage_runner(name: str) -> Callable[[PipelineConfig, list[DatasetRef], DatasetRef], Manifest]:
    """A corpus stage's ``run(config, inputs, output)``, as the registry names it."""
    run: Callable[[PipelineConfig, list[DatasetRef], DatasetRef], Manifest]
    run = registered_stage(name).run_function()
    return run


def say(message: str) -> None:
    print(f"ablate: {message}", file=sys.stderr, flush=True)


def ensure_tokenizer(plan: Plan, config: PipelineConfig) -> None:
    """The one tokenizer of every variant: the named stored one, or one trained once on the base's unfiltered
    documents (every source part's, where the source holds documents, else the base variant's first stage
    outputs) and stored in the project's corpus."""
    from pipeline.tokenization.store import parse_reference, resolve_reference, stored_names
    from pipeline.tokenization.tokenizer_cli import train

    corpus, name = parse_reference(plan.tokenizer, plan.corpus)
    if plan.spec.tokenizer is not None or name in stored_names(plan.root, corpus):
        stored = resolve_reference(config, plan.tokenizer)
        say(f"tokenizer {stored.corpus}/{stored.name} (digest {stored.digest})")
        return
    sources = [part.ref for part in plan.parts]
    if not all((ref.path / TOKENIZER_STAGE_INPUT).is_dir() for ref in sources):
        sources = plan.stage_outputs(plan.spec.base, corpus_chain()[0])
    shown = ", ".join(f"{ref.corpus}/{ref.stage}/{ref.snapshot}" for ref in sources)
    say(f"training the shared tokenizer {plan.tokenizer} on {shown}")
    train(config, name, [f"{ref.corpus}:{ref.snapshot}" for ref in sources], sources[0].stage)


def run_corpus_stages(
    plan: Plan, config_path: str | Path | None, overrides: list[str], progress: Progress
) -> None:
    base = base_config(plan.spec, config_path, overrides, plan.tokenizer)
    tokenizer_ready = False
    by_variant = {variant.name: variant for variant in plan.spec.variants}
    for step in plan.steps:
        if step.stage == "tokenize" and not tokenizer_ready:
            ensure_tokenizer(plan, base)  # after the base's first stages: it may train on their output
            tokenizer_ready = True
        if step.output.is_complete():
            continue  # reused: another variant (or an earlier run) made this very output
        config = variant_config(
            plan.spec, by_variant[step.variant], config_path, overrides, plan.tokenizer, step.output.corpus
        )
        say(f"{step.variant}: {step.stage} -> {step.output.corpus}/{step.output.snapshot}")
        stage_runner(step.stage)(config, [step.input], step.output)
        progress.stages_run.append((step.variant, step.stage))


def final_documents(plan: Plan) -> dict[str, list[DatasetRef]]:
    """Per variant, the documents its tokenize stage read (one output per source part): what it trains on."""
    return {variant.name: plan.stage_inputs(variant.name, "tokenize") for variant in plan.spec.variants}


def tokenizer_file(plan: Plan) -> Path:
    """The shared tokenizer, as the base's first tokenize output holds it (every output holds the same)."""
    return plan.final_tokens(plan.spec.base)[0].path / "tokenizer.json"


def prepare(
    spec: AblationSpec, config_path: str | Path | None, overrides: list[str], progress: Progress | None = None
) -> Plan:
    """Corpus stages, tokenizer and held-out reference: everything before the trainings. Refuses a reference
    that overlaps any variant's training documents, naming both, before any training starts."""
    progress = progress or Progress()
    plan = make_plan(spec, config_path, overrides)
    local_tasks = {name: local_task(spec, name) for name in spec.tasks}  # refused before any stage runs
    run_corpus_stages(plan, config_path, overrides, progress)
    digests = {
        f"{variant.name} {ref.corpus}/{ref.snapshot}": ref.manifest().files["tokenizer.json"].sha256
        for variant in spec.variants
        for ref in plan.final_tokens(variant.name)
    }
    if len(set(digests.values())) != 1:
        raise StageFailure(f"the variants were tokenized with different tokenizers: {digests}")
    texts = heldout.read_reference(spec.reference, spec.max_eval_documents)
    heldout.refuse_overlaps(spec.reference, heldout.find_overlaps(texts, final_documents(plan)))
    config = load_config(config_path, overrides)
    folder = work_folder(config, spec)
    base_tokens = plan.final_tokens(spec.base)[0]
    staging = folder / ".reference-staging"
    if staging.exists():
        import shutil

        shutil.rmtree(staging)
    heldout.write_reference_shards(
        texts, base_tokens.path / "tokenizer.json", base_tokens.manifest().extra["eos_token"], staging
    )
    if not heldout.write_continuation_task(texts, staging / CONTINUATION):
        log.warning(
            "the reference has fewer than %d documents long enough for the continuation task: no accuracy",
            heldout.CHOICES,
        )
    (staging / LOCAL_TASKS).mkdir()
    for name, items in local_tasks.items():
        (staging / LOCAL_TASKS / f"{name}.jsonl").write_text(
            "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items)
        )
    target = folder / REFERENCE
    if target.exists():
        import shutil

        shutil.rmtree(target)
    os.replace(staging, target)
    (folder / "plan.json").write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
    return plan


def local_task(spec: AblationSpec, name: str) -> list[dict]:
    """A task of the spec's ``tasks`` as items (``pipeline.evaluate.harness.local_task_items``), or a
    ConfigError naming it."""
    from pipeline.evaluate.harness import LocalTaskError, local_task_items

    try:
        items = local_task_items(name, spec.task_folder, spec.max_eval_documents)
    except LocalTaskError as exc:
        raise ConfigError(f"ablation {spec.name}: {exc}") from None
    if not items:
        raise ConfigError(f"ablation {spec.name}: task {name} has no item to score")
    say(f"task {name}: {len(items)} items")
    return items


def eval_tasks(plan: Plan, config: PipelineConfig) -> dict[str, list[dict]]:
    """The multiple-choice tasks every checkpoint is scored on: the continuation task made from the
    reference, and the spec's local lm-eval tasks (as prepare wrote them)."""
    reference = work_folder(config, plan.spec) / REFERENCE
    tasks = {TASK: heldout.read_task(reference / CONTINUATION)}
    for name in plan.spec.tasks:
        tasks[name] = heldout.read_task(reference / LOCAL_TASKS / f"{name}.jsonl")
    return tasks


def eval_streams(plan: Plan, config: PipelineConfig) -> dict[str, list[Path]]:
    """The held-out token streams every checkpoint is scored on: the reference, and the base variant's
    validation split (per mixture source, ``base_validation.<source>``, over the snapshots it selected)."""
    from pipeline.tokenization.job import DESCRIBED_SPLIT

    streams = {REFERENCE: [work_folder(config, plan.spec) / REFERENCE]}
    by_source: dict[str, list[Path]] = {}
    for part, tokens in zip(plan.parts, plan.final_tokens(plan.spec.base), strict=True):
        validation = tokens.path / DESCRIBED_SPLIT
        if any(validation.glob("*.idx")):
            name = f"{BASE_VALIDATION}.{part.source}" if plan.spec.source.mixture else BASE_VALIDATION
            by_source.setdefault(name, []).append(validation)
    return {**streams, **by_source}


def eval_documents(plan: Plan, config: PipelineConfig) -> dict[str, heldout.EvalDocuments]:
    return {
        name: heldout.eval_documents(folders, plan.spec.max_eval_documents, tokenizer_file(plan))
        for name, folders in eval_streams(plan, config).items()
    }


def evaluation_identity(plan: Plan, config: PipelineConfig) -> str:
    """What a kept evaluation was scored on: every file of the eval streams' folders (the reference's shards,
    continuation items and local tasks; the base's validation split, which ``base`` decides), the document
    limit, the task names and the evaluation's version. A kept evaluation with another identity is scored
    again, so one table never compares trainings scored on different sets."""
    from pipeline.core.manifest import sha256_file

    files = {}
    for name, folders in sorted(eval_streams(plan, config).items()):
        for folder in folders:
            for path in sorted(p for p in folder.rglob("*") if p.is_file()):
                files[f"{name}:{path.relative_to(folder)}"] = sha256_file(path)
    payload = {
        "version": EVALUATION_VERSION,
        "max_eval_documents": plan.spec.max_eval_documents,
        "tasks": sorted(eval_tasks(plan, config)),
        "files": files,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def training_config(
    plan: Plan, training: Training, config_path: str | Path | None, overrides: list[str]
) -> PipelineConfig:
    """The proxy (the spec's), the caller's overrides, then what the plan fixes for this training; with
    trainings side by side, each rank's share of the cores."""
    shared = (
        [f"train.threads_per_rank={threads_per_training(plan.spec.parallel)}"]
        if plan.spec.parallel > 1
        else []
    )
    return load_config(
        config_path, [*plan.spec.proxy, *overrides, *shared, *training_overrides(plan, training)]
    )


def threads_per_training(parallel: int) -> int:
    return max(1, len(os.sched_getaffinity(0)) // parallel)


def evaluation_path(config: PipelineConfig, plan: Plan, training: Training) -> Path:
    return work_folder(config, plan.spec) / "evaluations" / f"{training.run_id}.json"


def train_and_evaluate(
    plan: Plan,
    training: Training,
    config_path: str | Path | None,
    overrides: list[str],
    progress: Progress | None = None,
) -> dict[str, Any]:
    """One training (skipped when complete) and its evaluation at every kept checkpoint (kept once done)."""
    from pipeline.model.checkpoint import Checkpointer
    from pipeline.train.launcher.launch import train

    progress = progress or Progress()
    config = training_config(plan, training, config_path, overrides)
    output = train_output(plan, training)
    if output.is_complete():
        progress.trainings_skipped.append(training.key)
    else:
        position = plan.trainings.index(training) + 1
        say(
            f"training {position} of {len(plan.trainings)}: {training.variant} seed {training.seed} "
            f"({plan.tokens:,} tokens) as run {training.run_id}"
        )
        train(
            config,
            list(training.tokens),
            training.snapshot,
            on_line=lambda line: print(line, file=sys.stderr, flush=True),
        )
        progress.trainings_run.append(training.key)
    manifest = output.manifest()
    path = evaluation_path(config, plan, training)
    identity = evaluation_identity(plan, config)
    if path.is_file():
        kept = json.loads(path.read_text())
        if (kept.get("train_digest"), kept.get("evaluation")) == (manifest.digest, identity):
            return dict(kept)
        say(f"{training.key}: its kept evaluation was scored on other held-out sets; scoring it again")
    tasks = eval_tasks(plan, config)
    documents = eval_documents(plan, config)
    checkpoints = Checkpointer(output.path / "checkpoints")
    points = []
    for step in checkpoints.steps():
        losses, accuracy = heldout.checkpoint_scores(
            checkpoints.path_for(step), documents, tasks, tokenizer_file(plan), config.evaluate.batch_size
        )
        points.append(
            {"step": step, "tokens": step * plan.tokens_per_step, "losses": losses, "accuracy": accuracy}
        )
    train_tokens = sum(int(ref.manifest().counters["tokens"]["train"]) for ref in training.tokens)
    result = {
        "version": EVALUATION_VERSION,
        "evaluation": identity,
        "tasks": sorted(tasks),
        "documents": {name: docs.to_dict() for name, docs in documents.items()},
        "variant": training.variant,
        "seed": training.seed,
        "run_id": training.run_id,
        "train_path": str(output.path),
        "train_digest": manifest.digest,
        "mlflow_run_id": manifest.extra.get("mlflow_run_id"),
        "tokens_seen": int(manifest.counters["tokens_seen"]),
        "train_tokens_available": train_tokens,
        "epochs": int(manifest.counters["tokens_seen"]) / train_tokens if train_tokens else None,
        "points": points,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(temporary, path)
    return result


def run_ablation(
    spec: AblationSpec, config_path: str | Path | None, overrides: list[str], progress: Progress | None = None
) -> Manifest:
    """The whole ablation, ``spec.parallel`` trainings at a time; returns the published comparison's manifest."""
    from pipeline.ablate.compare import compare

    progress = progress or Progress()
    plan = prepare(spec, config_path, overrides, progress)
    if spec.parallel == 1:
        results = [train_and_evaluate(plan, t, config_path, overrides, progress) for t in plan.trainings]
    else:
        import torch

        # Each training is its own torchrun; the evaluations here share this process's threads likewise.
        torch.set_num_threads(threads_per_training(spec.parallel))
        with ThreadPoolExecutor(spec.parallel) as pool:
            results = list(
                pool.map(
                    lambda t: train_and_evaluate(plan, t, config_path, overrides, progress), plan.trainings
                )
            )
    return compare(plan, results, config_path, overrides)
