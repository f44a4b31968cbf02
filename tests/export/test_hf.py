"""Export to transformers: the logits of the exported model equal ours for every preset (and variant) that
exports, greedy generation gives the same tokens, the tokenizer encodes identically, and a model that cannot
be exported exactly is refused with the difference named. Random weights; the trained checkpoint is checked
end to end in tests/tracking/test_mlflow_server.py."""

from __future__ import annotations

import pytest
import torch

from pipeline.export.hf import (
    ExportError,
    architecture,
    build_hf_model,
    interleave_rope_rows,
)
from pipeline.model.config import PRESETS, model_config
from pipeline.model.gpt import GPT, apply_rope
from pipeline.model.trained import SpecialTokens

# fp32 on CPU: only the order of summation differs (measured <= 1e-6 on these shapes).
TOLERANCE = 1e-4
TOKENS = SpecialTokens(eos_id=0, pad_id=1)

VARIANTS = {
    "tiny": ("tiny", {}, "LlamaForCausalLM"),
    "tiny-gqa-untied": ("tiny", {"num_key_value_heads": 2, "tie_word_embeddings": False}, "LlamaForCausalLM"),
    "tiny-sliding": (
        "tiny",
        {"attention_pattern": "sliding_window", "attention_window": 5},
        "MistralForCausalLM",
    ),
    "tiny-moe": ("tiny-moe", {}, "Ernie4_5_MoeForCausalLM"),
    "tiny-moe-interleaved-shared": (
        "tiny-moe",
        {
            "num_hidden_layers": 4,
            "moe_every_n_layers": 2,
            "moe_shared_expert": True,
            "num_key_value_heads": 2,
        },
        "Ernie4_5_MoeForCausalLM",
    ),
    "tiny-moe-top1-layers": (
        "tiny-moe",
        {"num_hidden_layers": 3, "moe_layers": [1, 2], "moe_top_k": 1},
        None,
    ),
}


def random_model(preset: str, overrides: dict, seed: int) -> GPT:
    torch.manual_seed(seed)
    model = GPT(model_config(preset, **overrides)).eval()
    with torch.no_grad():  # norms away from 1, so a misplaced norm weight would show
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_exported_logits_equal_ours(variant):
    preset, overrides, expected = VARIANTS[variant]
    model = random_model(preset, overrides, seed=len(variant))
    hf = build_hf_model(model.state_dict(), model.config, TOKENS)
    if expected:
        assert type(hf).__name__ == expected
    tokens = torch.randint(0, model.config.vocab_size, (3, 50), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        difference = (model(tokens).logits - hf(tokens).logits).abs().max().item()
    assert difference <= TOLERANCE, difference


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["base", "base-moe"])
def test_the_base_presets_export_with_equal_logits(preset):
    model = random_model(preset, {}, seed=3)
    hf = build_hf_model(model.state_dict(), model.config, TOKENS)
    tokens = torch.randint(0, model.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (model(tokens).logits - hf(tokens).logits).abs().max().item() <= TOLERANCE


def test_every_preset_either_exports_or_names_why():
    for name, config in PRESETS.items():
        assert architecture(config) in {"LlamaForCausalLM", "Ernie4_5_MoeForCausalLM"}, name


@pytest.mark.parametrize("variant", ["tiny", "tiny-moe-interleaved-shared", "tiny-sliding"])
def test_greedy_generation_gives_the_same_tokens_as_transformers(variant):
    preset, overrides, _ = VARIANTS[variant]
    model = random_model(preset, overrides, seed=7)
    hf = build_hf_model(model.state_dict(), model.config, TOKENS)
    prompt = torch.randint(2, model.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(4))
    ours = model.generate(prompt, 20, temperature=0)
    theirs = hf.generate(prompt, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=1)
    assert ours.tolist() == theirs.tolist()


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"norm": "layernorm"}, "norm='layernorm'"),
        ({"activation": "gelu"}, "activation='gelu'"),
        ({"attention_pattern": "blockwise"}, "blockwise"),
        (
            {"attention_pattern": "sliding_window", "attention_window": 8, "attention_global_tokens": 2},
            "attention_global_tokens=2",
        ),
        ({"num_experts": 4, "router_score": "sigmoid"}, "router_score='sigmoid'"),
        ({"num_experts": 4, "moe_eval_capacity_factor": 1.0}, "moe_eval_capacity_factor=1.0"),
        ({"num_hidden_layers": 4, "num_experts": 4, "moe_layers": [0, 1, 3]}, "moe_layers=[0, 1, 3]"),
    ],
)
def test_a_model_transformers_cannot_compute_exactly_is_refused_naming_the_difference(overrides, named):
    with pytest.raises(ExportError, match="cannot export") as refused:
        architecture(model_config("tiny", **overrides))
    assert named in str(refused.value)


def test_interleaving_the_rope_rows_turns_rotate_half_into_rotating_adjacent_pairs():
    """Independent reference: rotate adjacent pairs (2i, 2i+1) by angle_i, by hand."""
    heads, head_dim, positions = 2, 8, 5
    weight = torch.randn(heads * head_dim, 3)
    x = torch.randn(positions, 3)
    inv_freq = 1.0 / (10_000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(positions).float(), inv_freq)
    ours = apply_rope(
        (x @ weight.T).view(positions, heads, head_dim).transpose(0, 1), angles.cos(), angles.sin()
    )
    interleaved = (x @ interleave_rope_rows(weight, heads, head_dim).T).view(positions, heads, head_dim)
    even, odd = interleaved[..., 0::2], interleaved[..., 1::2]
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]
    rotated = (
        torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2).transpose(0, 1)
    )
    # The same rotation: our halves, read in interleaved order, are the hand-rotated pairs.
    half = head_dim // 2
    order = torch.stack((torch.arange(half), torch.arange(half) + half), dim=1).reshape(-1)
    assert torch.allclose(ours[..., order], rotated, atol=1e-6)


def test_bfloat16_export_holds_bfloat16_weights_close_to_ours_in_bfloat16():
    model = random_model("tiny", {}, seed=11)
    hf = build_hf_model(model.state_dict(), model.config, TOKENS, torch.bfloat16)
    assert {p.dtype for p in hf.parameters()} == {torch.bfloat16}
    tokens = torch.randint(0, model.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ours = model.to(torch.bfloat16)(tokens).logits.float()
        assert (ours - hf(tokens).logits.float()).abs().max().item() <= 5e-2
