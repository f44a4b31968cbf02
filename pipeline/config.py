"""The whole pipeline's config tree: the shared sections (``pipeline.core.config``) plus every stage's own.

``PipelineConfig`` is assembled from the stage registry (``pipeline.stages``), so a new stage's section joins
the tree, the CLI's ``--set`` keys, the environment variables and the config hash with its registry entry.
``pretrain config`` prints the resolved tree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import Field, create_model

from pipeline.core.config import ConfigError, CoreConfig, load_tree
from pipeline.stages import config_sections

__all__ = ["ConfigError", "PipelineConfig", "load_config"]

PipelineConfig = create_model(
    "PipelineConfig",
    __base__=CoreConfig,
    __doc__="Every setting of the pipeline: the shared sections plus each registered stage's.",
    **{name: (section, Field(default_factory=section)) for name, section in config_sections().items()},
)


def load_config(
    path: str | Path | None = None,
    overrides: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> PipelineConfig:
    """Defaults < YAML file < ``PRETRAIN__SECTION__KEY`` environment < ``--set`` overrides, validated."""
    return load_tree(PipelineConfig, path, overrides, environ)
