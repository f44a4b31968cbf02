"""Pipeline parallelism on CPU (issue 18): tokens/s, measured bubble against (p-1)/(m+p-1), and memory per rank.

    .venv/bin/python benchmarks/pipeline_parallel.py --quick     # within 3 minutes on 2 cores
    .venv/bin/python benchmarks/pipeline_parallel.py             # more steps, a wider model

An 8-layer model (preset tiny, ``num_hidden_layers=8``) on Zipf token shards (``train_cpu.write_shards``),
trained by the real trainer (``pipeline.train.trainer.Trainer``, one ``train_step()`` at a time):

- **one process** (a one-rank gloo group): tokens/s, and the bytes of parameters plus AdamW state;
- **pp=2** under torchrun (2 gloo ranks, 1 thread each), for each schedule (gpipe, 1f1b, interleaved_1f1b
  with 2 stages per rank) and m in {2, 4, 8} micro-batches of the same global batch: tokens/s, the
  measured idle share of a step (each stage's compute time, summed by the stage, against the schedule's
  wall time; mean over the ranks) next to the theoretical (p-1)/(v*m+p-1), and each rank's parameter plus
  optimizer-state bytes, whose largest share of the one-process figure is ``param_memory_per_rank_ratio``
  (the goal: <= 0.6 at pp=2). Peak RSS per rank is reported too (it includes torch's own ~300 MB).

Each configuration warms up for 2 steps, then times ``--steps`` steps. The last line printed is one JSON
object.
"""

# Run as a script, this folder is sys.path[0]: the repository root replaces it.
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [e for e in sys.path if os.path.abspath(e or os.curdir) != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import psutil  # noqa: E402
import torch  # noqa: E402

from benchmarks.measure import launch_workers, worker  # noqa: E402
from benchmarks.smoke import add_smoke_flag  # noqa: E402
from benchmarks.train_cpu import write_shards  # noqa: E402
from pipeline.config import load_config  # noqa: E402

SNAPSHOT = "bench-pp"
SCHEDULES = {
    "gpipe": ["train.pp_schedule=gpipe"],
    "1f1b": ["train.pp_schedule=1f1b"],
    "interleaved_1f1b": ["train.pp_schedule=interleaved_1f1b", "train.pp_virtual_stages=2"],
}
MICROBATCHES = (2, 4, 8)
GUARD_S = 600  # a hang (gloo p2p, pytorch issue 132644) kills the run instead of blocking


def state_bytes(trainer) -> int:
    """This rank's parameters plus optimizer state, in bytes (a tied matrix once per copy held)."""
    parameters = {id(p): p for p in trainer.parallelism.module.parameters()}.values()
    total = sum(p.numel() * p.element_size() for p in parameters)
    for state in trainer.optimizer.state.values():
        total += sum(v.numel() * v.element_size() for v in state.values() if torch.is_tensor(v))
    return total


def measure(config, steps: int) -> dict:
    """Warm up, then time ``steps`` training steps of one Trainer (every rank calls it)."""
    from pipeline.train.trainer import Trainer

    trainer = Trainer(config, SNAPSHOT)
    for _ in range(2):
        trainer.train_step()
    parallelism = trainer.parallelism
    parallelism.metrics()  # resets the pipeline's timers after the warm-up (collective)
    trainer.ctx.barrier()
    started = time.perf_counter()
    for _ in range(steps):
        trainer.train_step()
    trainer.ctx.barrier()
    elapsed = time.perf_counter() - started
    bubble = parallelism.metrics() if trainer.train_config.pp_degree > 1 else {}
    memory = trainer.ctx.gather_objects((state_bytes(trainer), psutil.Process().memory_info().rss))
    trainer.metrics.close("FINISHED")
    return {
        "tokens_per_s": round(steps * trainer.last_step.tokens / elapsed, 1),
        "bubble_theory": bubble.get("pipeline/bubble_theory"),
        "bubble_measured": bubble.get("pipeline/bubble_measured"),
        "idle_fraction_per_rank": [
            bubble[f"pipeline/idle_fraction/rank{r}"] for r in range(trainer.train_config.pp_degree) if bubble
        ],
        "state_bytes_per_rank": [row[0] for row in memory or []],
        "peak_rss_mb_per_rank": [round(row[1] / 2**20, 1) for row in memory or []],
    }


def launch(root: Path, name: str, processes: int, config_path: Path, variants: dict, steps: int) -> dict:
    """``variants`` (name: overrides) in one launch of ``processes`` ranks; their results by name."""
    out = root / f"{name}.json"
    pairs = [[variant, overrides] for variant, overrides in variants.items()]
    return dict(launch_workers(os.path.abspath(__file__), out, processes, config_path, pairs, steps, GUARD_S))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer steps (within 3 minutes on 2 cores)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per configuration")
    parser.add_argument("--worker", nargs=3, metavar=("OUT", "CONFIG", "VARIANTS"), help=argparse.SUPPRESS)
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    steps = args.steps or (1 if args.smoke else 6 if args.quick else 20)
    if args.worker:
        worker(Path(args.worker[0]), Path(args.worker[1]), json.loads(args.worker[2]), steps, measure)
        return 0

    # From 192 on the blocks outweigh the head enough that the FLOP split is 4 + 4 layers (at 128 it is 5 + 3).
    hidden = 64 if args.smoke else 192 if args.quick else 256
    # Smoke mode: every schedule, at the one micro-batch count the summary reads.
    microbatches = (8,) if args.smoke else MICROBATCHES
    with tempfile.TemporaryDirectory(prefix="bench-pp-") as folder:
        root = Path(folder)
        common = [
            f"project.data_root={root / 'data'}",
            "logging.console=false",
            "tracking.stage_runs=false",
            "tracking.tensorboard=false",
            "tracking.sample_tokens=0",
            f"model.overrides={{num_hidden_layers: 8, hidden_size: {hidden}, "
            f"intermediate_size: {hidden * 11 // 4}}}",
            "train.batch_size=16",
            "train.seq_len=64",
            "train.steps=1000",
            "train.checkpoint_every=1000",
            "train.histogram_every=0",
            "train.document_masking=false",
            "train.threads_per_rank=1",
        ]
        config = load_config(None, common, environ={})
        write_shards(config, tokens=20_000 if args.smoke else 400_000, snapshot=SNAPSHOT)
        single_config = root / "single.yaml"
        store = root / "pg-single"
        single_config.write_text(
            load_config(
                None,
                [
                    *common,
                    f"distributed.init_method=file://{store}",
                    "distributed.rank=0",
                    "distributed.world_size=1",
                ],
                environ={},
            ).to_yaml()
        )
        pp_config = root / "pp.yaml"
        pp_config.write_text(load_config(None, [*common, "train.pp_degree=2"], environ={}).to_yaml())

        started = time.perf_counter()
        single = launch(root, "single", 1, single_config, {"single": []}, steps)["single"]
        rows = {}
        for schedule, overrides in SCHEDULES.items():
            variants = {f"{schedule}-m{m}": [*overrides, f"train.pp_microbatches={m}"] for m in microbatches}
            rows.update(launch(root, schedule, 2, pp_config, variants, steps))
        wall_s = time.perf_counter() - started

    single_bytes = single["state_bytes_per_rank"][0]
    print(
        f"one process: {single['tokens_per_s']:.0f} tokens/s, parameters + AdamW state {single_bytes / 2**20:.2f} MiB"
    )
    print(
        f"{'schedule':<18}{'m':>3}{'tokens/s':>10}{'bubble theory':>15}{'measured':>10}{'idle per rank':>18}"
        f"{'state/rank vs 1 proc':>24}"
    )
    for name, row in rows.items():
        schedule, m = name.rsplit("-m", 1)
        ratio = max(row["state_bytes_per_rank"]) / single_bytes
        idle = ", ".join(f"{share:.2f}" for share in row["idle_fraction_per_rank"])
        print(
            f"{schedule:<18}{m:>3}{row['tokens_per_s']:>10.0f}{row['bubble_theory']:>15.3f}"
            f"{row['bubble_measured']:>10.3f}{idle:>18}{ratio:>24.3f}"
        )
    at_8 = {
        schedule: {
            "theory": rows[f"{schedule}-m8"]["bubble_theory"],
            "measured": rows[f"{schedule}-m8"]["bubble_measured"],
        }
        for schedule in SCHEDULES
    }
    ratio = max(max(row["state_bytes_per_rank"]) for row in rows.values()) / single_bytes
    summary = {
        "bubble_measured_vs_theory": at_8,
        "param_memory_per_rank_ratio": round(ratio, 3),
        "tokens_per_s_single": single["tokens_per_s"],
        "tokens_per_s_pp2": {name: row["tokens_per_s"] for name, row in rows.items()},
        "peak_rss_mb_per_rank_pp2_1f1b_m8": rows["1f1b-m8"]["peak_rss_mb_per_rank"],
        "peak_rss_mb_single": single["peak_rss_mb_per_rank"][0],
        "steps": steps,
        "hidden_size": hidden,
        "wall_s": round(wall_s, 1),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
