"""Decoder-only Transformer. The config lives here; the torch modules are in ``pipeline.model.gpt``."""

from pipeline.model.config import PRESETS, GPTConfig, model_config

__all__ = ["PRESETS", "GPTConfig", "model_config"]
