"""Model hyper-parameters and named presets. Kept free of torch so config validation stays cheap."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 2048
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    intermediate_size: int = 352
    max_position_embeddings: int = 256
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-6
    dropout: float = 0.0
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be divisible by num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be divisible by num_key_value_heads")
        if (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError("head dimension must be even for RoPE")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def with_overrides(self, **overrides) -> GPTConfig:
        return replace(self, **overrides)


PRESETS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(),
    "base": GPTConfig(
        vocab_size=32_768,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=12,
        intermediate_size=2048,
        max_position_embeddings=2048,
    ),
}


def model_config(preset: str, **overrides) -> GPTConfig:
    try:
        base = PRESETS[preset]
    except KeyError:
        raise ValueError(f"unknown model preset {preset!r}; choose one of {sorted(PRESETS)}") from None
    return base.with_overrides(**overrides)
