"""Muon against AdamW on the CPU (issue 45), one of ``benchmarks/train_scale.py``'s figures; alone:

    .venv/bin/python benchmarks/train_scale_muon.py --quick     # 80 steps per run
    .venv/bin/python benchmarks/train_scale_muon.py             # 240 steps per run

**Muon vs AdamW, tokens to the same loss** (``muon_tokens_to_adamw_loss``): each model (the ``tiny`` preset, and
a proxy of 4 layers) trains with ``train.optimizer=adamw`` and with ``train.optimizer=muon`` through the
trainer's own parts (``build_optimizer``, the warm-up + cosine ``build_lr_scheduler``, ``MixedPrecision.step``
with clipping at 1.0), fp32, on the same token windows, validation loss every ``--eval-every`` steps on the same
held-out windows. The same learning-rate search for both: 4 peak learning rates each (AdamW: ``train.lr``;
Muon: ``train.muon_lr``, its AdamW part at AdamW's best ``train.lr``), the best by final validation loss on seed
0, and where that best lies on an edge of its grid, one more point 2x beyond that edge (at most twice, the same
rule for both; ``best_inside_grid`` says whether it ended inside); then both run at their best on every seed. Per seed the figure is the tokens Muon needed to
reach AdamW's final validation loss (interpolated between evaluations) over the tokens AdamW trained on; a
Muon run that never gets there counts as its whole budget over AdamW's (1.0, a lower bound) and is flagged
``"reached": false``. Below 1 Muon is faster.

``--task`` picks the data (the starting grids are per task; for ``text`` a pilot search on wider grids put
each optimizer's 80-step best inside its own, and both are 4 points 2x apart):

- ``text`` (the default): real English prose, the bytes (a vocabulary of 256) of the repository's own
  ``docs/*.md``, training on every file but ``docs/training.md`` and validating on windows of that one, so the
  held-out text is unseen prose. Predicting it well takes more than the previous byte (words, markdown
  structure), i.e. the attention and MLP matrices that Muon steps, as a language model's pretraining does;
  the data is whatever ``docs/`` holds at the commit measured.
- ``markov2``: a random second-order Markov chain over 16 ids (each pair of previous tokens allows 2
  successors; floor ln 2 = 0.69 nats; the best a model seeing only the previous token can do is 2.40):
  the next token depends on the token two back, which only attention brings to the position.
- ``markov1``: the first version's task, a first-order chain over 128 ids (3 successors each; floor ln 3 =
  1.10 nats), learnt mostly by the embedding and the head, which stay on AdamW in both runs.

The last line printed is one JSON object.
"""

# Run as a script, this folder is sys.path[0]: the repository root replaces it.
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [e for e in sys.path if os.path.abspath(e or os.curdir) != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from dataclasses import replace  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from pipeline.model.config import PRESETS, GPTConfig  # noqa: E402
from pipeline.model.gpt import GPT  # noqa: E402
from pipeline.train.components.amp import MixedPrecision  # noqa: E402
from pipeline.train.components.lr_schedule import build_lr_scheduler  # noqa: E402
from pipeline.train.components.optimizer import build_optimizer  # noqa: E402
from pipeline.train.config import TrainConfig  # noqa: E402

SEQ_LEN = 32
BATCH = 8
EDGE_EXTENSIONS = 2  # at most this many points added to a grid whose best lies on its edge
DOCS = os.path.join(os.path.dirname(_HERE), "docs")
HELD_OUT_DOC = "training.md"
# Per task: (vocabulary, {optimizer: its 4 peak learning rates}). AdamW's are train.lr; Muon's train.muon_lr.
TASKS = {
    "text": (256, {"adamw": (5e-4, 1e-3, 2e-3, 4e-3), "muon": (0.025, 0.05, 0.1, 0.2)}),
    "markov2": (16, {"adamw": (1e-3, 3e-3, 1e-2, 3e-2), "muon": (0.01, 0.02, 0.05, 0.1)}),
    "markov1": (128, {"adamw": (1e-3, 3e-3, 1e-2, 3e-2), "muon": (0.01, 0.02, 0.05, 0.1)}),
}


def models(vocab: int) -> dict[str, GPTConfig]:
    return {
        "tiny": replace(PRESETS["tiny"], vocab_size=vocab),
        "proxy-4-layers": replace(PRESETS["tiny"], vocab_size=vocab, num_hidden_layers=4),
    }


def markov_tokens(count: int, seed: int, order: int, vocab: int, successors: int) -> np.ndarray:
    """``count`` tokens of one Markov chain of ``order`` (the chain is the same for every seed)."""
    table = np.random.default_rng(12345).integers(0, vocab, size=(vocab,) * order + (successors,))
    rng = np.random.default_rng(seed)
    choices = rng.integers(0, successors, size=count)
    out = np.empty(count, dtype=np.int64)
    out[:order] = rng.integers(0, vocab, size=order)
    for i in range(order, count):
        out[i] = table[(*out[i - order : i], choices[i])]
    return out


def doc_bytes(held_out: bool) -> np.ndarray:
    """The bytes of docs/*.md: the held-out file alone, or every other file one after another."""
    names = sorted(n for n in os.listdir(DOCS) if n.endswith(".md") and (n == HELD_OUT_DOC) == held_out)
    data = b"".join(pathlib.Path(DOCS, n).read_bytes() for n in names)
    return np.frombuffer(data, dtype=np.uint8).astype(np.int64)


def task_streams(task: str) -> tuple[np.ndarray, np.ndarray]:
    """(training stream, validation stream) of one task."""
    if task == "text":
        return doc_bytes(held_out=False), doc_bytes(held_out=True)
    order, vocab, successors = (2, 16, 2) if task == "markov2" else (1, 128, 3)
    return (
        markov_tokens(400_000, 1, order, vocab, successors),
        markov_tokens(40_000, 2, order, vocab, successors),
    )


def windows(stream: np.ndarray, rows: int, rng: np.random.Generator) -> torch.Tensor:
    starts = rng.integers(0, len(stream) - SEQ_LEN - 1, size=rows)
    return torch.from_numpy(np.stack([stream[s : s + SEQ_LEN + 1] for s in starts]))


def train_curve(
    model_config: GPTConfig,
    optimizer: str,
    lr: float,
    seed: int,
    steps: int,
    eval_every: int,
    train_stream: np.ndarray,
    validation: torch.Tensor,
    adamw_lr: float = 3e-3,
) -> list[tuple[int, float]]:
    """(tokens trained, validation loss) every ``eval_every`` steps and at the end; ``lr`` is Muon's for muon
    (its AdamW part, on the embedding, head and norms, runs at ``adamw_lr``)."""
    settings = {"lr": lr} if optimizer == "adamw" else {"muon_lr": lr, "lr": adamw_lr}
    train = TrainConfig(optimizer=optimizer, steps=steps, warmup_steps=max(1, steps // 20), **settings)
    torch.manual_seed(seed)
    model = GPT(model_config)
    device = torch.device("cpu")
    opt = build_optimizer(model, train, device)
    scheduler = build_lr_scheduler(opt, train)
    precision = MixedPrecision("fp32", device)
    rng = np.random.default_rng(seed)
    curve = []
    for step in range(1, steps + 1):
        batch = windows(train_stream, BATCH, rng)
        opt.zero_grad(set_to_none=True)
        loss = model(batch[:, :-1], batch[:, 1:]).loss
        loss.backward()
        precision.step(opt, model.parameters(), max_norm=train.grad_clip)
        scheduler.step()
        if step % eval_every == 0 or step == steps:
            model.eval()
            with torch.no_grad():
                val = float(model(validation[:, :-1], validation[:, 1:]).lm_loss)
            model.train()
            curve.append((step * BATCH * SEQ_LEN, val))
    return curve


def tokens_to_reach(curve: list[tuple[int, float]], target: float) -> int | None:
    """The first tokens count where the validation loss is at most ``target``, linearly interpolated."""
    previous = (0, float("inf"))
    for tokens, loss in curve:
        if loss <= target:
            if previous[1] == float("inf"):
                return tokens
            fraction = (previous[1] - target) / (previous[1] - loss)
            return round(previous[0] + fraction * (tokens - previous[0]))
        previous = (tokens, loss)
    return None


def muon_tokens_to_adamw_loss(
    seeds: int, steps: int, eval_every: int, task: str = "text", only_model: str | None = None
) -> dict:
    """Per model: the LR search, each seed's curves, and Muon's tokens to AdamW's final loss over AdamW's."""
    vocab, learning_rates = TASKS[task]
    train_stream, validation_stream = task_streams(task)
    validation = windows(validation_stream, 32, np.random.default_rng(0))
    results: dict = {"task": task, "models": {}}
    for name, model_config in models(vocab).items():
        if only_model not in (None, name):
            continue
        started = time.perf_counter()
        search: dict[str, dict[str, float]] = {}
        best: dict[str, float] = {}
        grids: dict[str, list[float]] = {}
        for optimizer, rates in learning_rates.items():  # AdamW first: Muon's AdamW part takes its best
            grids[optimizer] = list(rates)
            search[optimizer] = {}
            for _ in range(1 + EDGE_EXTENSIONS):
                for lr in grids[optimizer]:
                    if str(lr) not in search[optimizer]:
                        search[optimizer][str(lr)] = train_curve(
                            model_config,
                            optimizer,
                            lr,
                            0,
                            steps,
                            eval_every,
                            train_stream,
                            validation,
                            adamw_lr=best.get("adamw", 3e-3),
                        )[-1][1]
                best[optimizer] = float(min(search[optimizer], key=search[optimizer].__getitem__))
                # A best on an edge of the grid: one more point 2x beyond it, the same rule for both.
                if best[optimizer] == grids[optimizer][0]:
                    grids[optimizer].insert(0, round(grids[optimizer][0] / 2, 6))
                elif best[optimizer] == grids[optimizer][-1]:
                    grids[optimizer].append(round(grids[optimizer][-1] * 2, 6))
                else:
                    break
        per_seed = []
        for seed in range(seeds):
            curves = {
                optimizer: train_curve(
                    model_config,
                    optimizer,
                    best[optimizer],
                    seed,
                    steps,
                    eval_every,
                    train_stream,
                    validation,
                    adamw_lr=best["adamw"],
                )
                for optimizer in learning_rates
            }
            target_tokens, target = curves["adamw"][-1]
            reached = tokens_to_reach(curves["muon"], target)
            per_seed.append(
                {
                    "seed": seed,
                    "adamw_final_val_loss": round(target, 4),
                    "muon_final_val_loss": round(curves["muon"][-1][1], 4),
                    "muon_tokens_to_adamw_loss": reached,
                    "adamw_tokens": target_tokens,
                    "ratio": round((reached if reached is not None else target_tokens) / target_tokens, 3),
                    "reached": reached is not None,
                }
            )
        ratios = [row["ratio"] for row in per_seed]
        results["models"][name] = {
            "layers": model_config.num_hidden_layers,
            "hidden_size": model_config.hidden_size,
            "lr_search_final_val_loss_seed0": search,
            "best_lr": best,
            "best_inside_grid": {
                o: min(map(float, search[o])) < best[o] < max(map(float, search[o])) for o in best
            },
            "seeds": per_seed,
            "ratio_mean": round(statistics.mean(ratios), 3),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "seconds": round(time.perf_counter() - started, 1),
        }
        print(json.dumps({name: results["models"][name]}), flush=True)
    all_ratios = [row["ratio"] for m in results["models"].values() for row in m["seeds"]]
    results["ratio_mean"] = round(statistics.mean(all_ratios), 3)
    results["ratio_min"], results["ratio_max"] = min(all_ratios), max(all_ratios)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps; within 3 minutes on 2 cores")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: comparable on a busy host)")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--task", choices=sorted(TASKS), default="text", help="the data (see above)")
    parser.add_argument("--model", choices=sorted(models(2)), help="one model only (default: both)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    steps = args.steps or (80 if args.quick else 240)
    started = time.perf_counter()
    muon = muon_tokens_to_adamw_loss(args.seeds, steps, args.eval_every, args.task, args.model)
    summary = {
        "quick": args.quick,
        "task": args.task,
        "steps": steps,
        "tokens_per_step": BATCH * SEQ_LEN,
        "threads": args.threads,
        "muon_tokens_to_adamw_loss_ratio": muon["ratio_mean"],
        "muon_tokens_to_adamw_loss_ratio_min": muon["ratio_min"],
        "muon_tokens_to_adamw_loss_ratio_max": muon["ratio_max"],
        "muon_tokens_to_adamw_loss": muon["models"],
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
