"""Config validation, presets, and the parameter / FLOP accounting against the real modules."""

import json
from dataclasses import asdict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from torch.utils.flop_counter import FlopCounterMode

from pipeline.model import PRESETS, GPTConfig, model_config
from pipeline.model.config import ModelSection
from pipeline.model.gpt import GPT


def test_presets():
    assert set(PRESETS) == {"tiny", "tiny-moe", "base", "base-moe"}
    base = PRESETS["base"]
    assert (base.num_hidden_layers, base.hidden_size) == (12, 768)
    assert PRESETS["tiny"].num_experts == 0 and PRESETS["base"].num_experts == 0
    assert PRESETS["tiny-moe"].moe_layer_indices == (0, 1)
    assert PRESETS["base-moe"].moe_layer_indices == (1, 3, 5, 7, 9, 11)
    assert PRESETS["base-moe"].num_active_parameters() < PRESETS["base-moe"].num_parameters()
    for name in ("tiny", "base"):
        moe = PRESETS[f"{name}-moe"]
        assert (moe.hidden_size, moe.num_hidden_layers) == (
            PRESETS[name].hidden_size,
            PRESETS[name].num_hidden_layers,
        )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"hidden_size": 100, "num_attention_heads": 3}, "divisible by num_attention_heads"),
        ({"num_key_value_heads": 3}, "divisible by num_key_value_heads"),
        ({"hidden_size": 12, "num_attention_heads": 4}, "even for RoPE"),
        ({"num_hidden_layers": 0}, "num_hidden_layers must be >= 1"),
        ({"dropout": 1.0}, "dropout"),
        ({"norm": "batchnorm"}, "norm must be one of"),
        ({"activation": "relu"}, "activation must be one of"),
        ({"attention_pattern": "dilated"}, "attention_pattern must be one of"),
        ({"attention_pattern": "sliding_window"}, "needs attention_window"),
        ({"attention_window": 8}, "use 'sliding_window'"),
        ({"attention_pattern": "blockwise", "attention_block_size": 0}, "attention_block_size"),
        ({"attention_pattern": "blockwise", "attention_local_blocks": -1}, "attention_local_blocks"),
        ({"attention_global_tokens": 2}, "needs a local attention_pattern"),
        ({"num_experts": 4, "moe_top_k": 5}, "moe_top_k must be in"),
        ({"num_experts": 4, "moe_every_n_layers": 3}, "no MoE layer"),
        ({"num_experts": 4, "moe_layers": [0, 2]}, "out of range"),
        ({"num_experts": 4, "moe_layers": [1, 1]}, "repeats"),
        ({"moe_layers": [0]}, "num_experts is 0"),
        ({"num_experts": 4, "moe_capacity_factor": 0.0}, "moe_capacity_factor must be > 0"),
        ({"num_experts": 4, "router_score": "relu"}, "router_score"),
        ({"num_experts": 4, "router_aux_loss_coef": -0.1}, "router_aux_loss_coef"),
        ({"num_experts": -1}, "num_experts must be >= 0"),
        ({"fused_cross_entropy": "triton"}, "fused_cross_entropy must be one of"),
        ({"fused_cross_entropy_chunk_size": 0}, "fused_cross_entropy_chunk_size must be >= 1"),
        ({"hidden_dim": 64}, "unknown GPTConfig field"),
    ],
)
def test_bad_combinations_fail_with_a_clear_message(overrides, message):
    with pytest.raises(ValueError, match=message):
        model_config("tiny", **overrides)
    if "hidden_dim" not in overrides:
        with pytest.raises(ValidationError, match=message):
            ModelSection(preset="tiny", overrides=overrides)


def test_unknown_preset_and_list_fields_from_yaml():
    with pytest.raises(ValueError, match="unknown model preset 'huge'"):
        model_config("huge")
    config = model_config("tiny-moe", moe_layers=[1])
    assert config.moe_layers == (1,) and config.moe_layer_indices == (1,)
    assert GPTConfig(**json.loads(json.dumps(asdict(config)))) == config  # checkpoint round trip
    assert ModelSection(preset="base-moe", overrides={"moe_top_k": 1}).overrides == {"moe_top_k": 1}


configs = st.builds(
    dict,
    heads=st.sampled_from([1, 2, 4]),
    kv_divisor=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([2, 4, 8]),
    layers=st.integers(1, 3),
    intermediate=st.integers(1, 20),
    vocab=st.integers(1, 50),
    experts=st.integers(0, 4),
    top_k=st.integers(1, 4),
    every=st.integers(1, 3),
    moe_intermediate=st.one_of(st.none(), st.integers(1, 12)),
    shared=st.booleans(),
    tied=st.booleans(),
    norm=st.sampled_from(["rmsnorm", "layernorm"]),
    activation=st.sampled_from(["swiglu", "gelu"]),
)


def build(c: dict) -> GPTConfig:
    experts = c["experts"]
    return GPTConfig(
        vocab_size=c["vocab"],
        hidden_size=c["heads"] * c["head_dim"],
        num_hidden_layers=c["layers"],
        num_attention_heads=c["heads"],
        num_key_value_heads=max(1, c["heads"] // c["kv_divisor"]),
        intermediate_size=c["intermediate"],
        norm=c["norm"],
        activation=c["activation"],
        tie_word_embeddings=c["tied"],
        num_experts=experts,
        moe_top_k=min(c["top_k"], max(experts, 1)),
        moe_every_n_layers=min(c["every"], c["layers"]),
        moe_intermediate_size=c["moe_intermediate"],
        moe_shared_expert=c["shared"],
    )


def active_parameters_by_hand(model: GPT) -> int:
    """Walk the real modules: everything except the routed experts a token does not use."""
    config, total = model.config, 0
    seen = set()
    for name, param in model.named_parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        if ".experts." in name:
            expert = int(name.split(".experts.")[1].split(".")[0])
            if expert >= config.moe_top_k:  # count k of the (identically shaped) experts
                continue
        total += param.numel()
    return total


@settings(max_examples=40, deadline=None)
@given(configs)
def test_parameter_count_formula_matches_real_parameters(c):
    config = build(c)
    model = GPT(config)
    unique = {id(p): p.numel() for p in model.parameters()}
    assert config.num_parameters() == sum(unique.values()) == model.num_parameters()
    assert config.num_active_parameters() == active_parameters_by_hand(model) == model.num_active_parameters()


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"tie_word_embeddings": False, "num_key_value_heads": 2, "activation": "gelu"},
        {"num_experts": 4, "moe_top_k": 2, "moe_capacity_factor": None, "moe_shared_expert": True},
        {"num_experts": 3, "moe_top_k": 1, "moe_capacity_factor": None, "moe_every_n_layers": 2},
    ],
)
def test_matmul_flops_per_token_match_a_flop_counter(overrides):
    """The counter sees every matmul of a forward + backward (CPU SDPA is not counted, so attention
    scores are checked separately against the dense mask in test_attention)."""
    torch.manual_seed(14)
    config = model_config("tiny", vocab_size=64, hidden_size=32, intermediate_size=40, **overrides)
    model = GPT(config)
    batch, seq = 2, 12
    tokens = torch.randint(0, 64, (batch, seq + 1))
    with FlopCounterMode(display=False) as counter:
        model(tokens[:, :-1], tokens[:, 1:]).loss.backward()
    counted = sum(n for op, n in counter.get_flop_counts()["Global"].items() if "attention" not in str(op))
    attention = 12 * config.num_hidden_layers * config.hidden_size * config.mean_attended_keys(seq)
    assert counted / (batch * seq) == pytest.approx(config.flops_per_token(seq) - attention, rel=1e-9)
    assert model.flops_per_token(seq) == config.flops_per_token(seq)


def test_flops_per_token_counts_only_attended_keys():
    causal = model_config("base")
    window = model_config("base", attention_pattern="sliding_window", attention_window=256)
    attention = 12 * 12 * 768
    assert causal.flops_per_token(2048) - window.flops_per_token(2048) == pytest.approx(
        attention * (causal.mean_attended_keys(2048) - window.mean_attended_keys(2048))
    )
    assert causal.mean_attended_keys(2048) == pytest.approx(2049 / 2)
    assert causal.flops_per_token() == causal.flops_per_token(2048)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"hidden_size": 10**9}, "hidden_size must be <= 131072"),
        ({"num_hidden_layers": 10**9}, "num_hidden_layers must be <= 4096"),
        ({"vocab_size": 10**12}, "vocab_size must be <= 16777216"),
        ({"rope_theta": float("nan")}, "rope_theta must be float"),
        ({"initializer_range": float("inf")}, "initializer_range must be float"),
        ({"hidden_size": 128.5}, "hidden_size must be int"),
        ({"num_hidden_layers": True}, "num_hidden_layers must be int"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be bool"),
        ({"norm": 3}, "norm must be str"),
        ({"moe_layers": ["a"], "num_experts": 4}, "moe_layers must be tuple"),
        ({"hidden_size": 65536, "intermediate_size": 1 << 20, "num_hidden_layers": 4096}, "parameters"),
    ],
)
def test_overrides_are_checked_by_the_model_config_at_load(overrides, message):
    """`model.overrides` with NaN, 10^9 layers or hidden_size 10^9 used to pass and fail inside torchrun after
    three restarts (52-68 s, ~200 lines); the model config's own checks refuse them when the config loads."""
    from pipeline.config import load_config
    from pipeline.core.config import ConfigError

    with pytest.raises(ValueError, match=message):
        model_config("tiny", **overrides)
    with pytest.raises(ConfigError, match=r"model.*" + message.split(" ")[0]):
        load_config(overrides=[f"model.overrides={json.dumps(overrides)}"], environ={})
