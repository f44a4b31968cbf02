"""Our GPT as a Hugging Face transformers model: which architecture computes exactly what ours does, its
config, and the weights renamed (and, where the layouts differ, permuted) into it.

The mapping, checked by ``tests/export`` on the logits of every preset that exports:

- dense, causal attention -> ``LlamaForCausalLM``; sliding window -> ``MistralForCausalLM`` (its window
  ``k > q - w`` is ours, ``q - k < w``);
- mixture of experts -> ``Ernie4_5_MoeForCausalLM``: softmax over all experts, the top k, renormalised to sum
  to 1 (ours); MoE on every n-th layer counting from 1 (its ``moe_layer_interval``, our
  ``moe_every_n_layers``); an ungated shared expert of the experts' width (its ``moe_num_shared_experts=1``).
  Mixtral has neither interleaved dense layers nor a shared expert, and Qwen2-MoE gates its shared expert by
  a sigmoid we do not have. Ernie rotates interleaved pairs (2i, 2i+1) where we rotate halves (i, i + d/2),
  so each head's q and k rows are permuted on export, as Meta's Llama conversion script does the other way;
  attention scores are unchanged because q and k get the same permutation.

Everything else is refused with the difference named (``ExportError``): LayerNorm, GELU MLPs, blockwise
attention, global tokens, sigmoid routers, and an evaluation capacity that drops tokens (transformers' MoE
layers never drop).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from pipeline.model.config import GPTConfig
from pipeline.model.trained import SpecialTokens

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel


class ExportError(ValueError):
    """This model cannot be exported exactly; the message names the difference."""


def architecture(config: GPTConfig) -> str:
    """The transformers class that computes exactly what ``GPT(config)`` does, or ``ExportError``."""
    differences = []
    if config.norm != "rmsnorm":
        differences.append(f"norm={config.norm!r} (transformers' decoders here use RMSNorm)")
    if config.activation != "swiglu":
        differences.append(f"activation={config.activation!r} (a gated SiLU MLP is needed)")
    if config.attention_pattern == "blockwise":
        differences.append("attention_pattern='blockwise' (no transformers decoder masks by blocks)")
    if config.attention_global_tokens:
        differences.append(f"attention_global_tokens={config.attention_global_tokens} (no global tokens)")
    if config.num_experts:
        if config.attention_pattern != "causal":
            differences.append(f"attention_pattern={config.attention_pattern!r} with experts")
        if config.router_score != "softmax":
            differences.append(f"router_score={config.router_score!r} (Ernie 4.5 MoE routes by softmax)")
        if config.moe_eval_capacity_factor is not None:
            differences.append(
                f"moe_eval_capacity_factor={config.moe_eval_capacity_factor} drops tokens at inference, "
                "transformers' MoE layers never do (set it to null)"
            )
        if moe_interval(config) is None:
            differences.append(
                f"moe_layers={list(config.moe_layer_indices)} is not every n-th layer of a range of layers"
            )
    if differences:
        raise ExportError("cannot export this model exactly to transformers: " + "; ".join(differences))
    if config.num_experts:
        return "Ernie4_5_MoeForCausalLM"
    return "MistralForCausalLM" if config.attention_pattern == "sliding_window" else "LlamaForCausalLM"


def moe_interval(config: GPTConfig) -> tuple[int, int, int] | None:
    """(interval, first, last) with our MoE layers = {i in [first, last] : (i + 1) % interval == 0}, Ernie's
    rule; None when no such triple gives them."""
    layers = config.moe_layer_indices
    first, last = layers[0], layers[-1]
    for interval in range(1, config.num_hidden_layers + 1):
        if tuple(i for i in range(first, last + 1) if (i + 1) % interval == 0) == layers:
            return interval, first, last
    return None


def hf_config(
    config: GPTConfig, tokens: SpecialTokens, dtype: torch.dtype = torch.float32
) -> PretrainedConfig:
    import transformers

    name = architecture(config)
    common: dict[str, Any] = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        hidden_act="silu",
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        tie_word_embeddings=config.tie_word_embeddings,
        initializer_range=config.initializer_range,
        bos_token_id=tokens.bos,
        eos_token_id=tokens.eos_id,
        pad_token_id=tokens.pad_id,
        architectures=[name],
        dtype=dtype,
    )
    if name == "LlamaForCausalLM":
        return transformers.LlamaConfig(**common, attention_bias=False, mlp_bias=False)
    if name == "MistralForCausalLM":
        return transformers.MistralConfig(**common, sliding_window=config.attention_window)
    layout = moe_interval(config)
    assert layout is not None  # architecture() refused the MoE layouts Ernie cannot express
    interval, first, last = layout
    return transformers.Ernie4_5_MoeConfig(
        **common,
        use_bias=False,
        moe_intermediate_size=config.expert_intermediate_size,
        moe_k=config.moe_top_k,
        moe_num_experts=config.num_experts,
        moe_num_shared_experts=1 if config.moe_shared_expert else 0,
        moe_layer_interval=interval,
        moe_layer_start_index=first,
        moe_layer_end_index=last,
        router_aux_loss_coef=config.router_aux_loss_coef,
    )


def interleave_rope_rows(weight: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """Rows of a q or k projection from the rotate-half layout (pairs i, i + d/2) to interleaved pairs
    (2i, 2i + 1), head by head."""
    half = head_dim // 2
    order = torch.stack((torch.arange(half), torch.arange(half) + half), dim=1).reshape(-1)
    return weight.view(heads, head_dim, -1)[:, order].reshape_as(weight)


def hf_state_dict(state: dict[str, torch.Tensor], config: GPTConfig) -> dict[str, torch.Tensor]:
    """Our state dict (``GPT.state_dict()``) under the names, shapes and layouts of ``architecture(config)``."""
    interleaved = architecture(config) == "Ernie4_5_MoeForCausalLM"
    kv_width = config.num_key_value_heads * config.head_dim
    out = {
        "model.embed_tokens.weight": state["embed_tokens.weight"],
        "model.norm.weight": state["norm.weight"],
    }
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = state["lm_head.weight"]
    for layer in range(config.num_hidden_layers):
        ours, theirs = f"blocks.{layer}.", f"model.layers.{layer}."
        q = state[ours + "attn.q_proj.weight"]
        k, v = state[ours + "attn.kv_proj.weight"].split(kv_width)
        if interleaved:
            q = interleave_rope_rows(q, config.num_attention_heads, config.head_dim)
            k = interleave_rope_rows(k, config.num_key_value_heads, config.head_dim)
        out |= {
            theirs + "self_attn.q_proj.weight": q,
            theirs + "self_attn.k_proj.weight": k,
            theirs + "self_attn.v_proj.weight": v,
            theirs + "self_attn.o_proj.weight": state[ours + "attn.o_proj.weight"],
            theirs + "input_layernorm.weight": state[ours + "attn_norm.weight"],
            theirs + "post_attention_layernorm.weight": state[ours + "mlp_norm.weight"],
        }
        if layer in config.moe_layer_indices:
            out |= _moe_weights(state, ours + "mlp.", theirs + "mlp.", config)
        else:
            out |= _gated_mlp(state, ours + "mlp.", theirs + "mlp.")
    return {name: tensor.contiguous() for name, tensor in out.items()}


def _gated_mlp(state: dict[str, torch.Tensor], ours: str, theirs: str) -> dict[str, torch.Tensor]:
    gate, up = state[ours + "up_proj.weight"].chunk(2)  # our up_proj holds [gate; up]
    return {
        theirs + "gate_proj.weight": gate,
        theirs + "up_proj.weight": up,
        theirs + "down_proj.weight": state[ours + "down_proj.weight"],
    }


def _moe_weights(state: dict[str, torch.Tensor], ours: str, theirs: str, config: GPTConfig) -> dict:
    experts = range(config.num_experts)
    out = {
        theirs + "gate.weight": state[ours + "router.weight"].float(),
        theirs + "gate.moe_statics.e_score_correction_bias": torch.zeros(1, config.num_experts),
        # Ernie stores the experts as 3-D tensors; its gate_up_proj rows are [gate; up], as ours.
        theirs + "experts.gate_up_proj": torch.stack(
            [state[f"{ours}experts.{e}.up_proj.weight"] for e in experts]
        ),
        theirs + "experts.down_proj": torch.stack(
            [state[f"{ours}experts.{e}.down_proj.weight"] for e in experts]
        ),
    }
    if config.moe_shared_expert:
        out |= _gated_mlp(state, ours + "shared_expert.", theirs + "shared_experts.")
    return out


def build_hf_model(
    state: dict[str, torch.Tensor],
    config: GPTConfig,
    tokens: SpecialTokens,
    dtype: torch.dtype = torch.float32,
) -> PreTrainedModel:
    """The transformers model holding our weights, in eval mode; every one of its tensors is set (strict)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(hf_config(config, tokens, dtype), dtype=dtype)
    weights = hf_state_dict(state, config)
    if config.tie_word_embeddings:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    model.load_state_dict(weights, strict=True)  # copies, casting to each parameter's dtype
    return model.eval()
