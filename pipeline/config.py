"""The whole pipeline's config tree: the shared sections (``pipeline.core.config``) plus every stage's own.

``PipelineConfig`` is assembled from the stage registry (``pipeline.stages``, which names each section by
where its class lives; here they are imported), so a new stage's section joins
the tree, the CLI's ``--set`` keys, the environment variables and the config hash with its registry entry.
``pretrain config`` prints the resolved tree.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self, get_args, get_origin

from pydantic import Field, create_model, model_validator
from pydantic.fields import FieldInfo

from pipeline.core.config import ConfigError, CoreConfig, Section, load_tree, unknown_key_message
from pipeline.core.storage import validate_run_id
from pipeline.model.config import model_config
from pipeline.stages import BY_NAME, config_sections
from pipeline.train.config import pipeline_layout_problem

__all__ = [
    "ConfigError",
    "PipelineConfig",
    "config_key",
    "freeze_config",
    "key_choices",
    "load_config",
    "read_frozen_config",
]


class _PipelineTree(CoreConfig):
    """What the whole tree knows beyond the shared sections: which stages keep one output per run."""

    if TYPE_CHECKING:
        # The stage sections join the tree at import time, from the registry (below): to a type checker each
        # is simply an attribute of the tree.
        def __getattr__(self, name: str) -> Any: ...

    @model_validator(mode="after")
    def _pipeline_fits_model(self):
        """Checks across sections, before any work: the pipeline split against the model and the batching."""
        layers = model_config(self.model.preset, **self.model.overrides).num_hidden_layers
        problem = pipeline_layout_problem(self.train, layers, self.data.batching)
        if problem:
            raise ValueError(problem)
        return self

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


def section_class(location: str) -> type[Section]:
    """The section class a registry entry names (``"pipeline.train.config:TrainConfig"``)."""
    module, _, name = location.partition(":")
    return getattr(importlib.import_module(module), name)


SECTIONS: dict[str, type[Section]] = {name: section_class(where) for name, where in config_sections().items()}
if TYPE_CHECKING:
    PipelineConfig = _PipelineTree
else:
    PipelineConfig = create_model(
        "PipelineConfig",
        __base__=_PipelineTree,
        __doc__="Every setting of the pipeline: the shared sections plus each registered stage's.",
        **{name: (section, Field(default_factory=section)) for name, section in SECTIONS.items()},
    )


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
