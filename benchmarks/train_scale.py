"""Training at scale on CPU (issue 45): what FSDP2 saves per rank, and what it costs against DDP.

    .venv/bin/python benchmarks/train_scale.py --quick     # within 3 minutes on 2 cores
    .venv/bin/python benchmarks/train_scale.py             # more steps and repeats, a wider model

A 4-layer model (preset tiny, wider) on Zipf token shards (``train_cpu.write_shards``), trained by the real
trainer (``pipeline.train.trainer.Trainer``, one ``train_step()`` at a time) under torchrun on gloo, one thread
per rank. One function per figure:

- ``fsdp_memory``: parameter + gradient + optimizer-state bytes held by each rank after a step, counted from
  the tensors' storages (each storage once: DDP's gradients are views into its buckets, a tied matrix is one
  tensor; an FSDP DTensor counts its local shard's storage, padding included), at one process, DDP and FSDP
  on 2 and 4 ranks, and HSDP on 4 (``train.dp_replicate=2`` x dp_shard=2). ``fsdp_memory_per_rank_ratio`` =
  FSDP at 4 ranks per rank / (one process / 4); the goal is at most 1.1. ``hsdp_memory_per_rank_ratio`` = HSDP
  2x2 per rank / (one process / 2): each replica shards the model over 2 ranks, so about 1.
- ``fsdp_throughput``: tokens/s of FSDP against DDP at 2 ranks, the two alternated ``--repeats`` times in one
  process group (ABBA order) so drifts of a busy machine fall on both; ``fsdp_tokens_per_s_ratio_vs_ddp`` is the median
  of the per-repeat ratios, with their min and max as the spread.
- ``async_save_blocking``: how long a DCP checkpoint save (``train.checkpoint_format=dcp``) blocks the
  training loop, asynchronous (``train.checkpoint_async``: the loop waits only while each shard is copied
  and the writer starts) against synchronous (the loop waits for the whole write, checksums and publication),
  on the same model and optimizer state in one process, alternated ``--repeats`` times (ABBA).
  ``async_save_blocking_ratio`` is the median of the per-repeat ratios (blocked async / sync), with their min
  and max as the spread; the goal is at most 0.2.
- ``muon_tokens_to_adamw_loss`` (``benchmarks/train_scale_muon.py``, which also runs alone): the tokens Muon needs
  to reach AdamW's final validation loss over AdamW's, on the ``tiny`` preset and a 4-layer proxy, 2 seeds, the
  same learning-rate search for both, on held-out English prose (that script's default ``--task text``; its
  other tasks run from it alone); ``muon_tokens_to_adamw_loss_ratio`` is their mean (below 1: Muon is faster;
  the goal is at most 0.8), with its min and max.

The last line printed is one JSON object.
"""

# Run as a script, this folder is sys.path[0]: the repository root replaces it.
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [e for e in sys.path if os.path.abspath(e or os.curdir) != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from benchmarks.measure import launch_workers, worker  # noqa: E402
from benchmarks.train_cpu import write_shards  # noqa: E402
from benchmarks.train_scale_muon import muon_tokens_to_adamw_loss  # noqa: E402
from pipeline.config import load_config  # noqa: E402

SNAPSHOT = "bench-scale"
GUARD_S = 600  # a hang kills the run instead of blocking
KINDS = {"ddp": ["train.data_parallel=ddp"], "fsdp": ["train.data_parallel=fsdp"]}
# At 4 ranks also HSDP: 2 replicas of a model sharded over 2 ranks (train.dp_replicate=2 x dp_shard=2).
KINDS_AT_4 = {**KINDS, "hsdp": [*KINDS["fsdp"], "train.dp_replicate=2", "train.nproc_per_node=4"]}


def held_bytes(trainer) -> dict[str, int]:
    """This rank's parameter, gradient and optimizer-state bytes, each storage counted once."""
    from torch.distributed.tensor import DTensor

    seen: set[int] = set()

    def storage(tensors) -> int:
        total = 0
        for tensor in tensors:
            local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
            untyped = local.untyped_storage()
            if untyped.data_ptr() not in seen and untyped.nbytes():
                seen.add(untyped.data_ptr())
                total += untyped.nbytes()
        return total

    parameters = list(trainer.parallelism.module.parameters())
    state = [v for entry in trainer.optimizer.state.values() for v in entry.values() if torch.is_tensor(v)]
    return {
        "parameters": storage(parameters),
        "gradients": storage(p.grad for p in parameters if p.grad is not None),
        "optimizer": storage(state),
    }


def measure(config, steps: int) -> dict:
    """Warm up, then time ``steps`` training steps of one Trainer (every rank calls it); the bytes each rank
    holds after the last step (gradients still there)."""
    from pipeline.train.trainer import Trainer

    trainer = Trainer(config, SNAPSHOT)
    for _ in range(2):
        trainer.train_step()
    trainer.ctx.barrier()
    started = time.perf_counter()
    for _ in range(steps):
        trainer.train_step()
    trainer.ctx.barrier()
    elapsed = time.perf_counter() - started
    held = trainer.ctx.gather_objects(held_bytes(trainer))
    trainer.metrics.close("FINISHED")
    return {
        "tokens_per_s": round(steps * trainer.last_step.tokens / elapsed, 1),
        "bytes_per_rank": [sum(row.values()) for row in held or []],
        "bytes_by_kind_rank0": (held or [{}])[0],
    }


def launch(root: Path, name: str, processes: int, config_path: Path, variants: list, steps: int) -> list:
    """``variants`` ([name, overrides] pairs) in one launch of ``processes`` ranks; their results in order."""
    out = root / f"{name}.json"
    return launch_workers(os.path.abspath(__file__), out, processes, config_path, variants, steps, GUARD_S)


def fsdp_memory(single: dict, at_2: dict[str, dict], at_4: dict[str, dict]) -> dict:
    """Bytes per rank (the largest rank's) at one process, at DDP / FSDP on 2 and 4 ranks, and HSDP 2x2 on 4."""
    one = single["bytes_per_rank"][0]
    per_rank = {"1": one}
    for ranks, rows in (("2", at_2), ("4", at_4)):
        for kind, row in rows.items():
            per_rank[f"{kind}{ranks}"] = max(row["bytes_per_rank"])
    return {
        "bytes_per_rank": per_rank,
        "bytes_by_kind_rank0": {
            "1": single["bytes_by_kind_rank0"],
            **{f"{kind}4": row["bytes_by_kind_rank0"] for kind, row in at_4.items()},
        },
        "fsdp_memory_per_rank_ratio": round(per_rank["fsdp4"] / (one / 4), 3),
        "fsdp2_memory_per_rank_ratio": round(per_rank["fsdp2"] / (one / 2), 3),
        "hsdp_memory_per_rank_ratio": round(per_rank["hsdp4"] / (one / 2), 3),
    }


def fsdp_throughput(rows: list) -> dict:
    """FSDP's tokens/s over DDP's at 2 ranks, per alternated repeat: median and spread."""
    ddp = [row["tokens_per_s"] for name, row in rows if name == "ddp"]
    fsdp = [row["tokens_per_s"] for name, row in rows if name == "fsdp"]
    ratios = [f / d for f, d in zip(fsdp, ddp, strict=True)]
    return {
        "fsdp_tokens_per_s_ratio_vs_ddp": round(statistics.median(ratios), 3),
        "fsdp_tokens_per_s_ratio_spread": [round(min(ratios), 3), round(max(ratios), 3)],
        "tokens_per_s_ddp2": ddp,
        "tokens_per_s_fsdp2": fsdp,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer steps (within 3 minutes on 2 cores)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per configuration")
    parser.add_argument("--repeats", type=int, default=None, help="alternated DDP/FSDP pairs at 2 ranks")
    parser.add_argument("--only", choices=("fsdp", "muon", "checkpoint"), help="one group of figures")
    parser.add_argument("--worker", nargs=3, metavar=("OUT", "CONFIG", "VARIANTS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    steps = args.steps or (6 if args.quick else 12)
    repeats = args.repeats or (4 if args.quick else 6)
    if args.worker:
        worker(Path(args.worker[0]), Path(args.worker[1]), json.loads(args.worker[2]), steps, measure)
        return 0

    summary: dict = {}
    if args.only in (None, "fsdp"):
        summary.update(fsdp_figures(args.quick, steps, repeats))
    if args.only in (None, "checkpoint"):
        torch.set_num_threads(1)  # as a trainer rank with train.threads_per_rank=1
        summary.update(async_save_blocking(repeats=5 if args.quick else 9))
    if args.only in (None, "muon"):
        torch.set_num_threads(1)  # as train_scale_muon.py measures it: comparable on a busy host
        muon_steps = 80 if args.quick else 240
        muon = muon_tokens_to_adamw_loss(seeds=2, steps=muon_steps, eval_every=10)
        summary.update(
            {
                "muon_tokens_to_adamw_loss_ratio": muon["ratio_mean"],
                "muon_tokens_to_adamw_loss_ratio_min": muon["ratio_min"],
                "muon_tokens_to_adamw_loss_ratio_max": muon["ratio_max"],
                "muon_tokens_to_adamw_loss": muon["models"],
                "muon_steps": muon_steps,
            }
        )
    print(json.dumps(summary))
    return 0


def async_save_blocking(repeats: int) -> dict:
    """Seconds a DCP save blocks the caller, synchronous and asynchronous, alternated ABBA in one process on
    one model (4 layers of 512, 17M parameters, AdamW state after a step: about 200 MB a save)."""
    from pipeline.model import model_config
    from pipeline.model.gpt import GPT
    from pipeline.train.components.checkpoint_manager import DistributedCheckpointManager
    from pipeline.train.distributed.parallelism import ShardedModelState, ShardedOptimizerState

    config = model_config("tiny").with_overrides(
        num_hidden_layers=4, hidden_size=512, intermediate_size=1408, vocab_size=8192
    )
    torch.manual_seed(0)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters())
    for param in model.parameters():
        param.grad = torch.randn_like(param)
    optimizer.step()
    blocked: dict[bool, list[float]] = {False: [], True: []}
    written_async: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as folder:
        managers = {
            kind: DistributedCheckpointManager(
                Path(folder) / ("async" if kind else "sync"),
                states={
                    "model": ShardedModelState([(model, str)]),
                    "optimizer": ShardedOptimizerState(model, optimizer, str),
                },
                is_main=True,
                keep_last=1,
                metadata={"model_config": {}},
                async_save=kind,
            )
            for kind in (False, True)
        }
        order = [[False, True] if index % 2 == 0 else [True, False] for index in range(repeats + 1)]
        for step, kind in enumerate(kind for pair in order for kind in pair):
            started = time.perf_counter()
            managers[kind].save(step)
            returned = time.perf_counter()
            managers[kind].wait()
            if step >= 2:  # the first pair warms the page cache and the allocator
                blocked[kind].append(returned - started)
                if kind:
                    written_async.append(time.perf_counter() - started)
    ratios = [a / s for a, s in zip(blocked[True], blocked[False], strict=True)]
    figures = {
        "async_save_blocking_ratio": round(statistics.median(ratios), 4),
        "async_save_blocking_ratio_spread": [round(min(ratios), 4), round(max(ratios), 4)],
        "save_blocked_s_sync": [round(value, 4) for value in blocked[False]],
        "save_blocked_s_async": [round(value, 4) for value in blocked[True]],
        "save_written_s_async": [round(value, 4) for value in written_async],
        "save_parameters": config.num_parameters(),
    }
    print(
        f"DCP save, blocked s: sync median {statistics.median(blocked[False]):.3f}, async median "
        f"{statistics.median(blocked[True]):.3f} (written after {statistics.median(written_async):.3f}); "
        f"async/sync median {figures['async_save_blocking_ratio']} (min..max "
        f"{figures['async_save_blocking_ratio_spread']})"
    )
    return figures


def fsdp_figures(quick: bool, steps: int, repeats: int) -> dict:
    hidden = 128 if quick else 256
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as folder:
        root = Path(folder)
        common = [
            f"project.data_root={root / 'data'}",
            "logging.console=false",
            "tracking.stage_runs=false",
            "tracking.tensorboard=false",
            "tracking.sample_tokens=0",
            f"model.overrides={{num_hidden_layers: 4, hidden_size: {hidden}, "
            f"intermediate_size: {hidden * 11 // 4}}}",
            "train.batch_size=8",
            "train.seq_len=64",
            "train.steps=1000",
            "train.checkpoint_every=1000",
            "train.histogram_every=0",
            "train.document_masking=false",
            "train.threads_per_rank=1",
        ]
        config = load_config(None, common, environ={})
        write_shards(config, tokens=300_000, snapshot=SNAPSHOT)
        single_config = root / "single.yaml"
        single_config.write_text(
            load_config(
                None,
                [
                    *common,
                    f"distributed.init_method=file://{root / 'pg-single'}",
                    "distributed.rank=0",
                    "distributed.world_size=1",
                ],
                environ={},
            ).to_yaml()
        )
        ranked_config = root / "ranked.yaml"
        ranked_config.write_text(config.to_yaml())

        started = time.perf_counter()
        ((_, single),) = launch(root, "single", 1, single_config, [["single", []]], steps)
        # ABBA order: the first repeats of a process run slower (caches, allocator), on both kinds alike.
        order = [list(KINDS) if index % 2 == 0 else list(KINDS)[::-1] for index in range(repeats)]
        alternated = [[kind, KINDS[kind]] for kinds in order for kind in kinds]
        at_2_rows = launch(root, "two", 2, ranked_config, alternated, steps)
        at_4_rows = launch(root, "four", 4, ranked_config, [list(pair) for pair in KINDS_AT_4.items()], steps)
        wall_s = time.perf_counter() - started

    at_2 = {name: row for name, row in at_2_rows}  # the last repeat of each
    at_4 = {name: row for name, row in at_4_rows}
    memory = fsdp_memory(single, at_2, at_4)
    throughput = fsdp_throughput(at_2_rows)
    print(f"{'layout':<8}{'bytes/rank (MiB)':>18}{'vs one process':>16}")
    for name, held in memory["bytes_per_rank"].items():
        print(f"{name:<8}{held / 2**20:>18.2f}{held / memory['bytes_per_rank']['1']:>16.3f}")
    print(
        f"tokens/s at 2 ranks: ddp {throughput['tokens_per_s_ddp2']}, fsdp {throughput['tokens_per_s_fsdp2']}; "
        f"fsdp/ddp median {throughput['fsdp_tokens_per_s_ratio_vs_ddp']} "
        f"(min..max {throughput['fsdp_tokens_per_s_ratio_spread']})"
    )
    return {
        **memory,
        **throughput,
        "tokens_per_s_single": single["tokens_per_s"],
        "steps": steps,
        "repeats": repeats,
        "hidden_size": hidden,
        "wall_s": round(wall_s, 1),
    }


if __name__ == "__main__":
    raise SystemExit(main())
