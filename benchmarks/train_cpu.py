"""Tokens/s of our trainer vs a minimal nanoGPT-style PyTorch loop: same model, batch, optimizer, AMP setting.

    .venv/bin/python benchmarks/train_cpu.py --quick     # within 3 minutes on 2 cores
    .venv/bin/python benchmarks/train_cpu.py             # longer runs, bigger model

Both sides train ``pipeline.model.GPT`` (preset ``--preset``) on the same token shards, in this one process with
the same torch threads, with AdamW (decay on matrices), gradient clipping and the same precision:

- **plain loop**: nanoGPT's ``train.py`` reduced to its core: random windows from a memmap, its warm-up +
  cosine ``get_lr``, forward under autocast, backward, clip, step, zero_grad; no logging, no checkpoints,
  no process group;
- **our trainer**: ``pipeline.train.trainer.Trainer`` as torchrun would run it, as a one-rank gloo group:
  resumable data loader, LR schedule, skipped-step accounting, metrics every ``--log-every`` steps to
  metrics.jsonl and the ECS log line, a checkpoint and a validation pass at the end (held out of its own
  tokens/s, like the plain loop does not have them at all).

Both sides run under the same host allocator settings: the trainer pins glibc malloc's mmap and trim
thresholds on the CPU (``train.keep_host_memory``, ``pipeline/train/host_memory.py``), so the script does the
same before the plain loop runs; ``--default-malloc`` leaves malloc alone on both sides (then the figures
depend on each side's allocation history: benchmarks/RESULTS.md).

The plain loop runs before and after the trainer, and the mean of the two is used (to even out drift in
machine load). Both use ``--threads`` torch threads (default 1): on a shared 2-core machine, intra-op thread
pools spin-wait on each other and a neighbour's load makes 2-thread figures swing by 10x between runs, while
single-thread ones stay comparable; the per-step work and the overheads compared are the same. The trainer's tokens/s is its own per-interval figure (``metrics.jsonl``), first interval
dropped as warm-up, like the plain loop's first steps. Document masking is off on both sides by default
(``--document-masking`` turns it on for the trainer only and reports what it costs).

**Defaults, side by side** (issue 24): then ``pretrain train`` (``python -m pipeline.train``: the launcher,
torchrun, one rank) runs as a user would start it, with its default settings for one process
(``train.nproc_per_node=1``, no ``train.threads_per_rank``, no OMP_NUM_THREADS), on the same shards, model and
batch, against the plain loop with its own default, torch's thread count (``torch.get_num_threads()`` in a
process without OMP_NUM_THREADS; the script removes the variable from its environment before importing torch
and reports it). That is the comparison a user gets without tuning anything; ``--no-defaults`` skips it.
The plain loop again runs before and after, and the trainer's threads are read from its rank's log.
Two-thread figures on a shared 2-core machine swing by up to 10x with a neighbour's load, so it also reports
each side's fastest 10-step interval (``default_best_interval_ratio_vs_plain_loop``): what each does while
both cores are free.

The last line printed is one JSON object.
"""

# Run as a script, this folder is sys.path[0]: the repository root replaces it.
import os
import sys

# Before torch is imported, so "torch's own thread count" below is its default, not an inherited setting.
_INHERITED_OMP_NUM_THREADS = os.environ.pop("OMP_NUM_THREADS", None)
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [e for e in sys.path if os.path.abspath(e or os.curdir) != _HERE]

import argparse  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

TORCH_DEFAULT_THREADS = torch.get_num_threads()

from pipeline.config import PipelineConfig, load_config  # noqa: E402
from pipeline.core.config import ENV_PREFIX  # noqa: E402
from pipeline.core.proc import run_streaming  # noqa: E402
from pipeline.core.storage import DatasetRef, StageOutput  # noqa: E402
from pipeline.data.shards import ShardWriter  # noqa: E402
from pipeline.model.gpt import GPT  # noqa: E402
from pipeline.tokenization.bpe import save_tokenizer, train_tokenizer  # noqa: E402
from pipeline.tokenization.config import TokenizerConfig  # noqa: E402
from pipeline.tokenization.encoder import vocabulary_size  # noqa: E402
from pipeline.train.components.amp import MixedPrecision  # noqa: E402
from pipeline.train.components.optimizer import parameter_groups  # noqa: E402
from pipeline.train.host_memory import keep_freed_host_memory  # noqa: E402
from pipeline.train.threads import usable_cores  # noqa: E402

SNAPSHOT = "bench"
DEFAULTS_SNAPSHOT = "bench-defaults"
REPO_ROOT = os.path.dirname(_HERE)
VOCAB = 2048


def bench_tokenizer() -> tuple[Tokenizer, TokenizerConfig]:
    """A real byte-level BPE of VOCAB ids, trained on the project's own docs: training resolves its data through
    the tokenizer a token output names (its digest), as for any tokenize output."""
    settings = TokenizerConfig(vocab_size=VOCAB, min_frequency=1)
    texts = [path.read_text(encoding="utf-8") for path in sorted(Path(REPO_ROOT, "docs").glob("*.md"))]
    return train_tokenizer(texts, settings), settings


def write_shards(config: PipelineConfig, tokens: int, seed: int = 0, snapshot: str = SNAPSHOT) -> DatasetRef:
    """A tokenize output of Zipf-distributed token ids in documents of 50-2000 tokens (content does not change
    the arithmetic; the shard, tokenizer and manifest formats are the real ones)."""
    rng = np.random.default_rng(seed)
    tokenizer, settings = bench_tokenizer()
    vocab = vocabulary_size(tokenizer)
    eos_id = tokenizer.token_to_id(settings.eos_token)
    ref = DatasetRef.of(config, "tokenize", snapshot)
    with StageOutput(ref, config, []) as out:
        save_tokenizer(tokenizer, out.path, settings)
        for split, count in (("train", tokens), ("validation", tokens // 20)):
            (out.path / split).mkdir()
            with ShardWriter(out.path / split / "shard-00000-0000", np.dtype(np.uint16)) as writer:
                written = 0
                while written < count:
                    length = int(rng.integers(50, 2000))
                    document = np.minimum(rng.zipf(1.2, length), vocab - 1).astype(np.int64)
                    document[-1] = eos_id
                    writer.add_document(document.tolist())
                    written += length
        out.commit(
            extra={
                "vocab_size": vocab,
                "dtype": "uint16",
                "eos_token": settings.eos_token,
                "eos_id": eos_id,
                "pad_token": settings.pad_token,
                "pad_id": tokenizer.token_to_id(settings.pad_token),
            }
        )
    return ref


def plain_loop(
    config: PipelineConfig,
    model_config,
    tokens: np.ndarray,
    steps: int,
    warmup: int,
    intervals: list[float] | None = None,
) -> float:
    """nanoGPT's loop: tokens/s over ``steps`` steps after ``warmup`` untimed ones.

    ``intervals`` gets the tokens/s of every ``warmup`` timed steps, like the trainer's per-interval figures.
    """
    train = config.train
    torch.manual_seed(0)
    model = GPT(model_config)
    optimizer = torch.optim.AdamW(
        parameter_groups(model, train.weight_decay), lr=train.lr, betas=tuple(train.betas)
    )
    precision = MixedPrecision(train.precision, torch.device("cpu"))
    rng = np.random.default_rng(0)
    batch, seq = train.batch_size, train.seq_len

    def get_batch():
        starts = rng.integers(0, len(tokens) - seq - 1, batch)
        rows = torch.from_numpy(np.stack([tokens[s : s + seq + 1].astype(np.int64) for s in starts]))
        return rows[:, :-1], rows[:, 1:]

    marks: list[tuple[int, float]] = []  # (timed steps done, time)
    for step in range(warmup + steps):
        if step >= warmup and (step - warmup) % warmup == 0:
            marks.append((step - warmup, time.perf_counter()))
        # nanoGPT's get_lr: linear warm-up, then cosine to min_lr (the same curve as the trainer's).
        if step < train.warmup_steps:
            lr = train.lr * (step + 1) / train.warmup_steps
        else:
            progress = min(1.0, (step - train.warmup_steps) / max(1, train.steps - train.warmup_steps))
            lr = train.lr * (
                train.min_lr_ratio + (1 - train.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
            )
        for group in optimizer.param_groups:
            group["lr"] = lr
        inputs, targets = get_batch()
        with precision.autocast():
            loss = model(inputs, targets).loss
        precision.backward(loss)
        precision.step(optimizer, model.parameters(), train.grad_clip)
        optimizer.zero_grad(set_to_none=True)
    loss.item()
    marks.append((steps, time.perf_counter()))
    if intervals is not None:
        intervals += [(n1 - n0) * batch * seq / (t1 - t0) for (n0, t0), (n1, t1) in itertools.pairwise(marks)]
    return steps * batch * seq / (marks[-1][1] - marks[0][1])


def our_trainer(config: PipelineConfig, root: Path, log_every: int) -> tuple[float, dict]:
    from pipeline.train.trainer import train

    single = config.model_copy(
        update={
            "distributed": config.distributed.model_copy(
                update={"init_method": f"file://{root / 'pg'}", "rank": 0, "world_size": 1}
            )
        }
    )
    manifest = train(single, SNAPSHOT)
    return trainer_tokens_per_s(config, SNAPSHOT, log_every), manifest.extra


def trainer_tokens_per_s(
    config: PipelineConfig, snapshot: str, log_every: int, intervals: list[float] | None = None
) -> float:
    """The trainer's own per-interval figures from metrics.jsonl, the first interval (warm-up) dropped."""
    path = DatasetRef.of(config, "train", snapshot).path / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    timed = [row for row in rows if "tokens_per_s" in row][1:]
    if intervals is not None:
        intervals += [row["tokens_per_s"] for row in timed]
    tokens = sum(row["tokens"] for row in timed)
    seconds = sum(row["step_time_s"] * log_every for row in timed)
    return tokens / seconds


def pretrain_train_defaults(
    config: PipelineConfig, root: Path, log_every: int, intervals: list[float]
) -> tuple[float, int]:
    """`pretrain train` in its own processes (launcher, torchrun, one rank), thread settings left to it.

    Returns its tokens/s and the threads its rank reported in its start-up line.
    """
    config_path = root / "defaults.yaml"
    config_path.write_text(config.to_yaml())
    command = [sys.executable, "-m", "pipeline.train", "--config", str(config_path)]
    command += ["--snapshot", DEFAULTS_SNAPSHOT, "--set", "train.nproc_per_node=1"]
    env = {key: value for key, value in os.environ.items() if not key.startswith(ENV_PREFIX)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
    output: list[str] = []
    try:
        run_streaming(command, env=env, cwd=REPO_ROOT, on_line=output.append)
    except Exception:
        print("\n".join(output[-40:]), file=sys.stderr)
        raise
    rank_logs = (Path(config.project.data_root) / "_runs").glob("*/logs/train-rank0-*.ecs.json")
    messages = [json.loads(line).get("message", "") for log in rank_logs for line in log.open()]
    started = [m for m in messages if m.startswith("training ") and "thread(s) per rank" in m]
    threads = int(re.search(r"(\d+) thread\(s\) per rank", started[-1]).group(1)) if started else -1
    return trainer_tokens_per_s(config, DEFAULTS_SNAPSHOT, log_every, intervals), threads


def side_by_side_defaults(
    config: PipelineConfig, model_config, stream: np.ndarray, steps: int, root: Path, log_every: int
) -> dict:
    """`pretrain train` with its own thread default vs the plain loop at torch's own, plain loop twice."""
    inherited = _INHERITED_OMP_NUM_THREADS
    # Two-thread figures swing with a neighbour's load far more than one-thread ones: record it.
    load_before = os.getloadavg()[0]
    print(
        f"defaults: {usable_cores()} usable cores; plain loop at torch's own {TORCH_DEFAULT_THREADS} "
        f"threads, `pretrain train` (one process) at its own; OMP_NUM_THREADS "
        + (f"was {inherited!r}, removed for both" if inherited else "unset"),
        flush=True,
    )
    torch.set_num_threads(TORCH_DEFAULT_THREADS)
    plain_intervals: list[float] = []
    ours_intervals: list[float] = []
    before = plain_loop(config, model_config, stream, steps, warmup=log_every, intervals=plain_intervals)
    print(f"plain loop, torch's default threads (before): {before:,.0f} tokens/s", flush=True)
    # The equal-threads setting must not reach the launcher: its default is what is measured.
    launched = config.model_copy(update={"train": config.train.model_copy(update={"threads_per_rank": None})})
    ours, threads = pretrain_train_defaults(launched, root, log_every, ours_intervals)
    print(f"pretrain train, its defaults ({threads} threads): {ours:,.0f} tokens/s", flush=True)
    after = plain_loop(config, model_config, stream, steps, warmup=log_every, intervals=plain_intervals)
    print(f"plain loop, torch's default threads (after):  {after:,.0f} tokens/s", flush=True)
    plain = (before + after) / 2
    return {
        "default_tokens_per_s_ratio_vs_plain_loop": round(ours / plain, 4),
        "default_trainer_tokens_per_s": round(ours, 1),
        "default_plain_loop_tokens_per_s": round(plain, 1),
        "default_plain_loop_before_after": [round(before, 1), round(after, 1)],
        # Each side's fastest 10-step interval: what it does while a neighbour leaves both cores free.
        "default_best_interval_ratio_vs_plain_loop": round(max(ours_intervals) / max(plain_intervals), 4),
        "default_best_interval_tokens_per_s": [round(max(ours_intervals), 1), round(max(plain_intervals), 1)],
        "default_trainer_threads": threads,
        "default_plain_loop_threads": TORCH_DEFAULT_THREADS,
        "inherited_omp_num_threads": inherited,
        "load_average_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small runs, within 3 minutes on 2 cores")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the same code path on the smallest input, in seconds (a test runs it; its figures mean nothing)",
    )
    parser.add_argument(
        "--preset", default=None, help="model preset (default: tiny, or tiny-moe... see docs)"
    )
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--document-masking", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads for both sides")
    parser.add_argument(
        "--default-malloc",
        action="store_true",
        help="leave glibc malloc's thresholds alone on both sides (train.keep_host_memory=false)",
    )
    parser.add_argument(
        "--no-defaults",
        action="store_true",
        help="skip `pretrain train` with its default threads against the plain loop with torch's default",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON object here")
    args = parser.parse_args(argv)

    preset = args.preset or "tiny"
    steps = args.steps or (4 if args.smoke else 100 if args.quick else 300)
    batch, seq = (2, 32) if args.smoke else (8, 256) if args.quick else (16, 256)
    log_every = 2 if args.smoke else 10
    torch.set_num_threads(args.threads)
    host_memory_kept = not args.default_malloc and keep_freed_host_memory()
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory(prefix="train-bench-") as folder:
        root = Path(folder)
        config = load_config(
            None,
            [
                f"project.data_root={root / 'data'}",
                f"model.preset={preset}",
                f"train.steps={steps + log_every}",
                f"train.batch_size={batch}",
                f"train.seq_len={seq}",
                f"train.precision={args.precision}",
                f"train.log_every={log_every}",
                f"train.checkpoint_every={steps + log_every}",
                f"train.eval_sequences={2 if args.smoke else 16}",
                "train.histogram_every=0",
                f"train.document_masking={str(args.document_masking).lower()}",
                "tracking.stage_runs=false",
                "tracking.tensorboard=false",
                "tracking.sample_tokens=0",
                "logging.console=false",
                f"train.keep_host_memory={str(not args.default_malloc).lower()}",
                # The side-by-side at equal threads: the in-process trainer keeps --threads too.
                f"train.threads_per_rank={args.threads}",
            ],
            environ={},
        )
        spare = 5_000 if args.smoke else 200_000
        tokens_ref = write_shards(config, tokens=(steps + log_every) * batch * (seq + 1) + spare)
        from pipeline.train.trainer import build_model_config

        model_config = build_model_config(config, tokens_ref.manifest().extra["vocab_size"])
        stream = np.concatenate(
            [np.fromfile(p, dtype=np.uint16) for p in sorted((tokens_ref.path / "train").glob("*.bin"))]
        )
        print(
            f"model {preset} ({GPT(model_config).num_parameters() / 1e6:.2f}M parameters), batch {batch}x{seq}, "
            f"{args.precision}, {steps} timed steps, {threads} torch threads, "
            f"malloc thresholds {'pinned' if host_memory_kept else 'left alone'}",
            flush=True,
        )
        before = plain_loop(config, model_config, stream, steps, warmup=log_every)
        print(f"plain loop (before): {before:,.0f} tokens/s", flush=True)
        ours, extra = our_trainer(config, root, log_every)
        print(f"our trainer:         {ours:,.0f} tokens/s", flush=True)
        after = plain_loop(config, model_config, stream, steps, warmup=log_every)
        print(f"plain loop (after):  {after:,.0f} tokens/s", flush=True)
        defaults = {}
        if not args.no_defaults:
            write_shards(
                config, tokens=(steps + log_every) * batch * (seq + 1) + spare, snapshot=DEFAULTS_SNAPSHOT
            )
            defaults = side_by_side_defaults(config, model_config, stream, steps, root, log_every)
            torch.set_num_threads(threads)
    plain = (before + after) / 2
    result = {
        "tokens_per_s_ratio_vs_plain_loop": round(ours / plain, 4),
        "default_tokens_per_s_ratio_vs_plain_loop": defaults.pop(
            "default_tokens_per_s_ratio_vs_plain_loop", None
        ),
        "trainer_tokens_per_s": round(ours, 1),
        "plain_loop_tokens_per_s": round(plain, 1),
        "plain_loop_before_after": [round(before, 1), round(after, 1)],
        "model": preset,
        "parameters": extra["parameters"],
        "batch": [batch, seq],
        "precision": args.precision,
        "timed_steps": steps,
        "torch_threads": threads,
        "cpus": os.cpu_count(),
        "usable_cores": usable_cores(),
        "document_masking": args.document_masking,
        "host_memory_kept": host_memory_kept,
        "final_loss": extra["final_loss"],
    }
    result.update(defaults)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
