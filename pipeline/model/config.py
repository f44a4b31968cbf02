"""Model hyper-parameters, named presets, and the parameter/FLOP accounting that follows from them.

Kept free of torch so config validation stays cheap: the `model` config section (``ModelSection``) lives
here too and builds one to check ``model.overrides``.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Annotated, Any, Literal, get_args

from pydantic import ConfigDict, Field, StrictInt, ValidationError, field_validator, model_validator
from pydantic.dataclasses import dataclass

from pipeline.core.config import Section

# The field rules (types, bounds, choices) are declared once, on the fields below, and checked by pydantic
# whenever a GPTConfig is made: from a preset with overrides, from `model.overrides` in the config, or from
# the plain dict a checkpoint stores. __post_init__ holds only the rules that span fields.
AttentionPattern = Literal["causal", "sliding_window", "blockwise"]
AttentionKernel = Literal["auto", "sdpa"]
Norm = Literal["rmsnorm", "layernorm"]
Activation = Literal["swiglu", "gelu"]
RouterScore = Literal["softmax", "sigmoid"]
FusedCrossEntropy = Literal["off", "chunked", "liger", "cce", "auto"]
ATTENTION_PATTERNS: tuple[str, ...] = get_args(AttentionPattern)
ATTENTION_KERNELS: tuple[str, ...] = get_args(AttentionKernel)
NORMS: tuple[str, ...] = get_args(Norm)
ACTIVATIONS: tuple[str, ...] = get_args(Activation)
ROUTER_SCORES: tuple[str, ...] = get_args(RouterScore)
FUSED_CROSS_ENTROPY: tuple[str, ...] = get_args(FusedCrossEntropy)
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


def _size(most: int) -> Any:
    return Field(ge=1, le=most)


# Each value exactly its declared type (YAML, JSON and --set give whatever was written: no "128" -> 128, no
# True -> 1), every float finite (a NaN passes every comparison as False). JSON and YAML give moe_layers as a
# list, which becomes the tuple that keeps the config hashable.
_RULES = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
Count = Annotated[int, Field(ge=0)]
Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]


@dataclass(frozen=True, config=_RULES)
class GPTConfig:
    vocab_size: Annotated[int, _size(MAX_SIZE["vocab_size"])] = 2048
    hidden_size: Annotated[int, _size(MAX_SIZE["hidden_size"])] = 128
    num_hidden_layers: Annotated[int, _size(MAX_SIZE["num_hidden_layers"])] = 2
    num_attention_heads: Annotated[int, _size(MAX_SIZE["num_attention_heads"])] = 4
    # fewer than num_attention_heads gives grouped-query attention
    num_key_value_heads: Annotated[int, _size(MAX_SIZE["num_key_value_heads"])] = 4
    intermediate_size: Annotated[int, _size(MAX_SIZE["intermediate_size"])] = 352
    max_position_embeddings: Annotated[int, _size(MAX_SIZE["max_position_embeddings"])] = 256
    rope_theta: Positive = 10_000.0
    norm: Norm = "rmsnorm"
    rms_norm_eps: Positive = 1e-6
    activation: Activation = "swiglu"
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02
    activation_checkpointing: bool = False  # recompute each block in backward instead of storing activations
    # The training loss from the final hidden states and the head weight without the (batch, seq, vocab)
    # logits (pipeline.model.linear_cross_entropy); GPTOutput.logits is then None when targets are given.
    # "off": lm_head, then cross-entropy over the full logits (the reference). "chunked": PyTorch, in chunks
    # of fused_cross_entropy_chunk_size rows. "liger", "cce": Liger Kernel's / Apple's Triton kernels (CUDA,
    # the gpu extra). "auto": cce, else liger, where installed and on CUDA; chunked otherwise.
    fused_cross_entropy: FusedCrossEntropy = "off"
    fused_cross_entropy_chunk_size: Annotated[int, Field(ge=1)] = 2048

    # Attention pattern, always causal. "sliding_window": query i sees keys i-w+1..i.
    # "blockwise": positions fall into blocks of attention_block_size; a query sees its own block and the
    # attention_local_blocks blocks before it. attention_global_tokens: the first g tokens of each document
    # stay visible to every later query of that document (both local patterns).
    attention_pattern: AttentionPattern = "causal"
    attention_window: Annotated[int, Field(ge=1)] | None = None
    attention_block_size: Annotated[int, Field(ge=1)] = 64
    attention_local_blocks: Count = 1
    attention_global_tokens: Count = 0
    # "auto": masked attention (documents, local patterns) runs as FlexAttention on CUDA, which skips the
    # blocks the mask empties; SDPA with a dense boolean mask elsewhere. "sdpa": always the dense mask.
    attention_kernel: AttentionKernel = "auto"

    # Mixture of experts. num_experts = 0 keeps every MLP dense. MoE layers are moe_layers when given,
    # else every moe_every_n_layers-th layer counting from 1 (2 -> layers 1, 3, 5, ... zero-based).
    num_experts: Annotated[int, Field(ge=0, le=MAX_SIZE["num_experts"])] = 0
    moe_top_k: Annotated[int, Field(ge=1)] = 2
    moe_every_n_layers: Annotated[int, Field(ge=1)] = 1
    moe_layers: Annotated[tuple[StrictInt, ...], Field(strict=False)] | None = None
    moe_intermediate_size: Annotated[int, Field(ge=1)] | None = None  # None: intermediate_size
    moe_shared_expert: bool = False  # one dense expert every token goes through, added to the routed output
    moe_capacity_factor: Positive | None = 1.25  # None: unlimited (no token is ever dropped)
    moe_eval_capacity_factor: Positive | None = None  # used in eval mode (and generate); None: unlimited
    router_score: RouterScore = "softmax"
    router_aux_loss_coef: NonNegative = 0.01  # Switch/GShard load balancing, summed over MoE layers
    router_z_loss_coef: NonNegative = 0.001  # ST-MoE router z-loss, summed over MoE layers
    moe_fused_routing: bool = True  # use cuda_ext.moe_routing when it is built, else the PyTorch reference

    def __post_init__(self) -> None:
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
        self._check_attention()
        self._check_moe()
        parameters = self.num_parameters()
        _require(
            parameters <= MAX_PARAMETERS,
            f"{parameters:.3g} parameters is more than {MAX_PARAMETERS:.0e}; check the sizes",
        )

    def _check_attention(self) -> None:
        pattern = self.attention_pattern
        if pattern == "sliding_window":
            _require(
                self.attention_window is not None,
                f"attention_pattern 'sliding_window' needs attention_window >= 1, got {self.attention_window}",
            )
        else:
            _require(
                self.attention_window is None,
                f"attention_window is set but attention_pattern is {pattern!r}; use 'sliding_window'",
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
        _require(
            self.moe_top_k <= self.num_experts,
            f"moe_top_k must be in [1, num_experts={self.num_experts}], got {self.moe_top_k}",
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
            raise ValueError(
                f"unknown GPTConfig field(s) {unknown}; known: {sorted(f.name for f in fields(self))}"
            )
        try:
            return replace(self, **overrides)
        except ValidationError as exc:
            raise ValueError(field_problems(exc)) from None

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


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


_BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
# pydantic's error types -> the type a field must hold (literal_error on a non-string: a choice must be a str)
_TYPE_NAMES = {
    "int": "int",
    "float": "float",
    "finite": "float",
    "bool": "bool",
    "string": "str",
    "literal": "str",
    "tuple": "tuple[int, ...]",
}


def field_problems(error: ValidationError) -> str:
    """One line per refused GPTConfig field, each naming it: ``hidden_size must be <= 131072, got 10**9``."""
    problems = []
    for item in error.errors():
        name = str(item["loc"][0]) if item["loc"] else "GPTConfig"
        kind, context, got = item["type"], item.get("ctx") or {}, item.get("input")
        bound = next(((op, context[key]) for key, op in _BOUNDS if key in context), None)
        nullable = name in GPTConfig.__dataclass_fields__ and "None" in str(
            GPTConfig.__dataclass_fields__[name].type
        )
        if kind == "value_error":  # a rule that spans fields (__post_init__)
            problems.append(item["msg"].removeprefix("Value error, "))
        elif bound is not None:
            problems.append(f"{name} must be {bound[0]} {bound[1]}, got {got!r}")
        elif kind == "literal_error" and isinstance(got, str):
            problems.append(f"{name} must be one of {context.get('expected')}, got {got!r}")
        else:
            # an item of moe_layers (the only field with items), or the field's own type
            type_name = "tuple[int, ...]" if len(item["loc"]) > 1 else _TYPE_NAMES.get(kind.split("_")[0])
            if type_name is None:
                problems.append(f"{name}: {item['msg']}")
            else:
                shown = f"{type_name} or null" if nullable else type_name
                problems.append(f"{name} must be {shown}, got {got!r}")
    return "; ".join(problems)


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

    @model_validator(mode="after")
    def _buildable(self) -> ModelSection:
        try:
            self.gpt()
        except ValueError as exc:
            raise ValueError(f"model.overrides do not give a valid {self.preset!r} model: {exc}") from None
        return self

    def gpt(self) -> GPTConfig:
        """The model this section describes (before the trainer sets the tokenizer's vocab_size)."""
        return model_config(self.preset, **self.overrides)
