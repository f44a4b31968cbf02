"""Model hyper-parameters, named presets, and the parameter/FLOP accounting that follows from them.

Kept free of torch so config validation stays cheap: the `model` config section (``ModelSection``) lives
here too and builds one to check ``model.overrides``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from pydantic import Field, field_validator, model_validator

from pipeline.core.config import Section

ATTENTION_PATTERNS = ("causal", "sliding_window", "blockwise")
ATTENTION_KERNELS = ("auto", "sdpa")
NORMS = ("rmsnorm", "layernorm")
ACTIVATIONS = ("swiglu", "gelu")
ROUTER_SCORES = ("softmax", "sigmoid")
FUSED_CROSS_ENTROPY = ("off", "chunked", "liger", "cce", "auto")
# Upper bounds of the sizes, far past any model trained today: a typo such as hidden_size 10**9 or 10**9
# layers otherwise passes every check and fails inside torchrun, allocating, after three restarts.
MAX_SIZE = {
    "vocab_size": 1 << 24,
    "hidden_size": 1 << 17,
    "num_hidden_layers": 1 << 12,
    "num_attention_heads": 1 << 12,
    "num_key_value_heads": 1 << 12,
    "intermediate_size": 1 << 20,
    "max_position_embeddings": 1 << 24,
    "num_experts": 1 << 14,
}
MAX_PARAMETERS = 10**13  # ten trillion: the whole model, all experts counted


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 2048
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4  # fewer than num_attention_heads gives grouped-query attention
    intermediate_size: int = 352
    max_position_embeddings: int = 256
    rope_theta: float = 10_000.0
    norm: str = "rmsnorm"
    rms_norm_eps: float = 1e-6
    activation: str = "swiglu"
    dropout: float = 0.0
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02
    activation_checkpointing: bool = False  # recompute each block in backward instead of storing activations
    # The training loss from the final hidden states and the head weight without the (batch, seq, vocab)
    # logits (pipeline.model.linear_cross_entropy); GPTOutput.logits is then None when targets are given.
    # "off": lm_head, then cross-entropy over the full logits (the reference). "chunked": PyTorch, in chunks
    # of fused_cross_entropy_chunk_size rows. "liger", "cce": Liger Kernel's / Apple's Triton kernels (CUDA,
    # the gpu extra). "auto": cce, else liger, where installed and on CUDA; chunked otherwise.
    fused_cross_entropy: str = "off"
    fused_cross_entropy_chunk_size: int = 2048

    # Attention pattern, always causal. "sliding_window": query i sees keys i-w+1..i.
    # "blockwise": positions fall into blocks of attention_block_size; a query sees its own block and the
    # attention_local_blocks blocks before it. attention_global_tokens: the first g tokens of each document
    # stay visible to every later query of that document (both local patterns).
    attention_pattern: str = "causal"
    attention_window: int | None = None
    attention_block_size: int = 64
    attention_local_blocks: int = 1
    attention_global_tokens: int = 0
    # "auto": masked attention (documents, local patterns) runs as FlexAttention on CUDA, which skips the
    # blocks the mask empties; SDPA with a dense boolean mask elsewhere. "sdpa": always the dense mask.
    attention_kernel: str = "auto"

    # Mixture of experts. num_experts = 0 keeps every MLP dense. MoE layers are moe_layers when given,
    # else every moe_every_n_layers-th layer counting from 1 (2 -> layers 1, 3, 5, ... zero-based).
    num_experts: int = 0
    moe_top_k: int = 2
    moe_every_n_layers: int = 1
    moe_layers: tuple[int, ...] | None = None
    moe_intermediate_size: int | None = None  # None: intermediate_size
    moe_shared_expert: bool = False  # one dense expert every token goes through, added to the routed output
    moe_capacity_factor: float | None = 1.25  # None: unlimited (no token is ever dropped)
    moe_eval_capacity_factor: float | None = None  # used in eval mode (and generate); None: unlimited
    router_score: str = "softmax"
    router_aux_loss_coef: float = 0.01  # Switch/GShard load balancing, summed over MoE layers
    router_z_loss_coef: float = 0.001  # ST-MoE router z-loss, summed over MoE layers
    moe_fused_routing: bool = True  # use cuda_ext.moe_routing when it is built, else the PyTorch reference

    def __post_init__(self) -> None:
        if self.moe_layers is not None and not isinstance(self.moe_layers, tuple):
            # YAML and JSON give lists; keep the dataclass hashable and frozen.
            object.__setattr__(self, "moe_layers", tuple(self.moe_layers))
        self._check_types()
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
            _require(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("num_key_value_heads", "intermediate_size", "max_position_embeddings"):
            _require(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        for name, most in MAX_SIZE.items():
            _require(getattr(self, name) <= most, f"{name} must be <= {most}, got {getattr(self, name)}")
        _require(
            self.hidden_size % self.num_attention_heads == 0,
            f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
            f"({self.num_attention_heads})",
        )
        _require(
            self.num_attention_heads % self.num_key_value_heads == 0,
            f"num_attention_heads ({self.num_attention_heads}) must be divisible by num_key_value_heads "
            f"({self.num_key_value_heads})",
        )
        _require(self.head_dim % 2 == 0, f"head dimension must be even for RoPE, got {self.head_dim}")
        _require(self.rope_theta > 0, f"rope_theta must be > 0, got {self.rope_theta}")
        _require(self.rms_norm_eps > 0, f"rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        _require(0.0 <= self.dropout < 1.0, f"dropout must be in [0, 1), got {self.dropout}")
        _require(self.norm in NORMS, f"norm must be one of {NORMS}, got {self.norm!r}")
        _require(
            self.activation in ACTIVATIONS,
            f"activation must be one of {ACTIVATIONS}, got {self.activation!r}",
        )
        _require(
            self.fused_cross_entropy in FUSED_CROSS_ENTROPY,
            f"fused_cross_entropy must be one of {FUSED_CROSS_ENTROPY}, got {self.fused_cross_entropy!r}",
        )
        _require(
            self.fused_cross_entropy_chunk_size >= 1,
            f"fused_cross_entropy_chunk_size must be >= 1, got {self.fused_cross_entropy_chunk_size}",
        )
        self._check_attention()
        self._check_moe()
        parameters = self.num_parameters()
        _require(
            parameters <= MAX_PARAMETERS,
            f"{parameters:.3g} parameters is more than {MAX_PARAMETERS:.0e}; check the sizes",
        )

    def _check_types(self) -> None:
        """Each field holds its declared type (YAML, JSON and --set give whatever was written), every float
        finite: a NaN passes every comparison below as False, and some as no error at all."""
        for item in fields(self):
            value = getattr(self, item.name)
            expected = _FIELD_TYPES[item.name]
            if value is None and "None" in item.type:
                continue
            if item.name == "moe_layers":
                ok = all(isinstance(i, int) and not isinstance(i, bool) for i in value)
            elif expected is float:
                ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            elif expected is int:
                ok = isinstance(value, int) and not isinstance(value, bool)
            else:
                ok = isinstance(value, expected)
            _require(ok, f"{item.name} must be {item.type.replace(' | None', ' or null')}, got {value!r}")

    def _check_attention(self) -> None:
        pattern = self.attention_pattern
        _require(
            pattern in ATTENTION_PATTERNS,
            f"attention_pattern must be one of {ATTENTION_PATTERNS}, got {pattern!r}",
        )
        if pattern == "sliding_window":
            _require(
                self.attention_window is not None and self.attention_window >= 1,
                f"attention_pattern 'sliding_window' needs attention_window >= 1, got {self.attention_window}",
            )
        else:
            _require(
                self.attention_window is None,
                f"attention_window is set but attention_pattern is {pattern!r}; use 'sliding_window'",
            )
        _require(
            self.attention_kernel in ATTENTION_KERNELS,
            f"attention_kernel must be one of {ATTENTION_KERNELS}, got {self.attention_kernel!r}",
        )
        _require(
            self.attention_block_size >= 1,
            f"attention_block_size must be >= 1, got {self.attention_block_size}",
        )
        _require(
            self.attention_local_blocks >= 0,
            f"attention_local_blocks must be >= 0, got {self.attention_local_blocks}",
        )
        _require(
            self.attention_global_tokens >= 0,
            f"attention_global_tokens must be >= 0, got {self.attention_global_tokens}",
        )
        _require(
            self.attention_global_tokens == 0 or pattern != "causal",
            "attention_global_tokens needs a local attention_pattern ('sliding_window' or 'blockwise'); "
            "under full causal attention every earlier token is already visible",
        )

    def _check_moe(self) -> None:
        if self.num_experts == 0:
            _require(self.moe_layers is None, "moe_layers is set but num_experts is 0")
            return
        _require(self.num_experts >= 1, f"num_experts must be >= 0, got {self.num_experts}")
        _require(
            1 <= self.moe_top_k <= self.num_experts,
            f"moe_top_k must be in [1, num_experts={self.num_experts}], got {self.moe_top_k}",
        )
        _require(
            self.moe_every_n_layers >= 1, f"moe_every_n_layers must be >= 1, got {self.moe_every_n_layers}"
        )
        if self.moe_layers is not None:
            bad = [i for i in self.moe_layers if not 0 <= i < self.num_hidden_layers]
            _require(not bad, f"moe_layers {bad} out of range [0, {self.num_hidden_layers})")
            _require(
                len(set(self.moe_layers)) == len(self.moe_layers), f"moe_layers repeats: {self.moe_layers}"
            )
        _require(
            bool(self.moe_layer_indices),
            f"no MoE layer: moe_every_n_layers={self.moe_every_n_layers} exceeds "
            f"num_hidden_layers={self.num_hidden_layers}",
        )
        _require(
            self.moe_intermediate_size is None or self.moe_intermediate_size >= 1,
            f"moe_intermediate_size must be >= 1, got {self.moe_intermediate_size}",
        )
        for name in ("moe_capacity_factor", "moe_eval_capacity_factor"):
            value = getattr(self, name)
            _require(value is None or value > 0, f"{name} must be > 0 or None (unlimited), got {value}")
        _require(
            self.router_score in ROUTER_SCORES,
            f"router_score must be one of {ROUTER_SCORES}, got {self.router_score!r}",
        )
        for name in ("router_aux_loss_coef", "router_z_loss_coef"):
            _require(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def moe_layer_indices(self) -> tuple[int, ...]:
        """Zero-based indices of the layers whose MLP is a mixture of experts."""
        if self.num_experts == 0:
            return ()
        if self.moe_layers is not None:
            return tuple(sorted(self.moe_layers))
        n = self.moe_every_n_layers
        return tuple(i for i in range(self.num_hidden_layers) if (i + 1) % n == 0)

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    def with_overrides(self, **overrides) -> GPTConfig:
        unknown = sorted(set(overrides) - {f.name for f in fields(self)})
        if unknown:
            raise ValueError(f"unknown GPTConfig field(s) {unknown}")
        return replace(self, **overrides)

    # Accounting. Every count below is derived from the shapes the modules in gpt.py create; the tests
    # compare them with the real parameters and with a FLOP counter.

    def mlp_parameters(self, intermediate_size: int) -> int:
        matrices = 3 if self.activation == "swiglu" else 2
        return matrices * self.hidden_size * intermediate_size

    def attention_parameters(self) -> int:
        q_and_o = 2 * self.hidden_size * self.num_attention_heads * self.head_dim
        return q_and_o + 2 * self.hidden_size * self.num_key_value_heads * self.head_dim

    def _parameters(self, active: bool, matmul_only: bool) -> int:
        h = self.hidden_size
        norm = 0 if matmul_only else h  # one weight vector per norm (LayerNorm is built without bias)
        expert = self.mlp_parameters(self.expert_intermediate_size)
        total = 0
        for layer in range(self.num_hidden_layers):
            total += 2 * norm + self.attention_parameters()
            if layer in self.moe_layer_indices:
                used_experts = self.moe_top_k if active else self.num_experts
                total += h * self.num_experts + used_experts * expert
                total += expert if self.moe_shared_expert else 0
            else:
                total += self.mlp_parameters(self.intermediate_size)
        total += norm
        embeddings = self.vocab_size * h
        if matmul_only:
            return total + embeddings  # the lm_head matmul; the embedding lookup costs no FLOPs
        return total + embeddings * (1 if self.tie_word_embeddings else 2)

    def num_parameters(self) -> int:
        """All parameters, counting a tied embedding/lm_head matrix once."""
        return self._parameters(active=False, matmul_only=False)

    def num_active_parameters(self) -> int:
        """Parameters one token uses: every MoE layer counts only its top-k experts (and the shared one)."""
        return self._parameters(active=True, matmul_only=False)

    def mean_attended_keys(self, seq_len: int) -> float:
        """Keys a query attends to, averaged over the positions of one sequence (no document boundaries)."""
        total = 0
        for i in range(seq_len):
            if self.attention_pattern == "sliding_window" and self.attention_window is not None:
                local_start = max(0, i - self.attention_window + 1)
            elif self.attention_pattern == "blockwise":
                block = i // self.attention_block_size
                local_start = max(0, block - self.attention_local_blocks) * self.attention_block_size
            else:
                local_start = 0
            total += i + 1 - local_start + min(self.attention_global_tokens, local_start)
        return total / seq_len

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs (forward + backward) per token, for MFU.

        6 x (active matmul parameters, including the lm_head) + 12 x layers x (heads x head_dim) x the mean
        number of keys a query attends to under this attention pattern. Norms, softmax and the routing
        permutation are left out; document boundaries are not known here and are not subtracted.
        """
        seq_len = seq_len or self.max_position_embeddings
        matmul = self._parameters(active=True, matmul_only=True)
        attention = (
            self.num_hidden_layers
            * self.num_attention_heads
            * self.head_dim
            * self.mean_attended_keys(seq_len)
        )
        return 6 * matmul + 12 * attention

    def layer_flops_per_token(self, layer: int, seq_len: int | None = None) -> float:
        """Training FLOPs per token of block ``layer``: its share of ``flops_per_token`` (attention, MLP or
        the top-k experts with the router). What a pipeline split balances."""
        seq_len = seq_len or self.max_position_embeddings
        matmul = self.attention_parameters()
        if layer in self.moe_layer_indices:
            expert = self.mlp_parameters(self.expert_intermediate_size)
            matmul += self.hidden_size * self.num_experts + self.moe_top_k * expert
            matmul += expert if self.moe_shared_expert else 0
        else:
            matmul += self.mlp_parameters(self.intermediate_size)
        attention = self.num_attention_heads * self.head_dim * self.mean_attended_keys(seq_len)
        return 6 * matmul + 12 * attention

    def head_flops_per_token(self) -> float:
        """Training FLOPs per token of the lm_head (the rest of ``flops_per_token``; the lookup costs none)."""
        return 6 * self.vocab_size * self.hidden_size


# The plain type of each field (annotations are strings here: ``from __future__ import annotations``).
_FIELD_TYPES = {
    item.name: {"int": int, "float": float, "str": str, "bool": bool}.get(
        item.type.replace(" | None", ""), tuple
    )
    for item in fields(GPTConfig)
}


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


_BASE = GPTConfig(
    vocab_size=32_768,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=12,
    intermediate_size=2048,
    max_position_embeddings=2048,
)
_MOE: dict[str, Any] = {
    "num_experts": 8,
    "moe_top_k": 2,
    "moe_every_n_layers": 2,
    "moe_capacity_factor": 1.25,
}

PRESETS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(),
    "tiny-moe": GPTConfig(num_experts=4, moe_top_k=2, moe_every_n_layers=1, moe_intermediate_size=176),
    "base": _BASE,
    "base-moe": replace(_BASE, **_MOE),
}


def model_config(preset: str, **overrides) -> GPTConfig:
    try:
        base = PRESETS[preset]
    except KeyError:
        raise ValueError(f"unknown model preset {preset!r}; choose one of {sorted(PRESETS)}") from None
    return base.with_overrides(**overrides)


class ModelSection(Section):
    """The `model` config section: a preset name plus field overrides, checked by building the GPTConfig."""

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
            self.gpt()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"model.overrides do not give a valid {self.preset!r} model: {exc}") from None
        return self

    def gpt(self) -> GPTConfig:
        """The model this section describes (before the trainer sets the tokenizer's vocab_size)."""
        return model_config(self.preset, **self.overrides)
