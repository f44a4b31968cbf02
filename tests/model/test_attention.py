"""RoPE, attention masks and attention, each against a reference written from the definition."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import create_mask

from pipeline.model import model_config
from pipeline.model.gpt import (
    GPT,
    Attention,
    KVCache,
    RotaryEmbedding,
    apply_rope,
    attention_mask,
    attention_mask_mod,
    flex_block_mask,
)

PATTERNS = {
    "causal": {},
    "sliding_window": {"attention_pattern": "sliding_window", "attention_window": 5},
    "sliding_window_global": {
        "attention_pattern": "sliding_window",
        "attention_window": 4,
        "attention_global_tokens": 2,
    },
    "blockwise": {"attention_pattern": "blockwise", "attention_block_size": 4, "attention_local_blocks": 1},
    "blockwise_global": {
        "attention_pattern": "blockwise",
        "attention_block_size": 3,
        "attention_local_blocks": 0,
        "attention_global_tokens": 1,
    },
}


def rope_reference(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Pairs (i, i + d/2) as complex numbers, multiplied by e^(i * position * theta^(-2i/d)), in float64."""
    half = x.size(-1) // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / x.size(-1))
    rotation = torch.polar(torch.ones(len(positions), half, dtype=torch.float64), positions[:, None] * freqs)
    rotated = torch.complex(x[..., :half].double(), x[..., half:].double()) * rotation
    return torch.cat([rotated.real, rotated.imag], dim=-1)


def rotate_at(rope: RotaryEmbedding, x: torch.Tensor, position: int) -> torch.Tensor:
    cos, sin = rope(position, 1)
    return apply_rope(x.view(1, 1, 1, -1), cos, sin).view(-1)


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(0, 400),
    n=st.integers(0, 400),
    shift=st.integers(0, 100),
    seed=st.integers(0, 2**16),
)
def test_rope_scores_depend_only_on_relative_position(m, n, shift, seed):
    generator = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 32, generator=generator, dtype=torch.float64).unbind()
    rope = RotaryEmbedding(head_dim=32, max_positions=512, theta=10_000.0).double()
    near = rotate_at(rope, q, m) @ rotate_at(rope, k, n)
    far = rotate_at(rope, q, m + shift) @ rotate_at(rope, k, n + shift)
    torch.testing.assert_close(near, far, rtol=1e-5, atol=1e-5)


def test_rope_equals_complex_multiplication_with_offset():
    torch.manual_seed(1)
    rope = RotaryEmbedding(head_dim=8, max_positions=64, theta=500.0)
    x = torch.randn(2, 3, 20, 8)
    for offset in (0, 17, 44):
        cos, sin = rope(offset, 20)
        expected = rope_reference(x, torch.arange(offset, offset + 20, dtype=torch.float64), 500.0)
        torch.testing.assert_close(apply_rope(x, cos, sin).double(), expected, rtol=1e-5, atol=1e-5)


def reference_mask(config, seq: int, document_ids: list[int] | None = None) -> torch.Tensor:
    """The mask from the config's words, one (query, key) pair at a time."""
    docs = document_ids or [0] * seq

    def document_start(t: int) -> int:
        while t > 0 and docs[t - 1] == docs[t]:
            t -= 1
        return t

    mask = torch.zeros(seq, seq, dtype=torch.bool)
    for i in range(seq):
        for j in range(i + 1):
            if docs[i] != docs[j]:
                continue
            if config.attention_pattern == "sliding_window":
                local = i - j < config.attention_window
            elif config.attention_pattern == "blockwise":
                local = i // config.attention_block_size - j // config.attention_block_size
                local = local <= config.attention_local_blocks
            else:
                local = True
            is_global = j - document_start(j) < config.attention_global_tokens
            mask[i, j] = local or is_global
    return mask


@settings(max_examples=60, deadline=None)
@given(
    seq=st.integers(1, 40),
    pattern=st.sampled_from(["causal", "sliding_window", "blockwise"]),
    window=st.integers(1, 12),
    block=st.integers(1, 9),
    local_blocks=st.integers(0, 3),
    global_tokens=st.integers(0, 4),
    boundaries=st.lists(st.integers(1, 39), max_size=4),
    packed=st.booleans(),
)
def test_mask_matches_dense_reference(
    seq, pattern, window, block, local_blocks, global_tokens, boundaries, packed
):
    config = model_config(
        "tiny",
        attention_pattern=pattern,
        attention_window=window if pattern == "sliding_window" else None,
        attention_block_size=block,
        attention_local_blocks=local_blocks,
        attention_global_tokens=0 if pattern == "causal" else global_tokens,
    )
    docs = [sum(t >= b for b in boundaries) for t in range(seq)] if packed else None
    positions = torch.arange(seq)
    document_ids = torch.tensor([docs]) if docs else None
    mask = attention_mask(config, positions, positions, document_ids)
    assert mask.dtype == torch.bool and mask.shape == (1, 1, seq, seq)
    assert torch.equal(mask[0, 0], reference_mask(config, seq, docs))
    flex_mask = create_mask(attention_mask_mod(config, document_ids), 1, 1, seq, seq, device="cpu")
    assert torch.equal(flex_mask[0, 0], reference_mask(config, seq, docs))  # what FlexAttention sees on CUDA
    if docs is None:
        expected_keys = reference_mask(config, seq).sum().item() / seq
        assert config.mean_attended_keys(seq) == pytest.approx(expected_keys)


def test_mask_rows_for_queries_after_an_offset_are_the_last_rows():
    config = model_config("tiny", **PATTERNS["blockwise_global"])
    positions = torch.arange(23)
    full = attention_mask(config, positions, positions)
    torch.testing.assert_close(attention_mask(config, positions[15:], positions), full[:, :, 15:])


def attention_reference(attn: Attention, x: torch.Tensor, mask: torch.Tensor, theta: float) -> torch.Tensor:
    """softmax(QK^T / sqrt(d) + mask) V per head, in float64, with RoPE as complex multiplication."""
    batch, seq, _ = x.shape
    heads, kv_heads, dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
    x = x.double()
    q = (x @ attn.q_proj.weight.double().T).view(batch, seq, heads, dim).transpose(1, 2)
    kv = (x @ attn.kv_proj.weight.double().T).view(batch, seq, 2, kv_heads, dim)
    k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
    positions = torch.arange(seq, dtype=torch.float64)
    q, k = rope_reference(q, positions, theta), rope_reference(k, positions, theta)
    out = torch.empty(batch, heads, seq, dim, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            kv_head = h // (heads // kv_heads)  # consecutive query heads share one KV head
            scores = q[b, h] @ k[b, kv_head].T / math.sqrt(dim)
            scores = scores.masked_fill(~mask[b if mask.size(0) > 1 else 0, 0], float("-inf"))
            out[b, h] = torch.softmax(scores, dim=-1) @ v[b, kv_head]
    return out.transpose(1, 2).reshape(batch, seq, heads * dim) @ attn.o_proj.weight.double().T


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("packed", [False, True])
def test_sdpa_attention_equals_explicit_softmax_reference(pattern, kv_heads, packed):
    torch.manual_seed(len(pattern) * 10 + kv_heads + packed)
    config = model_config("tiny", hidden_size=32, num_key_value_heads=kv_heads, **PATTERNS[pattern])
    attn = Attention(config, layer_idx=0)
    for param in attn.parameters():
        torch.nn.init.normal_(param, std=0.3)
    x = torch.randn(2, 19, 32)
    document_ids = torch.tensor([[0] * 6 + [1] * 13, [4] * 11 + [9] * 8]) if packed else None
    rope = RotaryEmbedding(config.head_dim, 64, config.rope_theta)
    positions = torch.arange(19)
    mask = attention_mask(config, positions, positions, document_ids)
    expected = attention_reference(attn, x, mask, config.rope_theta)
    torch.testing.assert_close(attn(x, *rope(0, 19), mask).double(), expected, rtol=1e-4, atol=1e-5)
    if pattern == "causal" and not packed:  # the is_causal fast path the model takes here
        torch.testing.assert_close(attn(x, *rope(0, 19), None).double(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_future_tokens_never_change_past_logits(pattern):
    torch.manual_seed(2)
    model = GPT(model_config("tiny", vocab_size=97, **PATTERNS[pattern])).eval()
    tokens = torch.randint(0, 97, (2, 24))
    changed = tokens.clone()
    changed[:, 12:] = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        before, after = model(tokens).logits, model(changed).logits
    torch.testing.assert_close(before[:, :12], after[:, :12], rtol=0, atol=0)
    assert not torch.allclose(before[:, 12:], after[:, 12:])


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_document_mask_blocks_cross_document_attention(pattern):
    """A token's logits never depend on another document packed in the same row."""
    torch.manual_seed(3)
    model = GPT(model_config("tiny", vocab_size=97, num_key_value_heads=2, **PATTERNS[pattern])).eval()
    first, second = torch.randint(0, 97, (1, 9)), torch.randint(0, 97, (1, 14))
    packed = torch.cat([first, second], dim=1)
    document_ids = torch.tensor([[7] * 9 + [2] * 14])
    other_first = torch.cat([torch.randint(0, 97, (1, 9)), second], dim=1)
    with torch.no_grad():
        logits = model(packed, document_ids=document_ids).logits
        with_other_first = model(other_first, document_ids=document_ids).logits
        alone = model(second).logits
        unmasked = model(packed).logits
    torch.testing.assert_close(logits[:, 9:], with_other_first[:, 9:], rtol=0, atol=0)
    assert not torch.allclose(logits[:, 9:], unmasked[:, 9:], atol=1e-4)
    if pattern != "blockwise" and pattern != "blockwise_global":
        # RoPE is relative and these masks are position-independent, so a document packed at offset 9
        # gives the same logits as the same document alone (block boundaries are absolute, so not there).
        torch.testing.assert_close(logits[:, 9:], alone, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_kv_cache_decoding_equals_full_sequence_logits(pattern, preset):
    torch.manual_seed(4)
    config = model_config(preset, vocab_size=97, num_key_value_heads=2, **PATTERNS[pattern])
    model = GPT(config).eval()
    tokens = torch.randint(0, 97, (2, 21))
    with torch.no_grad():
        full = model(tokens).logits
        cache = KVCache(config, batch_size=2, max_length=21)
        # A prompt, a multi-token chunk at an offset (explicit mask path), then one token at a time.
        pieces = [model(tokens[:, :7], cache=cache).logits, model(tokens[:, 7:12], cache=cache).logits]
        pieces += [model(tokens[:, t : t + 1], cache=cache).logits for t in range(12, 21)]
    assert cache.length == 21
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-4, atol=1e-5)


def test_attention_inputs_are_checked():
    model = GPT(model_config("tiny", vocab_size=50, max_position_embeddings=16))
    tokens = torch.randint(0, 50, (2, 8))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(torch.randint(0, 50, (1, 17)))
    with pytest.raises(ValueError, match="document_ids shape"):
        model(tokens, document_ids=torch.zeros(2, 7, dtype=torch.long))


@pytest.mark.parametrize(("pattern", "kv_heads"), [("sliding_window_global", 2), ("blockwise", 1)])
def test_flex_attention_forward_equals_the_dense_mask(pattern, kv_heads):
    """The FlexAttention path the model takes on CUDA, run forward on the CPU (Flex has no CPU backward)."""
    torch.manual_seed(11)
    config = model_config("tiny", hidden_size=32, num_key_value_heads=kv_heads, **PATTERNS[pattern])
    attn = Attention(config, layer_idx=0)
    x = torch.randn(2, 19, 32)
    document_ids = torch.tensor([[0] * 6 + [1] * 13, [4] * 11 + [9] * 8])
    rope = RotaryEmbedding(config.head_dim, 64, config.rope_theta)
    positions = torch.arange(19)
    with torch.no_grad():
        dense = attn(x, *rope(0, 19), attention_mask(config, positions, positions, document_ids))
        flex = attn(x, *rope(0, 19), flex_block_mask(config, 19, document_ids, "cpu"))
    torch.testing.assert_close(flex, dense, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention is the CUDA path")
@pytest.mark.parametrize(
    ("pattern", "compiled"), [*((p, False) for p in sorted(PATTERNS)), ("sliding_window_global", True)]
)
def test_model_on_cuda_flex_and_dense_mask_agree_forward_and_backward(pattern, compiled):
    torch.manual_seed(12)
    config = model_config("tiny", vocab_size=97, num_key_value_heads=2, **PATTERNS[pattern])
    tokens = torch.randint(0, 97, (2, 65), device="cuda")
    document_ids = torch.cat([torch.zeros(2, 20), torch.ones(2, 44)], dim=1).long().cuda()
    results = []
    for kernel in ("auto", "sdpa"):
        torch.manual_seed(13)
        model = GPT(config.with_overrides(attention_kernel=kernel)).cuda()
        forward = torch.compile(model) if compiled and kernel == "auto" else model
        out = forward(tokens[:, :-1], tokens[:, 1:], document_ids)
        out.loss.backward()
        results.append([out.logits.detach(), *(p.grad for p in model.parameters())])
    for flex, dense in zip(*results, strict=True):
        torch.testing.assert_close(flex, dense, rtol=2e-4, atol=2e-5)
