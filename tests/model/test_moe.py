"""The MoE layer against per-token loops in float64, hand-computed capacity drops, and the router losses."""

import math

import pytest
import torch
import torch.nn.functional as F

from pipeline.model import model_config
from pipeline.model.gpt import GPT, MoE
from pipeline.model.routing import REFERENCE_OPS, routing_ops


def moe_config(**overrides):
    settings = {"hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 2, "num_experts": 5}
    return model_config("tiny-moe", **{**settings, **overrides})


def expert_reference(expert, x: torch.Tensor) -> torch.Tensor:
    """One token through one expert, from the weights: down(silu(gate x) * (up x)) or down(gelu(up x))."""
    up, down = expert.up_proj.weight.double(), expert.down_proj.weight.double()
    if expert.swiglu:
        gate, value = up.chunk(2, dim=0)
        hidden = F.silu(gate @ x) * (value @ x)
    else:
        hidden = F.gelu(up @ x)
    return down @ hidden


def moe_reference(moe: MoE, x: torch.Tensor):
    """Every token on its own: scores, top-k (ties to the lower id), renormalised weighted sum of experts.

    Also returns the Switch/GShard aux loss E * sum_i f_i P_i and the z-loss, written from their formulas.
    """
    config = moe.config
    num_experts, k = config.num_experts, config.moe_top_k
    router = moe.router.weight.double()
    rows, chosen_count, prob_sum, z_terms = [], [0] * num_experts, [0.0] * num_experts, []
    for token in x.double():
        logits = (router @ token).tolist()
        if config.router_score == "softmax":
            scores = [math.exp(v) / sum(math.exp(u) for u in logits) for v in logits]
        else:
            scores = [1 / (1 + math.exp(-v)) for v in logits]
        top = sorted(range(num_experts), key=lambda e: (-scores[e], e))[:k]
        total = sum(scores[e] for e in top)
        out = sum(scores[e] / total * expert_reference(moe.experts[e], token) for e in top)
        if moe.shared_expert is not None:
            out = out + expert_reference(moe.shared_expert, token)
        rows.append(out)
        for e in top:
            chosen_count[e] += 1
        for e in range(num_experts):
            prob_sum[e] += scores[e] / sum(scores)
        z_terms.append(math.log(sum(math.exp(v) for v in logits)) ** 2)
    tokens = len(x)
    aux = num_experts * sum(chosen_count[e] / (tokens * k) * prob_sum[e] / tokens for e in range(num_experts))
    return torch.stack(rows), aux, sum(z_terms) / tokens


@pytest.mark.parametrize(
    "overrides",
    [
        {"moe_top_k": 2},
        {"moe_top_k": 1, "moe_shared_expert": True},
        {"moe_top_k": 3, "router_score": "sigmoid"},
        {"moe_top_k": 2, "activation": "gelu", "moe_intermediate_size": 24},
        {"moe_top_k": 5, "moe_fused_routing": False},
    ],
)
def test_moe_equals_dense_per_token_reference_with_unlimited_capacity(overrides):
    torch.manual_seed(len(str(overrides)))
    moe = MoE(moe_config(moe_capacity_factor=None, **overrides))
    for param in moe.parameters():
        torch.nn.init.normal_(param, std=0.5)
    moe.double()
    x = torch.randn(3, 11, 16, dtype=torch.float64)
    out, aux_loss, z_loss = moe(x)
    expected, expected_aux, expected_z = moe_reference(moe, x.reshape(-1, 16))
    # Routing weights are float32 by contract, hence a float32-sized tolerance on float64 experts.
    torch.testing.assert_close(out.reshape(-1, 16), expected, rtol=1e-5, atol=1e-5)
    assert aux_loss.item() == pytest.approx(expected_aux, rel=1e-5)
    assert z_loss.item() == pytest.approx(expected_z, rel=1e-5)
    assert moe.stats.dropped.item() == 0
    assert moe.stats.tokens_per_expert.sum().item() == 33 * moe.config.moe_top_k


def test_capacity_drops_match_hand_computed_admission():
    """Router logits equal the first three input features, so every choice below is known by hand.

    tokens   logits     choices (first, second)
    t0       [3, 2, 0]  e0, e1
    t1       [3, 0, 2]  e0, e2
    t2       [0, 3, 2]  e1, e2
    t3       [3, 2, 0]  e0, e1
    t4       [0, 2, 3]  e2, e1
    capacity = ceil(0.5 * 5 tokens * 2 / 3 experts) = 2. First choices are admitted in token order
    (t3's e0 overflows), then second choices (t2's e2, t3's e1 and t4's e1 overflow).
    """
    config = moe_config(
        hidden_size=4, num_experts=3, moe_top_k=2, moe_capacity_factor=0.5, moe_intermediate_size=8
    )
    moe = MoE(config).double()
    with torch.no_grad():
        moe.router.weight.copy_(torch.eye(3, 4))
    x = torch.tensor(
        [[3, 2, 0, 0.5], [3, 0, 2, -1], [0, 3, 2, 0.25], [3, 2, 0, 2], [0, 2, 3, -0.5]], dtype=torch.float64
    )
    out, _, _ = moe(x)

    assert moe.stats.tokens_per_expert.tolist() == [2, 2, 2]
    assert moe.stats.dropped.item() == 4 and moe.stats.assignments == 10
    top2 = [math.exp(3) / (math.exp(3) + math.exp(2)), math.exp(2) / (math.exp(3) + math.exp(2))]

    def expert(e, t):
        return expert_reference(moe.experts[e], x[t])

    expected = torch.stack(
        [
            top2[0] * expert(0, 0) + top2[1] * expert(1, 0),
            top2[0] * expert(0, 1) + top2[1] * expert(2, 1),
            top2[0] * expert(1, 2),  # the kept choice keeps its weight: no renormalisation after a drop
            torch.zeros(4, dtype=torch.float64),  # fully dropped: the residual stream passes it through
            top2[0] * expert(2, 4),
        ]
    )
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-7)

    moe.eval()  # moe_eval_capacity_factor is None: nothing is dropped in eval mode
    moe(x)
    assert moe.stats.dropped.item() == 0


def test_gradients_reach_every_expert_that_received_tokens():
    torch.manual_seed(5)
    moe = MoE(moe_config(num_experts=6, moe_top_k=2, moe_capacity_factor=1.0, moe_shared_expert=True))
    x = torch.randn(4, 9, 16)
    x[..., 0] = 1.0
    with torch.no_grad():
        moe.router.weight.normal_()
        moe.router.weight[:, 0] = 0.0
        moe.router.weight[5] = 0.0
        moe.router.weight[5, 0] = -50.0  # expert 5 never wins a choice
    out, aux_loss, z_loss = moe(x)
    (out.square().sum() + aux_loss + z_loss).backward()
    counts = moe.stats.tokens_per_expert.tolist()
    assert counts[5] == 0 and all(c > 0 for c in counts[:5]) and moe.stats.dropped.item() > 0
    for e, expert in enumerate(moe.experts):
        for param in expert.parameters():
            assert param.grad is not None, "an expert without tokens must still be in the graph (DDP)"
            assert (param.grad.abs().sum() > 0) == (counts[e] > 0)
    assert moe.router.weight.grad.abs().sum() > 0
    assert all(p.grad.abs().sum() > 0 for p in moe.shared_expert.parameters())


def test_training_loss_includes_weighted_router_losses_and_trains_the_router():
    torch.manual_seed(6)
    config = model_config("tiny-moe", vocab_size=61, router_aux_loss_coef=0.3, router_z_loss_coef=0.02)
    model = GPT(config)
    tokens = torch.randint(0, 61, (2, 17))
    out = model(tokens[:, :-1], tokens[:, 1:])
    stats = model.router_stats()
    assert [s["layer"] for s in stats] == list(config.moe_layer_indices) == [0, 1]
    torch.testing.assert_close(out.aux_loss, torch.tensor(sum(s["aux_loss"] for s in stats)))
    torch.testing.assert_close(out.z_loss, torch.tensor(sum(s["z_loss"] for s in stats)))
    torch.testing.assert_close(out.loss, out.lm_loss + 0.3 * out.aux_loss + 0.02 * out.z_loss)

    router = model.blocks[0].mlp.router.weight
    total, lm, aux, z = (
        torch.autograd.grad(loss, router, retain_graph=True)[0]
        for loss in (out.loss, out.lm_loss, out.aux_loss, out.z_loss)
    )
    torch.testing.assert_close(total, lm + 0.3 * aux + 0.02 * z)
    assert aux.abs().sum() > 0 and z.abs().sum() > 0


def test_router_stats_are_refreshed_every_forward():
    torch.manual_seed(7)
    model = GPT(model_config("tiny-moe", vocab_size=61, moe_capacity_factor=0.5))
    assert model.router_stats() == []
    model(torch.randint(0, 61, (2, 16)))
    first = model.router_stats()
    model(torch.randint(0, 61, (1, 40)))
    second = model.router_stats()
    for stats, tokens in ((first, 32), (second, 40)):
        for layer in stats:
            assignments = tokens * model.config.moe_top_k
            assert sum(layer["tokens_per_expert"]) + layer["dropped"] == assignments
            assert layer["drop_rate"] == pytest.approx(layer["dropped"] / assignments)
            assert layer["dropped"] > 0, "capacity factor 0.5 cannot hold every assignment"


def test_routing_backend_follows_the_config():
    assert MoE(moe_config(moe_fused_routing=False)).ops is REFERENCE_OPS
    assert MoE(moe_config(moe_fused_routing=True)).ops.name == routing_ops(True).name


def test_fused_routing_matches_the_reference_when_built():
    if routing_ops(True) is REFERENCE_OPS:
        pytest.skip("cuda_ext.moe_routing is not built here")
    torch.manual_seed(8)
    fused = MoE(moe_config(moe_capacity_factor=0.75))
    reference = MoE(moe_config(moe_capacity_factor=0.75, moe_fused_routing=False))
    reference.load_state_dict(fused.state_dict())
    x = torch.randn(2, 13, 16)
    torch.testing.assert_close(fused(x)[0], reference(x)[0])
    assert torch.equal(fused.stats.tokens_per_expert.cpu(), reference.stats.tokens_per_expert.cpu())


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_compiled_moe_model_matches_eager_with_each_routing_backend(device):
    """torch.compile around the model, routing included (fused routing runs eagerly inside the graph)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no GPU")
    torch._dynamo.reset()
    for fused in (False, True):
        torch.manual_seed(9)
        model = GPT(moe_config(moe_fused_routing=fused, num_hidden_layers=2)).to(device)
        compiled = torch.compile(model)
        tokens = torch.randint(0, model.config.vocab_size, (2, 24), device=device)
        results = []
        for forward in (model, compiled):
            model.zero_grad(set_to_none=True)
            out = forward(tokens[:, :-1], tokens[:, 1:])
            out.loss.backward()
            results.append([out.loss.detach(), *(p.grad.clone() for p in model.parameters())])
        for got, want in zip(*results, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
