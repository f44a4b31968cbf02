"""The trainer's components on their own: checkpoints, LR schedule, mixed precision, metrics, quantisation."""

from __future__ import annotations

import hashlib
import logging
import math
import pickle
import random
import signal

import numpy as np
import pytest
import torch

from pipeline.model.checkpoint import Checkpointer, CheckpointError
from pipeline.train.components.amp import MixedPrecision
from pipeline.train.components.checkpoint_manager import (
    CheckpointManager,
    PerRankState,
    RNGState,
    rng_state,
    set_rng_state,
)
from pipeline.train.components.lr_schedule import build_lr_scheduler
from pipeline.train.components.metrics import Throughput, router_metrics
from pipeline.train.config import TrainConfig
from pipeline.train.distributed.compression import dequantize, quantize
from pipeline.train.distributed.process_groups import DistributedContext
from pipeline.train.fault_injection import Fault


def random_state(rng: np.random.Generator) -> dict:
    return {
        "model": {f"w{i}": torch.from_numpy(rng.standard_normal((3, 5))) for i in range(3)},
        "step": int(rng.integers(1000)),
    }


# --- checkpoints --------------------------------------------------------------------------------------


def test_checkpoints_keep_the_newest_k_with_checksums(tmp_path):
    rng = np.random.default_rng(1)
    checkpointer = Checkpointer(tmp_path / "ckpt", keep_last=2)
    saved = {}
    for step in (3, 6, 9, 12):
        saved[step] = random_state(rng)
        checkpointer.save(step, saved[step])

    assert checkpointer.steps() == [9, 12]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "step-000009.pt",
        "step-000009.pt.sha256",
        "step-000012.pt",
        "step-000012.pt.sha256",
    ]
    step, state = checkpointer.load_latest()
    assert step == 12 and state["step"] == saved[12]["step"]
    for name, tensor in saved[12]["model"].items():
        assert torch.equal(state["model"][name], tensor)
    # The checksum file is in sha256sum's format, so `sha256sum -c` verifies it too.
    digest = hashlib.sha256(checkpointer.path_for(12).read_bytes()).hexdigest()
    assert (tmp_path / "ckpt" / "step-000012.pt.sha256").read_text() == f"{digest}  step-000012.pt\n"


def test_corrupt_or_unsafe_newest_checkpoint_falls_back_with_a_warning(tmp_path, caplog):
    rng = np.random.default_rng(2)
    checkpointer = Checkpointer(tmp_path, keep_last=5)
    for step in (1, 2, 3):
        checkpointer.save(step, random_state(rng))
    # Step 3: truncated. Step 2: a pickle of an arbitrary object with a matching checksum, which
    # weights_only=True must refuse to load.
    checkpointer.path_for(3).write_bytes(checkpointer.path_for(3).read_bytes()[:100])
    unsafe = pickle.dumps({"format": 1, "payload": logging.getLogger("x")}, protocol=2)
    checkpointer.path_for(2).write_bytes(unsafe)
    digest = hashlib.sha256(unsafe).hexdigest()
    (tmp_path / "step-000002.pt.sha256").write_text(f"{digest}  step-000002.pt\n")

    with caplog.at_level(logging.WARNING):
        step, _ = checkpointer.load_latest()
    assert step == 1
    assert "step-000003.pt does not match its checksum" in caplog.text
    assert "cannot be loaded with weights_only=True" in caplog.text

    checkpointer.path_for(1).unlink()
    with pytest.raises(CheckpointError, match="none of the 2 checkpoint"):
        checkpointer.load_latest()


def test_interrupted_save_leaves_no_visible_checkpoint_and_is_cleaned_up(tmp_path):
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save(4, random_state(np.random.default_rng(3)))
    # What a save killed before its renames leaves behind, and a checksum whose checkpoint never arrived.
    (tmp_path / ".step-000008.pt.tmp-123").write_bytes(b"partial")
    (tmp_path / ".step-000008.pt.sha256.tmp-123").write_bytes(b"partial")
    (tmp_path / "step-000008.pt.sha256").write_text("0" * 64 + "  step-000008.pt\n")
    assert checkpointer.steps() == [4]
    checkpointer.remove_partial_saves()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000004.pt", "step-000004.pt.sha256"]


def test_rng_states_round_trip_through_a_weights_only_checkpoint(tmp_path):
    torch.manual_seed(5)
    np.random.seed(5)
    random.seed(5)
    Checkpointer(tmp_path).save(1, {"rng": rng_state(torch.device("cpu"))})
    expected = (torch.rand(4), np.random.rand(4), [random.random() for _ in range(4)])
    torch.manual_seed(99)
    np.random.seed(99)
    random.seed(99)

    set_rng_state(Checkpointer(tmp_path).load(1)["rng"], torch.device("cpu"))
    assert torch.equal(torch.rand(4), expected[0])
    assert np.array_equal(np.random.rand(4), expected[1])
    assert [random.random() for _ in range(4)] == expected[2]


class Counter:
    """A toy checkpoint part that records the order in which parts are restored."""

    def __init__(self, value: int, restored: list[str], name: str) -> None:
        self.value, self.restored, self.name = value, restored, name

    def state_dict(self) -> dict:
        return {"value": torch.tensor(self.value)}

    def load_state_dict(self, state: dict) -> None:
        self.value = int(state["value"])
        self.restored.append(self.name)


def one_process() -> DistributedContext:
    return DistributedContext(0, 1, 0, torch.device("cpu"), "gloo", None, False)


def test_checkpoint_manager_saves_each_registered_part_under_its_name_and_restores_it_in_order(tmp_path):
    restored: list[str] = []
    model = torch.nn.Linear(3, 2)
    parts = {"model": model, "b": Counter(7, restored, "b"), "a": Counter(3, restored, "a")}
    manager = CheckpointManager(tmp_path, parts, is_main=True, metadata={"model_config": {"width": 3}})
    path = manager.save(5)

    saved = Checkpointer(tmp_path).load(5)
    assert path == Checkpointer(tmp_path).path_for(5)
    assert saved["model_config"] == {"width": 3} and int(saved["b"]["value"]) == 7
    assert set(saved) == {"format", "model_config", "model", "b", "a"}

    fresh = torch.nn.Linear(3, 2)
    again = {"model": fresh, "b": Counter(0, restored, "b"), "a": Counter(0, restored, "a")}
    CheckpointManager(tmp_path, again, is_main=True).load(saved)
    assert restored == ["b", "a"]  # registration order: a part may rely on the ones before it
    assert (again["b"].value, again["a"].value) == (7, 3)
    assert torch.equal(fresh.weight, model.weight) and torch.equal(fresh.bias, model.bias)


def test_checkpoint_manager_refuses_parts_without_state_and_checkpoints_missing_a_part(tmp_path):
    with pytest.raises(TypeError, match=r"'step'.*state_dict"):
        CheckpointManager(tmp_path, {"step": 3}, is_main=True)
    with pytest.raises(ValueError, match="clash"):
        CheckpointManager(tmp_path, {"a": Counter(1, [], "a")}, is_main=True, metadata={"a": 1})
    manager = CheckpointManager(tmp_path, {"a": Counter(1, [], "a"), "b": Counter(2, [], "b")}, is_main=True)
    with pytest.raises(CheckpointError, match="no state for b"):
        manager.load({"a": {"value": torch.tensor(1)}})


def test_checkpoint_manager_writes_only_on_the_main_rank_but_asks_every_part(tmp_path):
    asked = []

    class Collective(Counter):
        def state_dict(self) -> dict:
            asked.append(self.name)  # e.g. ZeRO-1's consolidation, which every rank must join
            return super().state_dict()

    manager = CheckpointManager(tmp_path, {"optimizer": Collective(1, [], "optimizer")}, is_main=False)
    assert manager.save(2) == Checkpointer(tmp_path).path_for(2)
    assert asked == ["optimizer"] and Checkpointer(tmp_path).steps() == []


def test_per_rank_state_gives_each_rank_its_own_entry_or_defers_to_the_caller_on_another_world_size():
    restored: list[str] = []
    single = PerRankState(
        one_process(), {"rng": Counter(4, restored, "rng")}, on_other_world_size=pytest.fail
    )
    assert single.state_dict() == {"ranks": [{"rng": {"value": torch.tensor(4)}}]}

    second_of_two = DistributedContext(1, 2, 0, torch.device("cpu"), "gloo", None, False)
    part = Counter(0, restored, "rng")
    PerRankState(second_of_two, {"rng": part}, on_other_world_size=pytest.fail).load_state_dict(
        {"ranks": [{"rng": {"value": torch.tensor(10)}}, {"rng": {"value": torch.tensor(11)}}]}
    )
    assert part.value == 11

    resharded: list[int] = []
    part = Counter(0, restored, "rng")
    PerRankState(second_of_two, {"rng": part}, on_other_world_size=resharded.append).load_state_dict(
        single.state_dict()
    )
    assert resharded == [1] and part.value == 0

    # A part the checkpoint has no entry for (compression switched on since) keeps its fresh state.
    added = Counter(5, restored, "compression")
    PerRankState(one_process(), {"compression": added}, on_other_world_size=pytest.fail).load_state_dict(
        single.state_dict()
    )
    assert added.value == 5


def test_rng_state_part_round_trips_through_the_checkpoint_manager(tmp_path):
    torch.manual_seed(8)
    manager = CheckpointManager(tmp_path, {"rng": RNGState(torch.device("cpu"))}, is_main=True)
    manager.save(1)
    expected = torch.rand(3)
    torch.manual_seed(0)
    manager.load(Checkpointer(tmp_path).load(1))
    assert torch.equal(torch.rand(3), expected)


# --- learning rate ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_warmup_cosine_matches_its_formula(seed):
    rng = np.random.default_rng(seed)
    steps = int(rng.integers(20, 200))
    warmup = int(rng.integers(0, steps // 2))
    lr, ratio = float(rng.uniform(1e-4, 1e-2)), float(rng.uniform(0, 0.5))
    train = TrainConfig(steps=steps, warmup_steps=warmup, lr=lr, min_lr_ratio=ratio)
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = build_lr_scheduler(optimizer, train)
    seen = []
    for _ in range(steps):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()

    # Independent: linear ramp to lr over `warmup` steps, then lr_min + (lr - lr_min)(1 + cos(pi t)) / 2.
    lr_min = lr * ratio
    for step, value in enumerate(seen):
        if step < warmup:
            expected = lr * (step + 1) / warmup
        else:
            t = (step - warmup) / max(1, steps - warmup)
            expected = lr_min + (lr - lr_min) * (1 + math.cos(math.pi * t)) / 2
        assert value == pytest.approx(expected, rel=1e-12)
    assert seen[warmup] == pytest.approx(lr)


# --- mixed precision ----------------------------------------------------------------------------------


def model_and_optimizer(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def test_fp16_scaler_skips_a_step_with_an_injected_inf_and_counts_it():
    model, optimizer = model_and_optimizer(0)
    precision = MixedPrecision("fp16", torch.device("cpu"))
    inputs = torch.randn(32, 8)

    def backward(poison: bool) -> None:
        optimizer.zero_grad()
        with precision.autocast():
            loss = model(inputs).float().pow(2).mean()
        precision.backward(loss)
        if poison:
            model[0].weight.grad[0, 0] = math.inf

    backward(poison=False)
    scale = precision.loss_scale
    precision.step(optimizer, model.parameters(), max_norm=1.0)
    assert precision.skipped_steps == 0

    before = [p.detach().clone() for p in model.parameters()]
    backward(poison=True)
    norm = precision.step(optimizer, model.parameters(), max_norm=1.0)
    assert not math.isfinite(norm)
    assert precision.skipped_steps == 1
    assert precision.loss_scale == scale / 2  # GradScaler's backoff
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))

    backward(poison=False)
    precision.step(optimizer, model.parameters(), max_norm=1.0)
    assert precision.skipped_steps == 1
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize("precision_name", ["fp32", "bf16"])
def test_non_finite_gradient_skips_the_step_without_a_scaler(precision_name):
    model, optimizer = model_and_optimizer(1)
    precision = MixedPrecision(precision_name, torch.device("cpu"))
    with precision.autocast():
        loss = model(torch.randn(16, 8)).float().mean()
    precision.backward(loss)
    model[2].bias.grad[1] = math.nan
    before = [p.detach().clone() for p in model.parameters()]
    precision.step(optimizer, model.parameters(), max_norm=1.0)
    assert precision.skipped_steps == 1 and precision.loss_scale is None
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_clipping_bounds_the_global_norm_and_reports_it_unclipped():
    model, optimizer = model_and_optimizer(2)
    precision = MixedPrecision("fp32", torch.device("cpu"))
    precision.backward(model(torch.randn(16, 8) * 100).pow(2).mean())
    grads = [p.grad.clone() for p in model.parameters()]
    expected = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
    norm = precision.step(optimizer, model.parameters(), max_norm=0.5)
    assert float(norm) == pytest.approx(float(expected), rel=1e-5)
    clipped = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters()))
    assert float(clipped) == pytest.approx(0.5, rel=1e-4)


# --- metrics ------------------------------------------------------------------------------------------


def test_mfu_is_model_flops_over_peak():
    throughput = Throughput(flops_per_token=6e6, peak_flops_total=2e12)
    throughput.add_step(4096)
    throughput.add_step(4096)
    figures = throughput.collect()
    assert figures["tokens"] == 8192
    assert figures["mfu"] == pytest.approx(6e6 * figures["tokens_per_s"] / 2e12, rel=1e-3)
    assert throughput.collect()["tokens"] == 0  # counts restart at each collect


def test_router_metrics_report_expert_load_and_drops():
    class Routed:
        def router_stats(self):
            return [
                {
                    "layer": 0,
                    "tokens_per_expert": [30, 10],
                    "drop_rate": 0.25,
                    "aux_loss": 1.5,
                    "z_loss": 0.1,
                },
                {"layer": 1, "tokens_per_expert": [20, 20], "drop_rate": 0.0, "aux_loss": 1.0, "z_loss": 0.2},
            ]

    figures = router_metrics(Routed())
    assert figures["moe/layer0/expert0_load"] == 0.75 and figures["moe/layer1/expert1_load"] == 0.5
    assert figures["moe/layer0/drop_rate"] == 0.25 and figures["moe/drop_rate"] == 0.125
    assert figures["moe/load_imbalance"] == 1.5  # 30 / mean(20)


# --- int8 quantisation and fault specs ----------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_int8_quantisation_error_is_at_most_half_a_step(seed):
    rng = np.random.default_rng(seed)
    values = torch.from_numpy(rng.standard_normal(int(rng.integers(1, 5000))) * rng.uniform(1e-4, 10)).float()
    quantized, scale = quantize(values)
    assert quantized.dtype == torch.int8 and int(quantized.abs().max()) == 127
    assert float(scale) == pytest.approx(float(values.abs().max()) / 127, rel=1e-6)
    assert float((dequantize(quantized, scale) - values).abs().max()) <= float(scale) / 2 * (1 + 1e-5)


def test_fault_spec_parsing():
    assert Fault.parse("SIGKILL@7:rank=1") == Fault(signal.SIGKILL, 7, 1, "self")
    assert Fault.parse("SIGTERM@5:rank=0:to=launcher").to == "launcher"
    with pytest.raises(ValueError, match="expected <SIGNAL>@<step>"):
        Fault.parse("KILL@x")


def test_fused_adamw_skips_on_the_device_and_otherwise_matches_the_host_decision():
    """The sync-free path (fused AdamW, as on CUDA; the fused kernel exists on CPU too) against the plain one:
    same parameters after finite steps, nothing changed (moments and step counts included) by a NaN step."""
    fused_model, _ = model_and_optimizer(2)
    plain_model, _ = model_and_optimizer(2)
    fused = torch.optim.AdamW(fused_model.parameters(), lr=1e-2, fused=True)
    plain = torch.optim.AdamW(plain_model.parameters(), lr=1e-2)
    fused_precision = MixedPrecision("fp32", torch.device("cpu"))
    plain_precision = MixedPrecision("fp32", torch.device("cpu"))
    generator = torch.Generator().manual_seed(3)
    for step, poison in enumerate([False, True, False, True, True, False]):
        inputs = torch.randn(16, 8, generator=generator)
        for model, optimizer, precision in (
            (fused_model, fused, fused_precision),
            (plain_model, plain, plain_precision),
        ):
            optimizer.zero_grad()
            model(inputs).pow(2).mean().backward()
            if poison:
                model[0].weight.grad[step % 8, 0] = math.inf if step % 2 else math.nan
            before = {k: v.clone() for k, v in optimizer.state_dict()["state"][0].items()} if step else None
            precision.step(optimizer, model.parameters(), max_norm=0.5)
            if poison:
                after = optimizer.state_dict()["state"][0]
                assert all(torch.equal(before[k], after[k]) for k in before)
        for a, b in zip(fused_model.parameters(), plain_model.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert fused_precision._skipped_on_device is not None  # the device path was the one taken
    assert fused_precision.skipped_steps == plain_precision.skipped_steps == 3
    assert fused_precision.state_dict()["skipped_steps"] == 3
