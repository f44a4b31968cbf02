"""The whole model: loss, checkpointing, generation."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.model import model_config
from pipeline.model.gpt import GPT, GPTOutput, sample_next_token


def test_loss_is_cross_entropy_of_logits_and_unpacks_as_a_pair():
    torch.manual_seed(3)
    model = GPT(model_config("tiny", vocab_size=50))
    tokens = torch.randint(0, 50, (3, 10))
    targets = tokens[:, 1:].clone()
    targets[0, :4] = -100  # ignored positions
    out = model(tokens[:, :-1], targets)
    assert isinstance(out, GPTOutput) and out.aux_loss is None and out.z_loss is None
    logits, loss = out
    log_probs = torch.log_softmax(logits.double(), -1)
    kept = targets != -100
    reference = -log_probs[kept].gather(-1, targets[kept][:, None]).mean()
    torch.testing.assert_close(loss.double(), reference, rtol=1e-5, atol=1e-5)
    assert out.lm_loss is loss
    logits, loss = model(tokens)
    assert loss is None and logits.shape == (3, 10, 50)


@pytest.mark.parametrize(
    ("preset", "overrides"),
    [
        ("tiny", {"dropout": 0.1}),
        (
            "tiny-moe",
            {
                "dropout": 0.1,
                "attention_pattern": "blockwise",
                "attention_block_size": 4,
                "attention_global_tokens": 1,
                "moe_capacity_factor": 1.0,
            },
        ),
    ],
)
def test_activation_checkpointing_gives_the_same_gradients(preset, overrides):
    torch.manual_seed(9)
    tokens = torch.randint(0, 80, (2, 21))
    document_ids = torch.tensor([[0] * 8 + [1] * 12, [5] * 20])
    grads = []
    for recompute in (False, True):
        torch.manual_seed(10)
        model = GPT(model_config(preset, vocab_size=80, activation_checkpointing=recompute, **overrides))
        torch.manual_seed(11)  # the same dropout masks; checkpoint replays the RNG state when recomputing
        out = model(tokens[:, :-1], tokens[:, 1:], document_ids=document_ids)
        out.loss.backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-5, atol=1e-7, msg=name)


def full_sequence_greedy(model: GPT, prompt: torch.Tensor, steps: int) -> torch.Tensor:
    """Greedy decoding without a cache: the whole sequence through the model at every step."""
    tokens = prompt
    for _ in range(steps):
        next_token = model(tokens).logits[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, next_token], dim=1)
    return tokens


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_greedy_generation_with_kv_cache_equals_full_recompute(preset):
    torch.manual_seed(12)
    overrides = {"num_key_value_heads": 2, "attention_pattern": "sliding_window", "attention_window": 6}
    model = GPT(model_config(preset, vocab_size=40, **overrides))
    for param in model.parameters():  # sharper logits than the init, so argmax ties are unlikely
        torch.nn.init.normal_(param, std=0.2)
    prompt = torch.randint(0, 40, (3, 5))
    model.train()
    generated = model.generate(prompt, max_new_tokens=12, temperature=0.0)
    assert model.training, "generate restores the previous mode"
    with torch.no_grad():
        expected = full_sequence_greedy(model.eval(), prompt, 12)
    assert torch.equal(generated, expected)
    assert torch.equal(model.generate(prompt, 12, temperature=1.0, top_k=1), expected)


def test_sampling_follows_temperature_and_top_k():
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]]).expand(20_000, 4)
    draws = sample_next_token(logits, 2.0, None, torch.Generator().manual_seed(0)).squeeze(1)
    frequencies = torch.bincount(draws, minlength=4) / len(draws)
    torch.testing.assert_close(frequencies, torch.softmax(logits[0] / 2.0, -1), rtol=0, atol=0.015)

    draws = sample_next_token(logits, 0.5, 2, torch.Generator().manual_seed(1)).squeeze(1)
    frequencies = torch.bincount(draws, minlength=4) / len(draws)
    expected = torch.tensor([0.0, 1 / (1 + torch.e**2), torch.e**2 / (1 + torch.e**2), 0.0])
    torch.testing.assert_close(frequencies, expected, rtol=0, atol=0.015)
    assert frequencies[0] == 0 and frequencies[3] == 0


def test_sampled_generation_is_reproducible_and_stays_in_top_k():
    torch.manual_seed(13)
    model = GPT(model_config("tiny", vocab_size=30))
    prompt = torch.randint(0, 30, (2, 4))
    first = model.generate(prompt, 8, temperature=0.9, top_k=3, generator=torch.Generator().manual_seed(5))
    again = model.generate(prompt, 8, temperature=0.9, top_k=3, generator=torch.Generator().manual_seed(5))
    assert torch.equal(first, again) and torch.equal(first[:, :4], prompt)
    with torch.no_grad():
        logits = model.eval()(first).logits
    for position in range(4, 12):
        top3 = logits[:, position - 1].topk(3).indices
        assert (top3 == first[:, position, None]).any(dim=1).all()


def test_generate_rejects_bad_arguments():
    model = GPT(model_config("tiny", vocab_size=30, max_position_embeddings=16))
    prompt = torch.randint(0, 30, (1, 10))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model.generate(prompt, 7)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(prompt, 2, temperature=-1.0)
    with pytest.raises(ValueError, match="top_k"):
        model.generate(prompt, 2, top_k=0)
    with pytest.raises(ValueError, match="prompt token"):
        model.generate(prompt[:, :0], 2)


def test_top_p_keeps_the_smallest_set_reaching_p():
    # Probabilities 0.5, 0.3, 0.15, 0.05: p=0.7 keeps the first two (0.5 < 0.7 <= 0.8), p=0.5 only the first.
    probabilities = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probabilities.log()[None].expand(20_000, 4)
    draws = sample_next_token(logits, 1.0, None, torch.Generator().manual_seed(2), top_p=0.7).squeeze(1)
    frequencies = torch.bincount(draws, minlength=4) / len(draws)
    torch.testing.assert_close(frequencies, torch.tensor([0.625, 0.375, 0.0, 0.0]), rtol=0, atol=0.015)
    draws = sample_next_token(logits, 1.0, None, torch.Generator().manual_seed(3), top_p=0.5).squeeze(1)
    assert torch.all(draws == 0)
    with pytest.raises(ValueError, match="top_p"):
        GPT(model_config("tiny", vocab_size=30)).generate(torch.zeros(1, 1, dtype=torch.long), 2, top_p=0.0)


def test_generation_stops_at_the_stop_token_row_by_row():
    """A row that emits the stop token repeats it from then on, and decoding ends once every row has: the
    greedy tokens before the stop equal the unstopped decode's."""
    torch.manual_seed(21)
    model = GPT(model_config("tiny", vocab_size=12))
    for param in model.parameters():
        torch.nn.init.normal_(param, std=0.3)
    prompt = torch.randint(0, 12, (4, 3))
    free = model.generate(prompt, 30, temperature=0)
    new = free[:, 3:]
    # The stop token: the token some row emits first, not at its first step (so that row stops mid-way).
    stop = int(new[0, 1:].mode().values)
    stopped = model.generate(prompt, 30, temperature=0, stop_token=stop)
    for row in range(4):
        hits = (new[row] == stop).nonzero()
        if len(hits) == 0:
            assert torch.equal(stopped[row, 3 : 3 + new.shape[1]], new[row][: stopped.shape[1] - 3])
            continue
        first = int(hits[0])
        assert torch.equal(stopped[row, 3 : 3 + first + 1], new[row, : first + 1])
        assert torch.all(stopped[row, 3 + first :] == stop)
    ended_all = all((new[row] == stop).any() for row in range(4))
    if ended_all:
        last = max(int((new[row] == stop).nonzero()[0]) for row in range(4))
        assert stopped.shape[1] == 3 + last + 1, "decoding ends once every row has stopped"


def test_a_model_without_the_fused_loss_never_imports_torch_dynamo():
    """Evaluate, report and generate load a model and run it; importing torch._dynamo (which the fused loss's
    torch.compiler decorators do) would cost each of those processes 1-2 s for nothing."""
    probe = (
        "import sys, torch\n"
        "from pipeline.model import model_config\n"
        "from pipeline.model.inference import greedy_generate\n"
        "from pipeline.model.gpt import GPT\n"
        "model = GPT(model_config('tiny', vocab_size=50))\n"
        "tokens = torch.randint(0, 50, (2, 8))\n"
        "model(tokens, tokens).loss.backward()\n"
        "greedy_generate(model.eval(), [1, 2, 3], 4)\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=root, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_the_fused_loss_imported_on_first_use_traces_under_torch_compile():
    torch.manual_seed(5)
    model = GPT(model_config("tiny", vocab_size=61, fused_cross_entropy="chunked"))
    tokens = torch.randint(0, 61, (2, 12))
    expected = model(tokens, tokens).loss
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(tokens, tokens).loss, expected, rtol=1e-5, atol=1e-5)
