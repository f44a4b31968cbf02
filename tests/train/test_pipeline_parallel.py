"""Pipeline parallelism (issue 18): the split rule, the settings that fail before any work, and, under torchrun
on CPU (gloo), one step's loss and gradients against one process, the schedules against each other, the tied
embedding, MoE router losses, stage-sharded checkpoints with an exact resume, and two agents.

Every multi-process run goes through ``support.finish``, which kills the process tree past its guard: gloo
point-to-point in pipelining has hung before (pytorch issue 132644), and a hang must fail, not block.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from pipeline.config import load_config
from pipeline.core.config import ConfigError
from pipeline.core.storage import DatasetRef
from pipeline.model import model_config
from pipeline.model.checkpoint import Checkpointer, CheckpointError, checkpoint_layout_problem, shard_folder
from pipeline.model.gpt import GPT
from pipeline.train.distributed.pipeline_parallel import (
    balanced_split,
    full_name,
    model_part,
    theoretical_bubble,
)
from pipeline.train.trainer import train
from tests.train.support import (
    finish,
    free_port,
    losses,
    single_process,
    start,
    torchrun,
    train_config,
    unfinished_run,
    write_config,
    write_token_corpus,
)

SNAPSHOT = "pp"
REPO = Path(__file__).resolve().parents[2]
LAYERS = "model.overrides={num_hidden_layers: 4}"
PIPELINE = ("train.pp_degree=2", "train.pp_microbatches=4", "train.batch_size=8")
SCHEDULES = {
    "gpipe": ["train.pp_schedule=gpipe"],
    "1f1b": ["train.pp_schedule=1f1b"],
    "interleaved": ["train.pp_schedule=interleaved_1f1b", "train.pp_virtual_stages=2"],
}
# Large router-loss weights, so a router loss lost between stages would show in every router's gradient.
MOE = (
    "model.preset=tiny-moe",
    "model.overrides={num_hidden_layers: 4, moe_every_n_layers: 2, router_aux_loss_coef: 1.0, "
    "router_z_loss_coef: 0.1}",
)
GUARD_S = 420  # against a hang, not a speed check


# --- the split rule ----------------------------------------------------------------------------------


def test_uneven_layer_counts_give_the_surplus_to_the_earlier_stages():
    config = model_config("tiny", num_hidden_layers=7)
    split = balanced_split(config, 2, seq_len=64)
    assert split.layers == ((0, 4), (4, 7))  # the last stage also carries the head
    assert balanced_split(model_config("tiny", num_hidden_layers=5), 4, 64).layers == (
        (0, 2),
        (2, 3),
        (3, 4),
        (4, 5),
    )
    # Costs add up to the model's FLOPs per token; the slowest stage is as cheap as any split allows.
    assert sum(split.flops_per_token) == pytest.approx(config.flops_per_token(64))
    block = config.layer_flops_per_token(0, 64)
    head = config.head_flops_per_token()
    assert max(split.flops_per_token) == pytest.approx(max(4 * block, 3 * block + head))
    assert "stage 0: layers 0-3 + embedding" in split.describe()
    assert "stage 1: layers 4-6 + norm, head, loss" in split.describe()


def test_split_balances_flops_not_layer_counts():
    # A head as costly as two blocks pushes two blocks off the last stage.
    config = model_config("tiny", num_hidden_layers=6, vocab_size=3266)
    assert config.head_flops_per_token() == pytest.approx(2 * config.layer_flops_per_token(0, 64))
    assert balanced_split(config, 2, 64).layers == ((0, 4), (4, 6))
    # An MoE block (top-2 of 4 experts) costs more than a dense one, so the stage holding it takes fewer.
    dense = model_config("tiny", num_hidden_layers=3, vocab_size=64)
    assert balanced_split(dense, 2, 64).layers == ((0, 2), (2, 3))
    moe = dense.with_overrides(num_experts=4, moe_top_k=2, moe_layers=(0,))
    assert moe.layer_flops_per_token(0, 64) > 1.5 * moe.layer_flops_per_token(1, 64)
    assert balanced_split(moe, 2, 64).layers == ((0, 1), (1, 3))


def test_stages_together_hold_the_unsplit_model_under_its_names():
    torch.manual_seed(0)
    model = GPT(model_config("tiny", num_hidden_layers=5, vocab_size=64))
    split = balanced_split(model.config, 3, 64)
    merged = {}
    for stage in range(3):
        part = model_part(model, split, stage)
        assert (part.embed_tokens is None) == (stage > 0)
        assert (part.lm_head is None) == (stage < 2)
        first = split.layers[stage][0]
        merged.update({full_name(name, first): tensor for name, tensor in part.state_dict().items()})
    expected = model.state_dict()
    assert merged.keys() == expected.keys()
    assert all(torch.equal(merged[name], expected[name]) for name in expected)


def test_theoretical_bubble():
    assert theoretical_bubble(2, 8) == pytest.approx(1 / 9)
    assert theoretical_bubble(4, 4) == pytest.approx(3 / 7)
    assert theoretical_bubble(2, 8, virtual_stages=2) == pytest.approx(1 / 17)


# --- bad settings fail before any work -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (("train.pp_degree=2", "model.overrides={num_hidden_layers: 1}"), "model.num_hidden_layers"),
        (
            (
                "train.pp_degree=2",
                "train.pp_virtual_stages=2",
                "train.pp_schedule=interleaved_1f1b",
            ),
            "model.num_hidden_layers",
        ),
        (("train.pp_degree=2", "train.pp_microbatches=1"), "train.pp_microbatches=1: 1f1b"),
        (
            (
                LAYERS,
                "train.pp_degree=2",
                "train.pp_microbatches=3",
                "train.pp_virtual_stages=2",
                "train.pp_schedule=interleaved_1f1b",
                "train.batch_size=6",
            ),
            "train.pp_microbatches=3: interleaved_1f1b needs a multiple of train.pp_degree=2",
        ),
        (("train.pp_degree=2", "train.pp_microbatches=3"), "train.batch_size=8 does not split"),
        (("train.pp_degree=2", "train.nproc_per_node=3"), "does not divide the 3 ranks"),
        (("train.pp_degree=2", "train.pp_schedule=interleaved_1f1b"), "train.pp_virtual_stages"),
        (("train.pp_degree=2", "train.pp_virtual_stages=2"), "train.pp_virtual_stages=2: only interleaved"),
        (("train.pp_degree=2", "train.grad_accum=2"), "train.grad_accum=2"),
        (("train.pp_degree=2", "data.batching=token_budget"), "data.batching=packed"),
    ],
)
def test_bad_pipeline_settings_fail_at_load_naming_the_key(overrides, named):
    with pytest.raises(ConfigError) as error:
        load_config(None, list(overrides), environ={})
    assert named in str(error.value)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("pipeline_stages", "pp_degree"),
        ("pipeline_schedule", "pp_schedule"),
        ("microbatches", "pp_microbatches"),
        ("stages_per_rank", "pp_virtual_stages"),
    ],
)
def test_the_old_pipeline_keys_are_refused_naming_the_new_one(tmp_path, old, new):
    expected = f"train.{old}: renamed to train.{new}"
    with pytest.raises(ConfigError, match=expected):
        load_config(None, [f"train.{old}=2"], environ={})
    with pytest.raises(ConfigError, match=expected):
        load_config(None, environ={f"PRETRAIN__TRAIN__{old.upper()}": "2"})
    path = tmp_path / "config.yaml"
    path.write_text(f"train:\n  {old}: 2\n")
    with pytest.raises(ConfigError, match=expected):
        load_config(path, environ={})


def test_world_size_not_divisible_by_pp_degree_fails_before_the_model_is_built(tmp_path):
    config = single_process(train_config(tmp_path / "data", LAYERS, *PIPELINE), tmp_path)
    write_token_corpus(config, SNAPSHOT)
    with pytest.raises(ConfigError, match=r"train.pp_degree=2 does not divide the 1 ranks \(WORLD_SIZE\)"):
        train(config, SNAPSHOT)


def test_checkpoints_of_another_pipeline_layout_are_named(tmp_path):
    (tmp_path / shard_folder(0, 2)).mkdir()
    (tmp_path / shard_folder(1, 2)).mkdir()
    assert checkpoint_layout_problem(tmp_path, 2) is None
    problem = checkpoint_layout_problem(tmp_path, 1)
    assert "train.pp_degree=2" in problem and "this run has train.pp_degree=1" in problem


def test_fp16_stages_skip_and_back_off_together_when_any_stage_overflows():
    # Two stages' scalers in one process; agree_found_inf stands in for the max all-reduce over the pp group.
    from pipeline.train.components.amp import MixedPrecision

    stages = []
    for grad in (1.0, float("inf")):
        precision = MixedPrecision("fp16", torch.device("cpu"))
        weight = torch.nn.Parameter(torch.ones(3))
        optimizer = torch.optim.AdamW([weight], lr=0.1)
        precision.scale(torch.ones(()))  # as Pipeline does: the scale exists on every stage
        weight.grad = torch.full((3,), grad)
        stages.append((precision, weight, optimizer))
    flags = [torch.ones(())]  # the other stage's verdict: an overflow there

    def agree(found_inf):
        found_inf.copy_(torch.maximum(found_inf, flags[0]))

    for precision, weight, optimizer in stages:
        precision.step(optimizer, [weight], 1.0, agree_found_inf=agree)
        assert torch.equal(weight.detach(), torch.ones(3))  # no step taken, though this stage was finite
        assert precision.skipped_steps == 1 and precision.loss_scale == 65536.0 * 0.5


# --- under torchrun --------------------------------------------------------------------------------------


def step_gradients(root: Path, name: str, launcher: list[str], overrides: list[str], variants: dict) -> Path:
    """Run tests/train/pipeline_step.py (one step per variant) and return where it wrote."""
    config = train_config(root / "data", LAYERS, *overrides)
    write_token_corpus(config, SNAPSHOT)
    path = write_config(config, root / f"{name}.yaml")
    out = root / name
    out.mkdir()
    command = [*launcher, str(REPO / "tests/train/pipeline_step.py"), str(out), str(path), SNAPSHOT]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    finish(start([*command, json.dumps(variants)], env=env, cwd=REPO), timeout_s=GUARD_S)
    return out


def one_process(root: Path, name: str, overrides: list[str]) -> dict:
    store = root / f"pg-{name}"
    single = [f"distributed.init_method=file://{store}", "distributed.rank=0", "distributed.world_size=1"]
    out = step_gradients(root, name, [sys.executable], [*overrides, *single], {"reference": []})
    return torch.load(out / "reference-rank0.pt", weights_only=True)


def pipeline_step(root: Path, name: str, processes: int, overrides: list[str], variants: dict) -> dict:
    """{variant: (loss on rank 0, every rank's gradients merged by name)}."""
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={processes}",
    ]
    out = step_gradients(root, name, launcher, overrides, variants)
    results = {}
    for variant in variants:
        ranks = [torch.load(out / f"{variant}-rank{r}.pt", weights_only=True) for r in range(processes)]
        merged: dict[str, list[torch.Tensor]] = {}
        for rank in ranks:
            for key, grad in rank["grads"].items():
                merged.setdefault(key, []).append(grad)
        results[variant] = (ranks[0]["loss"], merged)
    return results


def assert_same_step(result, reference) -> None:
    """Tolerance: fp32, only the order of float sums differs (micro-batches, the norm over stages)."""
    loss, grads = result
    assert float(loss) == pytest.approx(float(reference["loss"]), abs=1e-5)
    expected = reference["grads"]
    # Tied: the last stage's head is a copy of the embedding; both copies hold the tied matrix's gradient.
    assert set(grads) - {"lm_head.weight"} == set(expected)
    if "lm_head.weight" in grads:
        assert "lm_head.weight" not in expected
        grads = {**grads, "embed_tokens.weight": grads["embed_tokens.weight"] + grads["lm_head.weight"]}
    for key, copies in grads.items():
        name = "embed_tokens.weight" if key == "lm_head.weight" else key
        for grad in copies:  # every dp replica (and tied copy) holds the same gradient
            torch.testing.assert_close(grad, expected[name], rtol=1e-4, atol=1e-6, msg=key)


@pytest.mark.slow
def test_one_pipeline_step_matches_one_process_for_every_schedule(tmp_path):
    reference = one_process(tmp_path, "single", ["train.batch_size=8"])
    # Activation checkpointing recomputes each block in backward: the same gradients (no dropout here).
    recompute = [
        "train.pp_schedule=1f1b",
        "model.overrides={num_hidden_layers: 4, activation_checkpointing: true}",
    ]
    results = pipeline_step(tmp_path, "pp2", 2, list(PIPELINE), {**SCHEDULES, "1f1b-recompute": recompute})
    for name, result in results.items():
        loss, grads = result
        assert float(loss) > 0, name
        assert_same_step(result, reference)
        # The tied decision: each copy holds the whole tied gradient (not only its own share of it).
        (embedding,), (head,) = grads["embed_tokens.weight"], grads["lm_head.weight"]
        torch.testing.assert_close(embedding, head, rtol=0, atol=0)


@pytest.mark.slow
def test_pipeline_times_data_parallel_step_matches_one_process(tmp_path):
    # pp=2 x dp=2 (4 gloo processes), 8 rows per dp rank: one process sees the 16 rows of the global batch.
    reference = one_process(tmp_path, "single", ["train.batch_size=16"])
    variants = {**SCHEDULES, "1f1b-zero1": ["train.pp_schedule=1f1b", "train.data_parallel=zero1"]}
    for result in pipeline_step(tmp_path, "pp2dp2", 4, list(PIPELINE), variants).values():
        assert_same_step(result, reference)


@pytest.mark.slow
def test_moe_router_losses_of_every_stage_reach_the_loss_on_the_last_stage(tmp_path):
    # One process with the pipeline's micro-batches as gradient accumulation: routing is per micro-batch.
    reference = one_process(tmp_path, "single", [*MOE, "train.batch_size=2", "train.grad_accum=4"])
    variants = {"1f1b": SCHEDULES["1f1b"], "interleaved": SCHEDULES["interleaved"]}
    results = pipeline_step(tmp_path, "moe", 2, [*MOE, *PIPELINE], variants)
    for loss, grads in results.values():
        # Router weights of stage 0 (layer 1) and stage 1 (layer 3) get their aux and z gradients.
        assert {"blocks.1.mlp.router.weight", "blocks.3.mlp.router.weight"} <= set(grads)
        assert_same_step((loss, grads), reference)


# --- whole runs ------------------------------------------------------------------------------------------

RUN = (LAYERS, *PIPELINE, "train.steps=10", "train.checkpoint_every=4")


def pipeline_run(root: Path, processes: int = 2, *overrides: str, env: dict | None = None, ok: bool = True):
    config = train_config(root / "data", *RUN, *overrides)
    write_token_corpus(config, SNAPSHOT)
    path = write_config(config, root / "config.yaml")
    launcher = ["--standalone", f"--nproc-per-node={processes}"]
    output = finish(torchrun(launcher, path, SNAPSHOT, env=env), expect_success=ok, timeout_s=GUARD_S)
    return config, path, output


@pytest.fixture(scope="module")
def one_f_one_b(tmp_path_factory):
    """An uninterrupted pp=2 1F1B run of 10 steps: losses, metrics rows, final checkpoint shards."""
    root = tmp_path_factory.mktemp("1f1b")
    config, _, _ = pipeline_run(root, 2, *SCHEDULES["1f1b"])
    output = DatasetRef.of(config, "train", SNAPSHOT).path
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    shards = [Checkpointer(output / "checkpoints" / shard_folder(r, 2)).load(10) for r in range(2)]
    return losses(config, SNAPSHOT), rows, shards, DatasetRef.of(config, "train", SNAPSHOT).manifest()


@pytest.mark.slow
def test_the_three_schedules_give_the_same_losses_over_ten_steps(one_f_one_b, tmp_path):
    expected = one_f_one_b[0]
    assert len(expected) == 10 and expected[-1] < expected[0] - 1.0
    val_losses = {"1f1b": one_f_one_b[3].extra["val_loss"]}
    for name in ("gpipe", "interleaved"):
        config, _, _ = pipeline_run(tmp_path / name, 2, *SCHEDULES[name])
        assert losses(config, SNAPSHOT) == pytest.approx(expected, abs=1e-4), name
        val_losses[name] = DatasetRef.of(config, "train", SNAPSHOT).manifest().extra["val_loss"]
    single = single_process(
        train_config(
            tmp_path / "single" / "data",
            *RUN[:1],
            "train.batch_size=8",
            "train.steps=10",
            "train.checkpoint_every=4",
        ),
        tmp_path,
    )
    write_token_corpus(single, SNAPSHOT)
    train(single, SNAPSHOT)
    assert losses(single, SNAPSHOT) == pytest.approx(expected, abs=1e-4)
    # Validation forward through the stages (interleaved: four stages over two ranks, there and back): the
    # one-process figure within 1e-5 (fp32; only the trained weights' float summation order differs).
    reference_val = DatasetRef.of(single, "train", SNAPSHOT).manifest().extra["val_loss"]
    assert reference_val is not None
    for name, val_loss in val_losses.items():
        assert val_loss == pytest.approx(reference_val, abs=1e-5), name


@pytest.mark.slow
def test_pipeline_run_records_its_split_bubble_and_stage_sharded_checkpoints(one_f_one_b):
    _, rows, shards, manifest = one_f_one_b
    layout = manifest.extra["pipeline"]
    assert layout["split"]["layers"] == [[0, 2], [2, 4]]
    assert layout["schedule"] == "Schedule1F1B" and layout["pp_microbatches"] == 4
    assert layout["tied_embedding"] == "copies kept in sync"
    for row in rows:
        assert row["pipeline/bubble_theory"] == pytest.approx(1 / 5, abs=1e-5)
        assert 0 <= row["pipeline/idle_fraction/rank0"] < 1 and 0 <= row["pipeline/idle_fraction/rank1"] < 1
        assert row["pipeline/idle_s/rank0"] >= 0 and row["pipeline/idle_s/rank1"] >= 0
    # Each shard holds its own stage's part under the unsplit model's names; together, the whole model.
    first, last = (set(shard["model"]) for shard in shards)
    assert "embed_tokens.weight" in first and "blocks.1.attn.q_proj.weight" in first
    assert "lm_head.weight" in last and "blocks.2.attn.q_proj.weight" in last and "norm.weight" in last
    assert not first & last
    # The tied copies stayed bit-identical through ten optimizer steps.
    assert torch.equal(shards[0]["model"]["embed_tokens.weight"], shards[1]["model"]["lm_head.weight"])
    assert [shard["pipeline"]["stages"] for shard in shards] == [[0], [1]]


# fp16 (one loss scale over the stages) and dropout (per-rank RNG): state a resume must restore exactly.
RESUMED = (*SCHEDULES["1f1b"], "train.precision=fp16", "model.overrides={num_hidden_layers: 4, dropout: 0.1}")


@pytest.mark.slow
def test_pipeline_resumes_bit_for_bit_and_refuses_another_pipeline_layout(tmp_path):
    reference, _, _ = pipeline_run(tmp_path / "uninterrupted", 2, *RESUMED)
    expected_losses = losses(reference, SNAPSHOT)
    done = DatasetRef.of(reference, "train", SNAPSHOT).path / "checkpoints"
    expected_shards = [Checkpointer(done / shard_folder(r, 2)).load(10) for r in range(2)]
    # SIGTERM to the torchrun agent after step 5, as a preempting scheduler would send it.
    config, path, _ = pipeline_run(
        tmp_path,
        2,
        *RESUMED,
        env={"PRETRAIN_TRAIN_FAULT": "SIGTERM@5:rank=0:to=launcher"},
        ok=False,
    )
    staging = unfinished_run(config, SNAPSHOT)
    assert [Checkpointer(staging / "checkpoints" / shard_folder(r, 2)).steps()[-1] for r in range(2)] == [
        5,
        5,
    ]

    # The same run as one process: refused, naming the mismatch.
    single = single_process(
        train_config(tmp_path / "data", *RESUMED[1:], "train.batch_size=8", *RUN[4:]), tmp_path
    )
    with pytest.raises(CheckpointError, match=r"train.pp_degree=2, and this run has train.pp_degree=1"):
        train(single, SNAPSHOT)

    finish(torchrun(["--standalone", "--nproc-per-node=2"], path, SNAPSHOT), timeout_s=GUARD_S)
    assert losses(config, SNAPSHOT) == expected_losses  # exact float equality, every step
    output_path = DatasetRef.of(config, "train", SNAPSHOT).path
    for rank, expected in enumerate(expected_shards):
        shard = Checkpointer(output_path / "checkpoints" / shard_folder(rank, 2)).load(10)
        for name, tensor in expected["model"].items():
            assert torch.equal(shard["model"][name], tensor), name
        assert shard["precision"] == expected["precision"]  # the same loss scale on both stages


@pytest.mark.slow
def test_two_torchrun_agents_run_the_two_stages_and_match_one_agent(one_f_one_b, tmp_path):
    config = train_config(tmp_path / "data", *RUN, *SCHEDULES["1f1b"])
    write_token_corpus(config, SNAPSHOT)
    path = write_config(config, tmp_path / "config.yaml")
    nodes = [
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        "--rdzv-id=two-stages",
    ]
    agents = [torchrun(nodes, path, SNAPSHOT) for _ in range(2)]
    for agent in agents:
        finish(agent, timeout_s=GUARD_S)
    assert losses(config, SNAPSHOT) == one_f_one_b[0]
    assert DatasetRef.of(config, "train", SNAPSHOT).manifest().extra["pipeline"]["pp_degree"] == 2


@pytest.mark.slow
def test_a_pipeline_run_leaves_one_whole_model_for_export(one_f_one_b):
    """The manifest's checkpoint is rank 0's part; whole_model_checkpoint merges every rank's part of that step
    into the unsplit model (loaded strictly), which exports to transformers with our logits."""
    from pipeline.export.hf import build_hf_model
    from pipeline.model.checkpoint import model_from_state, whole_model_checkpoint
    from pipeline.model.trained import SpecialTokens

    _, _, shards, manifest = one_f_one_b
    state = whole_model_checkpoint(Path(manifest.path) / manifest.extra["checkpoint"])
    model = model_from_state(state)  # load_state_dict is strict: no part may be missing
    for shard in shards:
        for name, tensor in shard["model"].items():
            assert torch.equal(model.state_dict()[name], tensor), name
    hf = build_hf_model(state["model"], model.config, SpecialTokens(eos_id=0, pad_id=1))
    tokens = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (model(tokens).logits - hf(tokens).logits).abs().max().item() <= 1e-4


# --- bf16, elastic restart, MLflow -------------------------------------------------------------------------


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.float() - expected.float()).norm() / expected.float().norm().clamp_min(1e-12))


@pytest.mark.slow
def test_one_bf16_pipeline_step_matches_one_bf16_process(tmp_path):
    """bf16 autocast on both sides. Tolerance, looser than fp32's: the loss within 0.1 % and each parameter's
    gradient within 2 % of the reference's norm. A pipeline runs 2-row micro-batches where one process runs
    8 rows, so the bf16 matmuls round in other places (seen: the same loss, gradients within 0.22 %); a
    stage's lost or misplaced gradient is off by ~100 %."""
    bf16 = "train.precision=bf16"
    reference = one_process(tmp_path, "single", ["train.batch_size=8", bf16])
    results = pipeline_step(tmp_path, "pp2", 2, [*PIPELINE, bf16], {"1f1b": SCHEDULES["1f1b"]})
    loss, grads = results["1f1b"]
    assert float(loss) == pytest.approx(float(reference["loss"]), rel=1e-3)
    expected = reference["grads"]
    assert set(grads) - {"lm_head.weight"} == set(expected)
    for key, (grad,) in grads.items():
        # Tied: after the sync each copy (embedding on stage 0, head on stage 1) holds the whole gradient.
        name = "embed_tokens.weight" if key == "lm_head.weight" else key
        assert relative_error(grad, expected[name]) < 2e-2, key


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    """A pp=2 1F1B bf16 run of 10 steps reporting to MLflow (a file-backed sqlite store)."""
    root = tmp_path_factory.mktemp("bf16")
    store = f"sqlite:///{root / 'mlflow.db'}"
    mlflow = (f"tracking.mlflow_tracking_uri={store}", "tracking.required=true", "tracking.stage_runs=true")
    config, _, _ = pipeline_run(root, 2, *SCHEDULES["1f1b"], "train.precision=bf16", *mlflow)
    output = DatasetRef.of(config, "train", SNAPSHOT).path
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    return rows, DatasetRef.of(config, "train", SNAPSHOT).manifest(), store


@pytest.mark.slow
def test_a_bf16_pipeline_run_trains_like_the_fp32_one(bf16_run, one_f_one_b):
    rows, manifest, _ = bf16_run
    bf16 = [row["loss"] for row in rows if "loss" in row]
    assert len(bf16) == 10 and all(map(math.isfinite, bf16))
    assert bf16[-1] < bf16[0] - 1.0  # it learns, as the fp32 run does
    # Same data, same initial weights: bf16 rounding only, so within 2 % of the fp32 pipeline's losses.
    assert bf16 == pytest.approx(one_f_one_b[0], rel=2e-2)
    assert manifest.extra["precision"] == "bf16" and manifest.counters["skipped_steps"] == 0
    assert math.isfinite(manifest.extra["val_loss"])


@pytest.mark.slow
def test_rank_zero_reports_the_loss_and_the_bubble_of_a_pipeline_to_mlflow(bf16_run):
    """The loss lives on the last stage (rank 1); rank 0 logs it, with the bubble figures of both ranks."""
    from mlflow.tracking import MlflowClient

    rows, manifest, store = bf16_run
    client = MlflowClient(store)
    run = client.get_run(manifest.extra["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [
        (row["step"], row["loss"]) for row in rows if "loss" in row
    ]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "val_loss")][-1] == pytest.approx(
        manifest.extra["val_loss"], abs=1e-6
    )
    metrics = run.data.metrics
    assert metrics["pipeline/bubble_theory"] == pytest.approx(1 / 5, abs=1e-5)
    for rank in (0, 1):
        assert 0 <= metrics[f"pipeline/idle_fraction/rank{rank}"] < 1
        assert metrics[f"pipeline/idle_s/rank{rank}"] >= 0
    assert metrics["pipeline/bubble_measured"] == rows[-1]["pipeline/bubble_measured"]


@pytest.mark.slow
def test_a_killed_pipeline_rank_restarts_from_the_stage_sharded_checkpoint(one_f_one_b, tmp_path):
    """SIGKILL to rank 1 (the last stage) after step 6; torchrun restarts both ranks, which resume from the
    step-4 shards and finish with the uninterrupted run's losses, bit for bit (CPU, same layout)."""
    config = train_config(tmp_path / "data", *RUN, *SCHEDULES["1f1b"])
    write_token_corpus(config, SNAPSHOT)
    path = write_config(config, tmp_path / "config.yaml")
    launcher = ["--standalone", "--nproc-per-node=2", "--max-restarts=1"]
    env = {"PRETRAIN_TRAIN_FAULT": "SIGKILL@6:rank=1"}
    output = finish(torchrun(launcher, path, SNAPSHOT, env=env), timeout_s=GUARD_S)
    assert "exitcode: -9" in output  # torchrun saw the SIGKILL, then restarted the group
    manifest = DatasetRef.of(config, "train", SNAPSHOT).manifest()
    assert manifest.extra["restarts"] == 1
    resumed = [
        json.loads(line)
        for log_file in (tmp_path / "data").glob("_runs/*/logs/train-rank*.ecs.json")
        for line in log_file.read_text().splitlines()
        if "resumed from step" in line
    ]
    assert sorted(entry["labels"]["rank"] for entry in resumed) == [0, 1]
    assert {entry["message"].split(" (")[0] for entry in resumed} == {"resumed from step 4"}
    assert losses(config, SNAPSHOT) == one_f_one_b[0]
    assert manifest.extra["val_loss"] == one_f_one_b[3].extra["val_loss"]
