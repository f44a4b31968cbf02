"""The whole pipeline's config tree: the shared sections (``pipeline.core.config``) plus every stage's own.

``PipelineConfig`` declares one typed field per section, so ``config.train`` is a ``TrainConfig`` to the
type checker and a misspelt key fails ``make typecheck``. Each section class lives in its package's
``config.py`` (a leaf module: pydantic and ``pipeline.core`` only), the one kind of stage module this file
imports. The stage registry (``pipeline.stages``) names the same sections by where they live, and
tests/test_stages.py checks that the two agree. Checks that span sections belong to the section that owns
them (``Section.tree_problem``). ``pretrain config`` prints the resolved tree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, Self, get_args, get_origin

from pydantic import Field
from pydantic.fields import FieldInfo

from pipeline.classify.config import ClassifierTrainingConfig, ClassifyConfig
from pipeline.clean.config import CleanConfig
from pipeline.core.config import ConfigError, CoreConfig, load_tree, unknown_key_message
from pipeline.core.storage import validate_run_id
from pipeline.crawl.config import CrawlConfig
from pipeline.data.config import DataConfig
from pipeline.decontaminate.config import DecontaminateConfig
from pipeline.dedup.config import DedupConfig
from pipeline.evaluate.config import EvaluateConfig
from pipeline.export.config import ExportConfig
from pipeline.ingest.config import IngestConfig
from pipeline.model.config import ModelSection
from pipeline.quality.config import QualityConfig
from pipeline.stages import BY_NAME
from pipeline.tokenization.config import TokenizeConfig, TokenizerConfig
from pipeline.tracking.config import TrackingConfig
from pipeline.train.config import DistributedConfig, TrainConfig

__all__ = [
    "ConfigError",
    "PipelineConfig",
    "config_key",
    "freeze_config",
    "key_choices",
    "load_config",
    "read_frozen_config",
]


class PipelineConfig(CoreConfig):
    """Every setting of the pipeline: the shared sections plus each registered stage's, in pipeline order."""

    # Next to the stage's section each read as the same thing: `classifier` (how train_classifier trains one)
    # beside `classify`, and `tokenizer` (the BPE: its training, normalisation and special tokens) beside
    # `tokenize`.
    renamed_keys: ClassVar[dict[str, str]] = {"classifier": "classifier_training", "tokenizer": "bpe"}

    crawl: CrawlConfig = Field(default_factory=CrawlConfig)
    ingest: IngestConfig = Field(default_factory=IngestConfig)
    clean: CleanConfig = Field(default_factory=CleanConfig)
    dedup: DedupConfig = Field(default_factory=DedupConfig)
    classifier_training: ClassifierTrainingConfig = Field(default_factory=ClassifierTrainingConfig)
    classify: ClassifyConfig = Field(default_factory=ClassifyConfig)
    decontaminate: DecontaminateConfig = Field(default_factory=DecontaminateConfig)
    quality: QualityConfig = Field(default_factory=QualityConfig)
    bpe: TokenizerConfig = Field(default_factory=TokenizerConfig)
    tokenize: TokenizeConfig = Field(default_factory=TokenizeConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelSection = Field(default_factory=ModelSection)
    train: TrainConfig = Field(default_factory=TrainConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    def keeps_runs(self, stage: str) -> bool:
        entry = BY_NAME.get(stage)
        return entry is not None and entry.per_run

    def named_run(self, stage: str) -> str | None:
        """Training runs name the outputs of every per-run stage (train and its report): ``train.run_id``."""
        return self.train.run_id if self.keeps_runs(stage) else None

    def with_run(self, run_id: str | None) -> Self:
        """This config naming the training run ``run_id`` (``train.run_id``); itself when that is None."""
        if run_id is None or run_id == self.train.run_id:
            return self
        validate_run_id(run_id)
        return self.model_copy(update={"train": self.train.model_copy(update={"run_id": run_id})})


def load_config(
    path: str | Path | None = None,
    overrides: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
    values: Mapping[str, Any] | None = None,
) -> PipelineConfig:
    """Defaults < YAML file < ``PRETRAIN__SECTION__KEY`` environment < ``--set`` overrides < typed ``values``
    (dotted key -> value, the Airflow form's), validated."""
    return load_tree(PipelineConfig, path, overrides, environ, values)


def freeze_config(config: PipelineConfig, path: str | Path) -> Path:
    """Write a run's resolved config to ``path``: the one file its later processes read as it is
    (``read_frozen_config``)."""
    path = Path(path)
    path.write_text(config.to_yaml())
    return path


def read_frozen_config(path: str | Path) -> PipelineConfig:
    """The config ``freeze_config`` wrote, as it is: no environment variables or overrides on top (they were
    applied once, when it was resolved)."""
    return load_config(path, (), environ={})


def config_key(dotted: str) -> FieldInfo:
    """The declaration of one config key (``train.steps``): its type, default, bounds and description."""
    model: Any = PipelineConfig
    field = None
    for part in dotted.split("."):
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            raise ConfigError(f"{dotted}: {unknown_key_message(part, fields or {})}")
        field = fields[part]
        model = field.annotation
    assert field is not None
    return field


def key_choices(dotted: str) -> tuple[Any, ...] | None:
    """The values a config key accepts when they are a fixed set: a ``Literal``'s, or an ``enum`` its field
    declares (``model.preset``: the presets); None for an open type."""
    field = config_key(dotted)
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if isinstance(enum := extra.get("enum"), list):
        return tuple(enum)
    literals = [arg for arg in (field.annotation, *get_args(field.annotation)) if get_origin(arg) is Literal]
    return tuple(value for literal in literals for value in get_args(literal)) if literals else None
