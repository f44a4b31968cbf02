"""The `model` config section: a preset name plus field overrides, checked by building the GPTConfig."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from pipeline.core.config import Section
from pipeline.model.config import PRESETS, GPTConfig, model_config


class ModelSection(Section):
    preset: str = Field("tiny", json_schema_extra={"enum": list(sorted(PRESETS))})
    overrides: dict[str, Any] = Field(default_factory=dict, description="fields of pipeline.model.GPTConfig")

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, preset: str) -> str:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
        return preset

    @field_validator("overrides")
    @classmethod
    def _known_fields(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        known = set(GPTConfig.__dataclass_fields__)
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown model field(s) {unknown}; known: {sorted(known)}")
        return overrides

    @model_validator(mode="after")
    def _buildable(self) -> ModelSection:
        try:
            model_config(self.preset, **self.overrides)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"model.overrides do not give a valid {self.preset!r} model: {exc}") from None
        return self
