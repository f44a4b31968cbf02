"""What an ablation compares: a source, named variants (config overrides for the corpus stages), seeds, a token
budget and a fixed held-out reference; read from a YAML file and/or command-line flags, checked before any work.

    name: recipe
    source: {snapshot: 2026-11-29, stage: ingest}   # the corpus stages' input: a snapshot, or a mixture:
    # source: {stage: ingest, mixture: [{corpus: web, snapshots: last:2, weight: 3}, {corpus: books, weight: 1}]}
    base: none
    variants:
      none: preset                                  # a preset's overrides (PRESETS below)
      rules: preset
      rules+dedup: {}                               # the config as it is
      strict: [clean.recipe=fineweb_strict]         # KEY=VALUE overrides, like --set
    seeds: [0, 1, 2]                                # at least 2; the verdict's test has S - 1 degrees of freedom
    proxy: [train.lr=1e-3, ...]                     # model/train overrides of every training (default PROXY)
    parallel: 2                                     # trainings side by side on this machine
    control: true                                   # an A/A control: the base again, another data order
    tokens: 200000
    eval_points: 4
    reference: reference.jsonl                      # {"text": ...} per line, or .txt documents split by blank lines
    tokenizer: null                                 # null: train one on the base source, stored for all variants
    tasks: [my_questions]                           # lm-eval multiple-choice tasks on this machine (scored too)
    task_folder: tasks/                             # task YAMLs of your own, for `tasks`
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from pipeline.core.config import ConfigError
from pipeline.core.storage import validate_snapshot
from pipeline.data.config import DataConfig, MixtureSource
from pipeline.evaluate.harness import TASK
from pipeline.stages import CORPUS_SOURCES, downstream, group, stage

VARIANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,39}$")
ABLATION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,59}$")
# The proxy every training uses unless the spec says otherwise (``proxy:``), chosen by the sweep in
# benchmarks/ablate_sweep.py (benchmarks/RESULTS.md): untied embeddings and a low, fully decayed learning rate
# gave the largest paired t per CPU-second of the candidates on 2 cores (a higher rate turned the sign of
# the recipe effect: junk helped the proxy, not the model it stands for).
PROXY = (
    "model.preset=tiny",
    "model.overrides={tie_word_embeddings: false}",
    "train.nproc_per_node=1",
    "train.batch_size=8",
    "train.seq_len=64",
    "train.lr=1e-3",
    "train.warmup_steps=20",
    "train.min_lr_ratio=0",
)
PROXY_SECTIONS = ("model", "train")
PLAN_KEYS = (
    "train.steps",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.run_id",
    "train.resume",
)
MIN_SEEDS = 2  # the paired test (pipeline.ablate.stats) needs a spread over seeds
DEFAULT_SEEDS = (0, 1, 2)
CONTROL_SUFFIX = ".aa"  # the A/A control's arm is named <base>.aa
# One tokenizer for every variant: a variant that changed it would compare tokenizers, not data.
FIXED_KEYS = ("bpe", "tokenize.tokenizer")

# Every Gopher, C4 and FineWeb rule off: what a crawl gives before any quality filtering (language id and the
# minimum length stay, as in every variant).
_RULES_OFF = [
    "clean.gopher_repetition={"
    + ", ".join(
        f"{key}: null"
        for key in (
            "max_dup_para_frac",
            "max_dup_para_char_frac",
            "max_dup_line_frac",
            "max_dup_line_char_frac",
            "max_top_2_gram_char_frac",
            "max_top_3_gram_char_frac",
            "max_top_4_gram_char_frac",
            "max_dup_5_gram_char_frac",
            "max_dup_6_gram_char_frac",
            "max_dup_7_gram_char_frac",
            "max_dup_8_gram_char_frac",
            "max_dup_9_gram_char_frac",
            "max_dup_10_gram_char_frac",
        )
    )
    + "}",
    "clean.gopher_quality={min_doc_words: null, max_doc_words: null, min_avg_word_length: null, "
    "max_avg_word_length: null, max_symbol_word_ratio: null, max_bullet_lines_ratio: null, "
    "max_ellipsis_lines_ratio: null, min_alpha_words_ratio: null, min_stop_words: null}",
    "clean.c4={min_num_sentences: null, min_words_per_line: null, max_word_length: null, "
    "filter_no_terminal_punct: false, filter_lorem_ipsum: false, filter_javascript: false, "
    "filter_curly_bracket: false, filter_policy: false}",
    "clean.fineweb={min_line_punct_ratio: null, max_short_line_ratio: null, max_char_dup_ratio: null, "
    "max_newline_word_ratio: null}",
]
_DEDUP_OFF = ["dedup.url_dedup=false", "dedup.exact=false", "dedup.near=false"]
PRESETS: dict[str, list[str]] = {
    "none": [*_RULES_OFF, *_DEDUP_OFF],
    "rules": list(_DEDUP_OFF),
    "rules+dedup": [],
}


@dataclass(frozen=True)
class Source:
    """Where the variants start, in the stage whose output is clean's input (a crawl or an ingest): one
    ``snapshot`` of the project's corpus, or a ``mixture``: corpora, snapshot selections and weights as
    ``data.mixture`` declares them. Every snapshot a mixture selects goes through each variant's corpus
    stages, and each variant trains on the same mixture (the same weights) of its own outputs."""

    snapshot: str = ""
    stage: str = "ingest"
    mixture: tuple[MixtureSource, ...] = ()

    @property
    def kind(self) -> Literal["snapshot", "mixture"]:
        return "mixture" if self.mixture else "snapshot"

    def source_names(self) -> list[str]:
        """The mixture's sources as training names them (``data.mixture``'s rule)."""
        return DataConfig(mixture=list(self.mixture)).source_names() if self.mixture else []

    def describe(self) -> str:
        if not self.mixture:
            return f"{self.stage}/{self.snapshot}"
        total = sum(source.weight for source in self.mixture)
        parts = [
            (f"{name}=" if name != source.corpus else "")
            + f"{source.corpus}:{source.selection.describe()} ({source.weight / total:.2f})"
            for name, source in zip(self.source_names(), self.mixture, strict=True)
        ]
        return f"{self.stage} mixture " + ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        if not self.mixture:
            return {"kind": self.kind, "snapshot": self.snapshot, "stage": self.stage}
        return {
            "kind": self.kind,
            "stage": self.stage,
            "mixture": [source.model_dump(mode="json", exclude_none=True) for source in self.mixture],
        }


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: tuple[str, ...] = ()

    @property
    def slug(self) -> str:
        """The name as a run id allows it (``rules+dedup`` -> ``rules_dedup``)."""
        return self.name.replace("+", "_")


@dataclass(frozen=True)
class AblationSpec:
    name: str
    source: Source
    variants: tuple[Variant, ...]
    reference: Path
    tokens: int
    base: str = ""
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    control: bool = True  # an A/A control: the base again with each seed's weights, another data order
    proxy: tuple[str, ...] = PROXY  # model and training overrides of every training (before --set's)
    parallel: int = 1  # trainings run side by side on this machine (each with its share of the cores)
    eval_points: int = 4
    tokenizer: str | None = None
    max_eval_documents: int = 200
    tasks: tuple[str, ...] = ()  # lm-eval multiple-choice tasks present locally, scored at every checkpoint
    task_folder: Path | None = None  # lm-eval task YAMLs of the user's own (lm-eval's include_path)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not ABLATION_NAME.fullmatch(self.name):
            raise ConfigError(f"ablation name {self.name!r} must match {ABLATION_NAME.pattern}")
        if self.source.stage not in CORPUS_SOURCES:
            raise ConfigError(f"source.stage {self.source.stage!r}: one of {list(CORPUS_SOURCES)}")
        if not self.source.mixture:
            validate_snapshot(self.source.snapshot)
        if len(self.variants) < 2:
            raise ConfigError("an ablation compares at least two variants (a base and one change)")
        names = [variant.name for variant in self.variants]
        for name in names:
            if not VARIANT_NAME.fullmatch(name):
                raise ConfigError(f"variant name {name!r} must match {VARIANT_NAME.pattern}")
        slugs = [variant.slug for variant in self.variants]
        if len(set(slugs)) != len(slugs):
            raise ConfigError(f"variant names {names} are not distinct once '+' is written '_'")
        if not self.base:
            object.__setattr__(self, "base", names[0])
        if self.base not in names:
            raise ConfigError(f"base {self.base!r} is not one of the variants {names}")
        if len(self.seeds) < MIN_SEEDS or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(
                f"seeds {list(self.seeds)}: give {MIN_SEEDS} or more distinct seeds (3 by default): the "
                "verdict's test measures the noise from the spread over seeds, and one seed has none"
            )
        if any(seed < 0 for seed in self.seeds):
            raise ConfigError(f"seeds {list(self.seeds)}: seeds are whole numbers >= 0")
        for override in self.proxy:
            key = override.partition("=")[0].strip()
            if "=" not in override or key.split(".")[0] not in PROXY_SECTIONS:
                raise ConfigError(
                    f"proxy: {override!r} must be a model.* or train.* KEY=VALUE (the corpus is the variants')"
                )
            if key in PLAN_KEYS:
                raise ConfigError(f"proxy: {key} is set by the plan (tokens and eval_points decide it)")
        if not 1 <= self.parallel <= 256:
            raise ConfigError(f"parallel {self.parallel}: between 1 and 256 trainings side by side")
        if self.control and self.control_name in names:
            raise ConfigError(
                f"variant name {self.control_name!r} is the A/A control's; rename the variant or set control: false"
            )
        if self.tokens <= 0:
            raise ConfigError(f"tokens {self.tokens}: the token budget must be positive")
        if not 1 <= self.eval_points <= 100:
            raise ConfigError(f"eval_points {self.eval_points}: between 1 and 100")
        if len(set(self.tasks)) != len(self.tasks) or TASK in self.tasks:
            raise ConfigError(f"tasks {list(self.tasks)}: distinct lm-eval task names, other than {TASK}")
        allowed = variant_sections()
        for variant in self.variants:
            for override in variant.overrides:
                key = override.partition("=")[0].strip()
                if "=" not in override or not key:
                    raise ConfigError(
                        f"variant {variant.name}: {override!r} must look like section.key=value"
                    )
                if any(key == fixed or key.startswith(fixed + ".") for fixed in FIXED_KEYS):
                    raise ConfigError(
                        f"variant {variant.name}: {key} is the same for every variant (one tokenizer); "
                        "name it for the whole ablation with `tokenizer:` instead"
                    )
                if key.split(".")[0] not in allowed:
                    raise ConfigError(
                        f"variant {variant.name}: {key} is not a corpus stage's setting; a variant may set "
                        f"{sorted(allowed)} (training settings are the same for every variant)"
                    )

    @property
    def control_name(self) -> str:
        return f"{self.base}{CONTROL_SUFFIX}"

    @property
    def arms(self) -> list[str]:
        """What is trained and compared: the variants, and the A/A control when there is one."""
        return [variant.name for variant in self.variants] + ([self.control_name] if self.control else [])

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source.to_dict(),
            "base": self.base,
            "variants": {variant.name: list(variant.overrides) for variant in self.variants},
            "seeds": list(self.seeds),
            "control": self.control,
            "proxy": list(self.proxy),
            "parallel": self.parallel,
            "tokens": self.tokens,
            "eval_points": self.eval_points,
            "reference": str(self.reference),
            "tokenizer": self.tokenizer,
            "max_eval_documents": self.max_eval_documents,
            "tasks": list(self.tasks),
            "task_folder": str(self.task_folder) if self.task_folder else None,
        }


def corpus_chain() -> list[str]:
    """The corpus stages between a source and the token shards training reads, in order (from the registry)."""
    return [entry.name for entry in downstream(CORPUS_SOURCES[0]) if entry in group("corpus", reports=False)]


def variant_sections() -> set[str]:
    """Config sections a variant may override: those of the corpus stages it runs."""
    return {section for name in corpus_chain() for section in stage(name).sections}


def _variant(name: str, value: Any) -> Variant:
    if value == "preset" or (value is None and name in PRESETS):
        if name not in PRESETS:
            raise ConfigError(f"variant {name}: no preset of that name; the presets are {sorted(PRESETS)}")
        return Variant(name, tuple(PRESETS[name]))
    if value is None:
        return Variant(name)
    if isinstance(value, dict):
        return Variant(name, tuple(f"{key}={json.dumps(item)}" for key, item in value.items()))
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return Variant(name, tuple(value))
    raise ConfigError(
        f"variant {name}: give 'preset', a mapping of keys to values or a list of KEY=VALUE, not {value!r}"
    )


def _or_default(data: dict[str, Any], key: str, default: Any) -> Any:
    return default if data.get(key) is None else data[key]


def _overrides(value: Any, key: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"ablation spec: {key} is a list of KEY=VALUE overrides, not {value!r}")
    return tuple(value)


def _flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"ablation spec: {key} is true or false, not {value!r}")
    return value


def parse_source(source: Any) -> Source:
    """``NAME``, ``{snapshot: NAME, stage: ingest}`` or ``{mixture: [{corpus, snapshots, weight, name}...],
    stage: ingest}`` (``kind``, if given, says which)."""
    if isinstance(source, str):
        source = {"snapshot": source}
    if not isinstance(source, dict):
        raise ConfigError("ablation spec: source is a snapshot name or a mapping")
    kind = source.get("kind") or ("mixture" if "mixture" in source else "snapshot")
    unknown = sorted(set(source) - {"kind", "snapshot", "stage", "mixture"})
    if unknown:
        raise ConfigError(f"ablation spec: source: unknown keys {unknown}")
    stage = str(source.get("stage", "ingest"))
    if kind == "snapshot":
        if not source.get("snapshot") or "mixture" in source:
            raise ConfigError("ablation spec: source needs a snapshot ({snapshot: NAME, stage: ingest})")
        return Source(snapshot=str(source["snapshot"]), stage=stage)
    if kind != "mixture":
        raise ConfigError(f"ablation spec: source.kind {kind!r}: 'snapshot' or 'mixture'")
    declared = source.get("mixture")
    if "snapshot" in source or not isinstance(declared, list) or not declared:
        raise ConfigError(
            "ablation spec: a mixture source is {mixture: [{corpus: NAME, snapshots: ..., weight: W}, ...]}, "
            "as data.mixture declares one"
        )
    try:
        mixture = DataConfig(mixture=declared).mixture or []
    except ValidationError as exc:
        problems = "; ".join(
            ".".join(["source", *(str(part) for part in error["loc"])])
            + f": {error['msg'].removeprefix('Value error, ')}"
            for error in exc.errors()
        )
        raise ConfigError(f"ablation spec: {problems}") from None
    return Source(stage=stage, mixture=tuple(mixture))


# The keys of an ablation spec (its YAML file, the DAG's form).
SPEC_KEYS = (
    "name",
    "source",
    "base",
    "variants",
    "seeds",
    "control",
    "proxy",
    "parallel",
    "tokens",
    "eval_points",
    "reference",
    "tokenizer",
    "max_eval_documents",
    "tasks",
    "task_folder",
)


def parse_spec(data: dict[str, Any], base_folder: Path = Path()) -> AblationSpec:
    """An ``AblationSpec`` from a mapping as the YAML file holds it; ConfigError names what is wrong."""
    known = set(SPEC_KEYS)
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"ablation spec: unknown keys {unknown}; known: {sorted(known)}")
    for required in ("source", "variants", "reference", "tokens"):
        if data.get(required) in (None, "", {}, []):
            raise ConfigError(f"ablation spec: {required} is required")
    source = parse_source(data["source"])
    variants = data["variants"]
    if isinstance(variants, list):
        variants = {name: None for name in variants}
    if not isinstance(variants, dict):
        raise ConfigError("ablation spec: variants is a mapping of names to overrides (or a list of presets)")
    reference = Path(str(data["reference"]))
    tasks = data.get("tasks") or []
    if isinstance(tasks, str):
        tasks = [tasks]
    if not isinstance(tasks, list) or not all(isinstance(task, str) and task for task in tasks):
        raise ConfigError("ablation spec: tasks is a list of lm-eval task names")
    task_folder = Path(str(data["task_folder"])) if data.get("task_folder") else None
    if task_folder is not None and not task_folder.is_absolute():
        task_folder = base_folder / task_folder
    try:
        return AblationSpec(
            name=str(data.get("name") or "ablation"),
            source=source,
            variants=tuple(_variant(str(name), value) for name, value in variants.items()),
            reference=reference if reference.is_absolute() else base_folder / reference,
            tokens=int(data["tokens"]),
            base=str(data.get("base") or ""),
            seeds=tuple(int(seed) for seed in _or_default(data, "seeds", DEFAULT_SEEDS)),
            control=_flag(_or_default(data, "control", True), "control"),
            proxy=_overrides(_or_default(data, "proxy", PROXY), "proxy"),
            parallel=int(_or_default(data, "parallel", 1)),
            eval_points=int(data.get("eval_points", 4)),
            tokenizer=data.get("tokenizer"),
            max_eval_documents=int(data.get("max_eval_documents", 200)),
            tasks=tuple(tasks),
            task_folder=task_folder,
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"ablation spec: {exc}") from None
