"""Muon (``train.optimizer=muon``): its update against a hand-written Newton-Schulz reference, which parameters
it takes, one optimizer for the scheduler, loss scaler and checkpoint, and bad settings refused by name."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from pipeline.core.config import ConfigError
from pipeline.model.config import GPTConfig
from pipeline.model.gpt import GPT
from pipeline.train.components.amp import MixedPrecision
from pipeline.train.components.lr_schedule import build_lr_scheduler
from pipeline.train.components.optimizer import MuonWithAdamW, build_optimizer, muon_split
from pipeline.train.config import TrainConfig
from pipeline.train.launcher.runs import identity_differences, resume_identity
from tests.conftest import make_config

MUON = TrainConfig(optimizer="muon", steps=6, warmup_steps=2, muon_lr=0.05, muon_weight_decay=0.1)
SMALL = GPTConfig(
    vocab_size=50,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=48,
    max_position_embeddings=16,
)


def reference_orthogonalise(update: np.ndarray, steps: int = 5) -> np.ndarray:
    """Keller Jordan's quintic Newton-Schulz iteration, in float64, on the wide orientation."""
    a, b, c = 3.4445, -4.7750, 2.0315
    tall = update.shape[0] > update.shape[1]
    x = update.T if tall else update
    x = x / max(np.linalg.norm(x), 1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


@pytest.mark.parametrize("shape", [(24, 40), (40, 24)])
def test_muon_update_is_the_orthogonalised_nesterov_momentum_of_a_hand_written_reference(shape):
    rng = np.random.default_rng(sum(shape))
    lr, momentum, decay = 0.05, 0.9, 0.1
    weight = torch.nn.Parameter(torch.from_numpy(rng.standard_normal(shape)).float())
    optimizer = MuonWithAdamW(
        [{"params": [weight], "muon": True, "lr": lr, "momentum": momentum, "weight_decay": decay}]
    )
    buffer = np.zeros(shape)
    scale = math.sqrt(max(1.0, shape[0] / shape[1]))  # "original": taller matrices take larger steps
    for _ in range(3):
        grad = rng.standard_normal(shape) * rng.uniform(0.1, 3)
        before = weight.detach().double().numpy().copy()
        weight.grad = torch.from_numpy(grad).float()
        optimizer.step()
        buffer = momentum * buffer + grad
        orthogonal = reference_orthogonalise(grad + momentum * buffer)
        # The iteration pushes every singular value into about (0.5, 1.5): an update of even strength in all
        # directions, whatever the gradient's spectrum was.
        singular = np.linalg.svd(orthogonal, compute_uv=False)
        assert singular.min() > 0.5 and singular.max() < 1.5
        expected = before * (1 - lr * decay) - lr * scale * orthogonal - before
        step = weight.detach().double().numpy() - before
        # torch iterates in bfloat16 (8 bits of mantissa); without momentum (or Nesterov's look-ahead) the
        # update differs by far more than this.
        # Measured: 1.1-1.5% (Frobenius, relative).
        assert np.linalg.norm(step - expected) < 0.03 * np.linalg.norm(expected)


def test_muon_takes_the_blocks_matrices_and_adamw_the_embedding_head_and_norms():
    for tied in (True, False):
        model = GPT(GPTConfig(**{**SMALL.__dict__, "tie_word_embeddings": tied}))
        hidden, rest = muon_split(model)
        names = dict(model.named_parameters())
        expected_hidden = sorted(
            f"blocks.{i}.{part}.weight"
            for i in range(2)
            for part in ("attn.q_proj", "attn.kv_proj", "attn.o_proj", "mlp.up_proj", "mlp.down_proj")
        )
        assert sorted(hidden) == expected_hidden
        assert "embed_tokens.weight" in rest and ("lm_head.weight" in rest) == (not tied)
        assert all(names[n].dim() == 1 for n in rest if n not in ("embed_tokens.weight", "lm_head.weight"))
        assert set(hidden) | set(rest) == set(names) and not set(hidden) & set(rest)
        # A pipeline rank's optimizer sees its stages in a ModuleList: the same split under prefixed names.
        staged, _ = muon_split(torch.nn.ModuleList([model]))
        assert staged == [f"0.{name}" for name in hidden]

    optimizer = build_optimizer(model, MUON, torch.device("cpu"))
    groups = optimizer.param_groups
    assert [g["muon"] for g in groups] == [False, False, True]
    assert groups[0]["lr"] == MUON.lr and groups[2]["lr"] == MUON.muon_lr
    assert groups[2]["momentum"] == MUON.muon_momentum and groups[2]["weight_decay"] == 0.1
    assert {id(p) for p in groups[2]["params"]} == {id(names[n]) for n in hidden}


def copies(seed: int) -> tuple[GPT, GPT]:
    torch.manual_seed(seed)
    model = GPT(SMALL)
    twin = GPT(SMALL)
    twin.load_state_dict(model.state_dict())
    return model, twin


def train_steps(model: GPT, optimizer, scheduler, precision: MixedPrecision, steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        tokens = torch.randint(0, SMALL.vocab_size, (4, 9), generator=generator)
        optimizer.zero_grad(set_to_none=True)
        with precision.autocast():
            loss = model(tokens[:, :-1], tokens[:, 1:]).loss
        precision.backward(loss)
        precision.step(optimizer, model.parameters(), max_norm=1.0)
        scheduler.step()


def test_one_optimizer_steps_like_torchs_muon_and_adamw_side_by_side_under_the_lr_schedule():
    model, twin = copies(0)
    optimizer = build_optimizer(model, MUON, torch.device("cpu"))
    scheduler = build_lr_scheduler(optimizer, MUON)
    hidden, _ = muon_split(twin)
    names = dict(twin.named_parameters())
    separate = [
        torch.optim.AdamW(
            [
                {
                    "params": [p for n, p in names.items() if n not in hidden and p.dim() == 2],
                    "weight_decay": 0.1,
                },
                {"params": [p for n, p in names.items() if p.dim() == 1], "weight_decay": 0.0},
            ],
            lr=MUON.lr,
            betas=MUON.betas,
        ),
        torch.optim.Muon([names[n] for n in hidden], lr=MUON.muon_lr, weight_decay=0.1),
    ]
    schedulers = [build_lr_scheduler(o, MUON) for o in separate]
    precision = MixedPrecision("fp32", torch.device("cpu"))
    generator = torch.Generator().manual_seed(1)
    for _ in range(4):
        tokens = torch.randint(0, SMALL.vocab_size, (4, 9), generator=generator)
        for m in (model, twin):
            m.zero_grad(set_to_none=True)
            m(tokens[:, :-1], tokens[:, 1:]).loss.backward()
        precision.step(optimizer, model.parameters(), max_norm=0.0)
        scheduler.step()
        for o, s in zip(separate, schedulers, strict=True):
            o.step()
            s.step()
    assert scheduler.get_last_lr()[0] == schedulers[0].get_last_lr()[0]
    assert scheduler.get_last_lr()[2] == schedulers[1].get_last_lr()[0]
    for (name, a), b in zip(model.named_parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_fp16_loss_scaling_and_a_state_dict_round_trip_continue_bit_for_bit():
    model, twin = copies(2)
    precision, precision_twin = (MixedPrecision("fp16", torch.device("cpu")) for _ in range(2))
    optimizer = build_optimizer(model, MUON, torch.device("cpu"))
    scheduler = build_lr_scheduler(optimizer, MUON)
    train_steps(model, optimizer, scheduler, precision, 2, seed=3)

    # The checkpoint's way: the state through torch.save / weights_only load into a fresh optimizer.
    twin.load_state_dict(model.state_dict())
    saved = {
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "precision": precision.state_dict(),
    }
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    resumed = build_optimizer(twin, MUON, torch.device("cpu"))
    resumed_scheduler = build_lr_scheduler(resumed, MUON)
    resumed.load_state_dict(loaded["optimizer"])
    resumed_scheduler.load_state_dict(loaded["scheduler"])
    precision_twin.load_state_dict(loaded["precision"])
    momentum = [resumed.state[p]["momentum_buffer"] for p in resumed.param_groups[2]["params"]]
    assert all(m.abs().sum() > 0 for m in momentum)  # Muon's state came back, not a fresh zero buffer

    train_steps(model, optimizer, scheduler, precision, 3, seed=4)
    train_steps(twin, resumed, resumed_scheduler, precision_twin, 3, seed=4)
    for (name, a), b in zip(model.named_parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b), name

    # An inf gradient skips the whole step, Muon's part too (GradScaler unscaled every group).
    before = [p.detach().clone() for p in model.parameters()]
    buffers = [b.clone() for b in momentum]
    optimizer.zero_grad()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    model.blocks[0].attn.q_proj.weight.grad[0, 0] = math.inf
    precision.step(optimizer, model.parameters(), max_norm=1.0)
    assert precision.skipped_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(buffers, momentum, strict=True))


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("train.muon_momentum=1.0", "train.muon_momentum"),
        ("train.muon_lr=0", "train.muon_lr"),
        ("train.optimizer=lion", "train.optimizer"),
        ("train.muon_adjust_lr=spectral", "train.muon_adjust_lr"),
    ],
)
def test_bad_muon_settings_are_refused_naming_the_key(tmp_path, override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        make_config(tmp_path, "train.optimizer=muon", override)


def test_muon_settings_tell_muon_runs_apart_and_leave_adamw_runs_resumable(tmp_path):
    adamw = resume_identity(make_config(tmp_path))
    assert not any("muon" in key or key == "train.optimizer" for key in adamw)  # as recorded before Muon
    assert resume_identity(make_config(tmp_path, "train.muon_lr=0.05")) == adamw  # no effect on AdamW
    muon = resume_identity(make_config(tmp_path, "train.optimizer=muon"))
    other = resume_identity(make_config(tmp_path, "train.optimizer=muon", "train.muon_lr=0.05"))
    assert identity_differences(muon, other) == ["train.muon_lr: checkpoint 0.02, this run 0.05"]
    assert "train.optimizer: checkpoint None, this run 'muon'" in identity_differences(adamw, muon)
