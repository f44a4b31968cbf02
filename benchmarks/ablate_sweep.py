"""The sweep behind the ablation proxy's defaults (``pipeline.ablate.spec.PROXY``): which proxy shape, learning
rate and schedule give the most decision power per CPU-second.

It reuses an ablation's token outputs (``--data``: a data root where ``pretrain ablate`` or
``benchmarks/ablate.py --keep`` ran, two tokenize outputs named by ``--arms``) and trains each candidate proxy
in-process, one thread a process, several processes side by side: the project's model (``pipeline.model``),
its AdamW groups and warm-up + cosine schedule, packed windows in the loader's seeded order; no torchrun, no
checkpoints, so a candidate costs its steps only. Each is scored on the reference shards by the evaluation's
own per-document losses, and the paired test of ``pipeline.ablate.stats`` compares the arms over the seeds:
the figure of merit is the test's t (effect over its standard error) per CPU-second. The chosen candidate is
then checked through the real pipeline by ``benchmarks/ablate.py`` (decision accuracy against the old
defaults).

    .venv/bin/python benchmarks/ablate_sweep.py --data /tmp/bench/data --reference /tmp/bench/ref \\
        --arms none=sample/tokenize/bench.ab-1,recipe=sample/tokenize/bench.ab-2 --tokens 200000

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[0] = str(ROOT)

from benchmarks.smoke import add_smoke_flag  # noqa: E402

# Candidates: name -> (model overrides, train settings). "current" is the proxy the tests and benchmark used.
CANDIDATES: dict[str, tuple[dict, dict]] = {
    "current": ({}, {"lr": 5e-3, "batch": 8, "warmup": 2, "min_lr": 0.1}),
    "untied": ({"tie_word_embeddings": False}, {"lr": 5e-3, "batch": 8, "warmup": 2, "min_lr": 0.1}),
    "untied-decay0": ({"tie_word_embeddings": False}, {"lr": 5e-3, "batch": 8, "warmup": 20, "min_lr": 0.0}),
    "untied-lr2e-3": ({"tie_word_embeddings": False}, {"lr": 2e-3, "batch": 8, "warmup": 20, "min_lr": 0.0}),
    "untied-b4": ({"tie_word_embeddings": False}, {"lr": 3e-3, "batch": 4, "warmup": 20, "min_lr": 0.0}),
    "tied-decay0": ({}, {"lr": 5e-3, "batch": 8, "warmup": 20, "min_lr": 0.0}),
    "tied-lr2e-3": ({}, {"lr": 2e-3, "batch": 8, "warmup": 20, "min_lr": 0.0}),
    "untied-lr1e-3": ({"tie_word_embeddings": False}, {"lr": 1e-3, "batch": 8, "warmup": 20, "min_lr": 0.0}),
    "untied-lr3e-3": ({"tie_word_embeddings": False}, {"lr": 3e-3, "batch": 8, "warmup": 20, "min_lr": 0.0}),
    "untied-lr2e-3-floor": (
        {"tie_word_embeddings": False},
        {"lr": 2e-3, "batch": 8, "warmup": 20, "min_lr": 0.1},
    ),
    "untied-lr2e-3-b16": (
        {"tie_word_embeddings": False},
        {"lr": 2e-3, "batch": 16, "warmup": 20, "min_lr": 0.0},
    ),
    "untied-wide": (
        {
            "tie_word_embeddings": False,
            "hidden_size": 192,
            "intermediate_size": 512,
            "num_attention_heads": 6,
            "num_key_value_heads": 6,
        },
        {"lr": 3e-3, "batch": 8, "warmup": 20, "min_lr": 0.0},
    ),
}


def train_one(job: tuple[str, str, Path, int, int, int, Path]) -> dict:
    """One candidate proxy on one arm's train split with one seed; per-document nats on the reference."""
    name, arm, folder, seed, tokens, seq_len, reference = job
    import torch

    torch.set_num_threads(1)
    from pipeline.data.sequences import PackedSequences, TokenStream
    from pipeline.evaluate.job import document_losses
    from pipeline.model.config import model_config
    from pipeline.model.gpt import GPT
    from pipeline.train.components.optimizer import parameter_groups

    model_overrides, settings = CANDIDATES[name]
    started = time.process_time()
    torch.manual_seed(seed)
    config = model_config("tiny", **model_overrides)
    model = GPT(config)
    optimizer = torch.optim.AdamW(parameter_groups(model, 0.1), lr=settings["lr"], betas=(0.9, 0.95))
    windows = PackedSequences(folder / "train", seq_len)
    batch = settings["batch"]
    steps = max(1, math.ceil(tokens / (batch * seq_len)))
    order = np.concatenate(
        [
            np.random.default_rng([seed, epoch]).permutation(len(windows))
            for epoch in range(steps * batch // len(windows) + 1)
        ]
    )
    warmup, floor = settings["warmup"], settings["min_lr"]
    for step in range(steps):
        if step < warmup:
            factor = (step + 1) / warmup
        else:
            progress = min(1.0, (step - warmup) / max(1, steps - warmup))
            factor = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        for group in optimizer.param_groups:
            group["lr"] = settings["lr"] * factor
        rows = np.stack([windows[int(i)] for i in order[step * batch : (step + 1) * batch]])
        data = torch.from_numpy(rows)
        out = model(data[:, :-1], targets=data[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    model.eval()
    stream = TokenStream(reference)
    sums, counts = document_losses(model, stream, stream.num_documents, 16)
    return {
        "candidate": name,
        "arm": arm,
        "seed": seed,
        "nats": sums.tolist(),
        "tokens": counts.tolist(),
        "cpu_s": time.process_time() - started,
    }


def smoke_inputs(folder: Path) -> tuple[Path, Path, str]:
    """For --smoke, in place of an ablation's outputs: two arms' tokenize outputs and reference shards of
    Zipf token ids (benchmarks/train_cpu.py's), small. Returns (data root, reference folder, arms)."""
    from benchmarks.train_cpu import write_shards
    from pipeline.config import load_config

    config = load_config(None, [f"project.data_root={folder}", "logging.console=false"], environ={})
    arms = []
    for seed, arm in enumerate(("none", "recipe")):
        ref = write_shards(config, tokens=20_000, seed=seed, snapshot=f"smoke-{arm}")
        arms.append(f"{arm}={ref.path.relative_to(folder)}")
    reference = write_shards(config, tokens=100_000, seed=2, snapshot="smoke-reference")
    return folder, reference.path / "validation", ",".join(arms)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data", type=Path, help="the data root holding the arms' tokenize outputs (required but in --smoke)"
    )
    parser.add_argument(
        "--reference", type=Path, help="the reference shards' folder (required but in --smoke)"
    )
    parser.add_argument(
        "--arms", help="BASE=corpus/tokenize/snapshot,OTHER=...: base first (required but in --smoke)"
    )
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--quick", action="store_true", help="the old and the chosen proxy, 3 seeds, 100k tokens"
    )
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.smoke:
        import tempfile

        args.data, args.reference, args.arms = smoke_inputs(Path(tempfile.mkdtemp(prefix="bench-sweep-")))
    elif not (args.data and args.reference and args.arms):
        parser.error("--data, --reference and --arms are required (or --smoke)")

    from pipeline.ablate.heldout import eval_documents
    from pipeline.ablate.stats import paired_comparison

    arms = dict(item.split("=", 1) for item in args.arms.split(","))
    candidates = args.candidates.split(",")
    seeds, tokens = args.seeds, args.tokens
    if args.smoke:
        candidates, seeds, tokens = ["current"], 2, 2_000
    elif args.quick:
        candidates, seeds, tokens = ["current", "untied-lr1e-3"], 3, 100_000
    jobs = [
        (name, arm, args.data / path, seed, tokens, 64, args.reference)
        for name, (arm, path), seed in itertools.product(candidates, arms.items(), range(seeds))
    ]
    started = time.monotonic()
    with ProcessPoolExecutor(args.processes) as pool:
        results = list(pool.map(train_one, jobs))
    first = args.data / next(iter(arms.values()))
    documents = eval_documents([args.reference], 1 << 30, first / "tokenizer.json")
    bytes_per_document = np.asarray(documents.bytes, dtype=np.float64)
    names = list(arms)
    summary = {}
    print(
        f"{'candidate':<16} {'base loss':>9} {'effect bpb':>11} {'95% interval':>22} {'p':>8} {'t/cpu-s':>8}"
    )
    for name in candidates:
        mine = [r for r in results if r["candidate"] == name]
        base = np.array([r["nats"] for r in sorted(mine, key=lambda r: r["seed"]) if r["arm"] == names[0]])
        other = np.array([r["nats"] for r in sorted(mine, key=lambda r: r["seed"]) if r["arm"] == names[1]])
        counts = np.asarray(mine[0]["tokens"], dtype=np.float64)
        tested = paired_comparison(base, other, bytes_per_document, counts)
        cpu = sum(r["cpu_s"] for r in mine)
        error = (tested.high_bpb - tested.low_bpb) / 2
        t_per_cpu = (tested.effect_bpb / error * 2) / cpu if error else 0.0
        loss = float(base.sum() / (counts.sum() * len(base)))
        summary[name] = {**tested.to_dict(), "base_loss": loss, "cpu_s": cpu, "t_per_cpu_s": t_per_cpu}
        print(
            f"{name:<16} {loss:>9.4f} {tested.effect_bpb:>+11.4f} [{tested.low_bpb:+.4f}, {tested.high_bpb:+.4f}] "
            f"{tested.p_value:>8.3g} {t_per_cpu:>8.4f}"
        )
    print(
        json.dumps(
            {"candidates": summary, "tokens": tokens, "seeds": seeds, "wall_s": time.monotonic() - started}
        )
    )
    if args.smoke:
        import shutil

        shutil.rmtree(args.data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
