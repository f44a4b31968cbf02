import torch

from pipeline.model import model_config
from pipeline.model.gpt import GPT, RotaryEmbedding


def test_rope_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    rope = RotaryEmbedding(head_dim=16, max_positions=128, theta=10_000.0)
    q, k = torch.randn(16), torch.randn(16)

    def score(m: int, n: int) -> torch.Tensor:
        rotated_q = rope(q.expand(1, 1, 128, 16))[0, 0, m]
        rotated_k = rope(k.expand(1, 1, 128, 16))[0, 0, n]
        return rotated_q @ rotated_k

    for m, n, shift in [(5, 2, 40), (70, 9, 17), (3, 3, 100)]:
        torch.testing.assert_close(score(m, n), score(m + shift, n + shift), rtol=1e-4, atol=1e-4)


def test_rope_matches_complex_multiplication_reference():
    torch.manual_seed(1)
    rope = RotaryEmbedding(head_dim=8, max_positions=32, theta=500.0)
    x = torch.randn(2, 3, 32, 8, dtype=torch.float32)
    half = 4
    freqs = 1.0 / (500.0 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8))
    angles = torch.outer(torch.arange(32, dtype=torch.float64), freqs)
    as_complex = torch.complex(x[..., :half].double(), x[..., half:].double()) * torch.polar(
        torch.ones_like(angles), angles
    )
    expected = torch.cat([as_complex.real, as_complex.imag], dim=-1).float()
    torch.testing.assert_close(rope(x), expected, rtol=1e-5, atol=1e-5)


def test_future_tokens_never_change_past_logits():
    torch.manual_seed(2)
    model = GPT(model_config("tiny", vocab_size=97)).eval()
    tokens = torch.randint(0, 97, (2, 24))
    changed = tokens.clone()
    changed[:, 12:] = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        before, _ = model(tokens)
        after, _ = model(changed)
    torch.testing.assert_close(before[:, :12], after[:, :12])
    assert not torch.allclose(before[:, 12:], after[:, 12:])


def test_loss_is_cross_entropy_of_logits():
    torch.manual_seed(3)
    model = GPT(model_config("tiny", vocab_size=50))
    tokens = torch.randint(0, 50, (3, 10))
    logits, loss = model(tokens[:, :-1], tokens[:, 1:])
    reference = -torch.log_softmax(logits.double(), -1).gather(-1, tokens[:, 1:, None]).mean()
    torch.testing.assert_close(loss.double(), reference, rtol=1e-5, atol=1e-5)
