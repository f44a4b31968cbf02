"""The fused linear + cross-entropy against the plain path: F.cross_entropy((hidden @ weight.T).float()).

Tolerances. float32: the chunked loss and gradients differ from the plain path only in summation order
(chunks of rows, float32 partial sums): rtol 1e-5 / atol 1e-6 element-wise (seen: 2e-7 of the norm).
bfloat16 (and bf16 autocast): both paths round the logits and their gradient to bf16 before the matmuls,
so the loss and the hidden states' gradient come out the same on the CPU; the weight's gradient is rounded
to bf16 once per chunk and summed in float32 where the plain path rounds one matmul, 2.9e-3 of the norm
apart (the plain path's own error against float64 is 2.4e-3, the chunked one's 2.8e-3). Bounds: the loss
1e-3 relative, each gradient 1e-2 of the reference's norm (bf16 keeps 8 significant bits, 2^-8 = 3.9e-3).
On CUDA (never run yet when these were set) 2e-2, and 6e-2 for cce, which sums both gradients in bf16.
"""

import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from pipeline.model import linear_cross_entropy as lce
from pipeline.model import model_config
from pipeline.model.gpt import GPT
from pipeline.model.linear_cross_entropy import linear_cross_entropy, resolve_backend

FP32 = {"rtol": 1e-5, "atol": 1e-6}
BF16_NORM = 1e-2  # relative Frobenius error of a gradient
BF16_LOSS = 1e-3  # relative error of the loss
CUDA_BF16_NORM = 2e-2  # cuBLAS and the Triton kernels pick their own blocking and accumulation order


def plain(hidden, weight, targets):
    """The reference: what GPT.forward computes with fused_cross_entropy off."""
    return F.cross_entropy((hidden @ weight.T).float(), targets, ignore_index=-100)


def problem(rows, hidden_size, vocab, dtype, ignored=0.2, seed=0, device="cpu"):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, hidden_size, generator=generator)
    weight = torch.randn(vocab, hidden_size, generator=generator) / hidden_size**0.5
    targets = torch.randint(0, vocab, (rows,), generator=generator)
    ignore = torch.rand(rows, generator=generator) < ignored
    ignore[0] = ignored == 1.0  # one kept target at least, unless all are to be ignored
    targets[ignore] = -100
    hidden, weight = (t.to(device, dtype).requires_grad_() for t in (hidden, weight))
    return hidden, weight, targets.to(device)


def loss_and_grads(loss_fn, hidden, weight, targets):
    hidden.grad = weight.grad = None
    loss = loss_fn(hidden, weight, targets)
    loss.backward()
    return loss.detach(), hidden.grad.clone(), weight.grad.clone()


def assert_bf16_close(got, want, what):
    """Close in the sense of the module docstring: relative to the reference's norm."""
    error = (got.double() - want.double()).norm() / want.double().norm()
    assert error <= BF16_NORM, f"{what}: relative error {error:.2e} > {BF16_NORM}"


@pytest.mark.parametrize(
    ("rows", "hidden_size", "vocab", "chunk_size"),
    [
        (37, 16, 101, 8),  # rows not a multiple of the chunk, vocabulary not a power of two
        (64, 12, 97, 16),  # rows a multiple of the chunk
        (50, 24, 250, 64),  # one chunk larger than the input
        (1, 8, 3, 1),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_matches_the_plain_loss_and_gradients(rows, hidden_size, vocab, chunk_size, dtype):
    hidden, weight, targets = problem(rows, hidden_size, vocab, dtype, seed=rows)
    want = loss_and_grads(plain, hidden, weight, targets)
    got = loss_and_grads(
        lambda h, w, t: linear_cross_entropy(h, w, t, "chunked", chunk_size), hidden, weight, targets
    )
    assert got[0].dtype == torch.float32
    assert got[1].dtype == got[2].dtype == dtype, "gradients come back in the inputs' dtype"
    if dtype == torch.float32:
        for name, a, b in zip(("loss", "hidden grad", "weight grad"), got, want, strict=True):
            torch.testing.assert_close(a, b, **FP32, msg=name)
    else:
        torch.testing.assert_close(got[0], want[0], rtol=BF16_LOSS, atol=0)
        assert_bf16_close(got[1], want[1], "hidden grad")
        assert_bf16_close(got[2], want[2], "weight grad")


def test_every_target_ignored_gives_the_plain_paths_nan_and_zero_gradients():
    hidden, weight, targets = problem(9, 8, 20, torch.float32, ignored=1.0)
    want = loss_and_grads(plain, hidden, weight, targets)
    got = loss_and_grads(lambda h, w, t: linear_cross_entropy(h, w, t, chunk_size=4), hidden, weight, targets)
    assert want[0].isnan() and got[0].isnan()
    for a, b in zip(got[1:], want[1:], strict=True):
        torch.testing.assert_close(a, b, equal_nan=True)


def test_leading_dimensions_no_grad_and_a_frozen_weight():
    hidden, weight, targets = problem(30, 8, 40, torch.float32)
    want = plain(hidden, weight, targets)
    batched = linear_cross_entropy(hidden.view(5, 6, 8), weight, targets.view(5, 6), chunk_size=7)
    torch.testing.assert_close(batched, want, **FP32)
    with torch.no_grad():  # evaluation: the forward only
        torch.testing.assert_close(linear_cross_entropy(hidden, weight, targets, chunk_size=7), want, **FP32)
    frozen = weight.detach()
    linear_cross_entropy(hidden, frozen, targets, chunk_size=7).backward()
    assert frozen.grad is None and hidden.grad is not None


def test_autocast_casts_like_the_plain_lm_head():
    hidden, weight, targets = problem(45, 16, 70, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = loss_and_grads(plain, hidden, weight, targets)
        got = loss_and_grads(
            lambda h, w, t: linear_cross_entropy(h, w, t, chunk_size=8), hidden, weight, targets
        )
    assert got[1].dtype == got[2].dtype == torch.float32, "the float32 leaves get float32 gradients"
    torch.testing.assert_close(got[0], want[0], rtol=BF16_LOSS, atol=0)
    assert_bf16_close(got[1], want[1], "hidden grad")
    assert_bf16_close(got[2], want[2], "weight grad")


class LargestTensor(TorchDispatchMode):
    """The largest tensor any operator returns while active (forward and backward alike)."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in out if isinstance(out, tuple | list) else (out,):
            if isinstance(value, torch.Tensor):
                self.numel = max(self.numel, value.numel())
        return out


def test_chunked_never_builds_a_tokens_by_vocab_tensor():
    rows, hidden_size, vocab, chunk = 300, 8, 64, 16  # rows x vocab = 19200; chunk x vocab = 1024
    hidden, weight, targets = problem(rows, hidden_size, vocab, torch.float32)
    with LargestTensor() as seen:
        plain(hidden, weight, targets).backward()
    assert seen.numel == rows * vocab, "the check sees the plain path's logits"
    with LargestTensor() as seen:
        linear_cross_entropy(hidden, weight, targets, "chunked", chunk).backward()
    assert seen.numel <= max(chunk * vocab, rows * hidden_size)


@pytest.mark.parametrize(
    ("preset", "overrides"),
    [
        ("tiny", {"tie_word_embeddings": True}),
        ("tiny", {"tie_word_embeddings": False}),
        ("tiny-moe", {"attention_pattern": "sliding_window", "attention_window": 5}),
    ],
)
def test_whole_model_gradients_match_the_plain_path(preset, overrides):
    """The tied matrix gets its embedding and head gradients summed, as on the plain path."""
    torch.manual_seed(4)
    tokens = torch.randint(0, 97, (3, 18))
    targets = tokens[:, 1:].clone()
    targets[0, :5] = -100
    results = []
    for fused in ("off", "chunked"):
        torch.manual_seed(5)
        config = model_config(
            preset, vocab_size=97, fused_cross_entropy=fused, fused_cross_entropy_chunk_size=7, **overrides
        )
        model = GPT(config)
        out = model(tokens[:, :-1], targets)
        assert (out.logits is None) == (fused == "chunked")
        assert (out.loss is out.lm_loss) == (preset == "tiny")
        out.loss.backward()
        results.append((out.loss.detach(), {name: p.grad for name, p in model.named_parameters()}))
    (plain_loss, plain_grads), (fused_loss, fused_grads) = results
    torch.testing.assert_close(fused_loss, plain_loss, **FP32)
    assert fused_grads.keys() == plain_grads.keys()
    for name in plain_grads:
        torch.testing.assert_close(fused_grads[name], plain_grads[name], **FP32, msg=name)


def test_without_targets_the_model_is_unchanged():
    torch.manual_seed(6)
    off = GPT(model_config("tiny", vocab_size=61))
    on = GPT(model_config("tiny", vocab_size=61, fused_cross_entropy="chunked"))
    on.load_state_dict(off.state_dict())
    tokens = torch.randint(0, 61, (2, 12))
    torch.testing.assert_close(on(tokens).logits, off(tokens).logits, rtol=0, atol=0)
    assert torch.equal(
        on.generate(tokens, max_new_tokens=4, temperature=0.0),
        off.generate(tokens, max_new_tokens=4, temperature=0.0),
    )
    with torch.no_grad():  # what the trainer's validation does
        torch.testing.assert_close(on(tokens, tokens).lm_loss, off(tokens, tokens).lm_loss, **FP32)


@pytest.fixture
def without_libraries(monkeypatch):
    """As if neither library were installed (None in sys.modules makes an import fail)."""
    for module in ("liger_kernel", "liger_kernel.transformers.functional", "cut_cross_entropy"):
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setattr(lce, "_AVAILABLE", {})


@pytest.mark.parametrize(
    ("backend", "message"), [("liger", "needs Liger Kernel"), ("cce", "Cut Cross-Entropy")]
)
def test_a_missing_backend_fails_with_a_clear_message(without_libraries, backend, message):
    hidden, weight, targets = problem(6, 8, 10, torch.float32)
    with pytest.raises(ImportError, match=rf"{message}.*pretrain-pipeline\[gpu\]"):
        linear_cross_entropy(hidden, weight, targets, backend)
    model = GPT(model_config("tiny", vocab_size=10, fused_cross_entropy=backend))
    tokens = torch.randint(0, 10, (2, 5))
    with pytest.raises(ImportError, match=message):
        model(tokens[:, :-1], tokens[:, 1:])


def test_a_library_backend_on_the_cpu_fails_and_auto_stays_chunked(monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.functional", types.ModuleType("fake_liger"))
    monkeypatch.setattr(lce, "_AVAILABLE", {})
    hidden, weight, targets = problem(6, 8, 10, torch.float32)
    with pytest.raises(ValueError, match="runs on CUDA only"):
        linear_cross_entropy(hidden, weight, targets, "liger")
    assert lce.backend_available("liger") and resolve_backend("auto", hidden) == "chunked"
    with pytest.raises(ValueError, match="backend must be one of"):
        linear_cross_entropy(hidden, weight, targets, "off")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the library backends are CUDA kernels")
@pytest.mark.parametrize("backend", ["chunked", "liger", "cce", "auto"])
def test_backends_on_cuda_match_the_plain_path(backend):
    """bf16 on one shape (Triton compiles each kernel once), float32 where the backend takes it."""
    if backend in ("liger", "cce") and not lce.backend_available(backend):
        pytest.skip(f"{backend} is not installed (pip install 'pretrain-pipeline[gpu]')")
    # 1 / 2003 = 5e-4 per softmax entry at this near-uniform start: no block of cce's gradient is tiny
    dtypes = [torch.bfloat16] + ([torch.float32] if backend in ("chunked", "liger") else [])
    for dtype in dtypes:
        hidden, weight, targets = problem(4099, 128, 2003, dtype, device="cuda")
        assert resolve_backend(backend, hidden) != "auto"
        want = loss_and_grads(plain, hidden, weight, targets)
        got = loss_and_grads(
            lambda h, w, t: linear_cross_entropy(h, w, t, backend, 1024), hidden, weight, targets
        )
        assert got[1].dtype == got[2].dtype == dtype
        if dtype == torch.float32:  # 1e-3 of the norm leaves room for TF32 matmuls (10-bit mantissa)
            torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=0)
            for a, b in zip(got[1:], want[1:], strict=True):
                assert (a - b).norm() <= 1e-3 * b.norm()
        else:
            torch.testing.assert_close(got[0], want[0], rtol=BF16_LOSS, atol=0)
            # cce sums both gradients across its blocks in bf16 (atomic adds): looser
            bound = 3 * CUDA_BF16_NORM if resolve_backend(backend, hidden) == "cce" else CUDA_BF16_NORM
            for name, a, b in zip(("hidden", "weight"), got[1:], want[1:], strict=True):
                error = (a.double() - b.double()).norm() / b.double().norm()
                assert error <= bound, f"{backend} {name} grad: relative error {error:.2e} > {bound}"
