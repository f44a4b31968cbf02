"""Tokens/s and MFU of our trainer on one GPU: ``base`` and ``base-moe`` in bf16, with and without torch.compile.

    python benchmarks/train_gpu.py               # one H200: four runs, under 5 minutes in all
    python benchmarks/train_gpu.py --dry-run     # CPU, tiny shapes: exercises the same code path, no figures
    python benchmarks/train_gpu.py --smoke       # the dry run, eager only, in seconds (tests/benchmarks)
    python benchmarks/train_gpu.py --presets base --modes compile --fused-cross-entropy auto --batch-size 24
                                                 # the loss without the logits, and a micro-batch it frees room for

Each case is ``pipeline.train.trainer.Trainer`` as torchrun would run it (a one-rank group: NCCL on the GPU,
gloo in the dry run) on synthetic token shards (uniform ids; the arithmetic does not depend on them), with
document masking on, as in training. tokens/s and MFU are the trainer's own figures (``metrics.jsonl``):
MFU = model FLOPs per token (``GPT.flops_per_token``: 6 x active matmul parameters + attention) x tokens/s
/ the device's dense bf16 peak (989.4 TFLOP/s for an H100/H200, from
``pipeline.train.components.metrics.PEAK_FLOPS_16BIT``). The first ``--log-every`` steps (which include
compilation) are dropped. The last line printed is one JSON object.
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

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tokenizers import Tokenizer, models  # noqa: E402

from benchmarks.smoke import HELP as SMOKE_HELP  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.core.storage import DatasetRef, StageOutput  # noqa: E402
from pipeline.data.shards import ShardWriter  # noqa: E402
from pipeline.model.config import FUSED_CROSS_ENTROPY, GPTConfig  # noqa: E402
from pipeline.tokenization.bpe import save_tokenizer, special_tokens  # noqa: E402
from pipeline.tokenization.config import TokenizerConfig  # noqa: E402

SNAPSHOT = "bench"


def id_tokenizer(vocab_size: int) -> tuple[Tokenizer, TokenizerConfig]:
    """A word-level tokenizer with exactly ``vocab_size`` ids, the special tokens first (end-of-text 0,
    padding 1): training resolves its data through the tokenizer a token output names, and the shards' ids
    are uniform, so any tokenizer with that many ids will do."""
    settings = TokenizerConfig(reserved_tokens=0)
    specials = special_tokens(settings)
    vocab = {token: index for index, token in enumerate(specials)}
    vocab |= {f"t{index}": index for index in range(len(specials), vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=settings.pad_token))
    tokenizer.add_special_tokens(specials)
    return tokenizer, settings


def write_shards(config, vocab_size: int, tokens: int) -> None:
    rng = np.random.default_rng(0)
    dtype = np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)
    tokenizer, settings = id_tokenizer(vocab_size)
    with StageOutput(DatasetRef.of(config, "tokenize", SNAPSHOT), config, []) as out:
        save_tokenizer(tokenizer, out.path, settings)
        for split, count in (("train", tokens), ("validation", tokens // 50 + 10_000)):
            (out.path / split).mkdir()
            with ShardWriter(out.path / split / "shard-00000-0000", dtype) as writer:
                written = 0
                while written < count:
                    length = int(rng.integers(200, 4000))
                    document = rng.integers(1, vocab_size, length)
                    document[-1] = 0
                    writer.add_document(document.tolist())
                    written += length
        out.commit(
            extra={
                "vocab_size": vocab_size,
                "dtype": dtype.name,
                "eos_token": settings.eos_token,
                "eos_id": 0,
                "pad_token": settings.pad_token,
                "pad_id": 1,
            }
        )


def run_case(root: Path, preset: str, compile_model: bool, args) -> dict:
    from pipeline.train.trainer import train

    attention = "" if args.document_masking else "-causal"
    loss = "" if args.fused_cross_entropy == "off" else f"-ce_{args.fused_cross_entropy}"
    name = f"{preset}-{'compile' if compile_model else 'eager'}{attention}{loss}"
    folder = root / name
    overrides = [
        f"project.data_root={folder / 'data'}",
        f"model.preset={preset}",
        f"train.steps={args.steps}",
        f"train.batch_size={args.batch_size}",
        f"train.seq_len={args.seq_len}",
        "train.precision=bf16",
        f"train.document_masking={str(args.document_masking).lower()}",
        f"train.compile={str(compile_model).lower()}",
        f"train.log_every={args.log_every}",
        f"train.checkpoint_every={args.steps}",
        "train.eval_sequences=8",
        "train.histogram_every=0",
        "tracking.stage_runs=false",
        "tracking.tensorboard=false",
        "tracking.sample_tokens=0",
        "logging.console=false",
        f"distributed.init_method=file://{folder / 'pg'}",
        "distributed.rank=0",
        "distributed.world_size=1",
    ]
    model = {}
    if args.fused_cross_entropy != "off":
        model |= {"fused_cross_entropy": args.fused_cross_entropy}
        model |= {"fused_cross_entropy_chunk_size": args.fused_chunk_size}
    if args.dry_run:
        # Stand-ins with the same structure (dense / MoE every other layer), small enough for a CPU.
        model |= {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
        model |= {"num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 512}
        overrides += ["train.peak_flops=1e12", "distributed.backend=gloo"]
    if model:
        overrides.append(f"model.overrides={json.dumps(model)}")  # JSON is YAML
    config = load_config(None, overrides, environ={})
    from pipeline.train.trainer import build_model_config

    vocab = build_model_config(config, 512 if args.dry_run else 32_768).vocab_size
    write_shards(config, vocab, tokens=args.steps * args.batch_size * (args.seq_len + 1) + 100_000)
    started = time.perf_counter()
    manifest = train(config, SNAPSHOT)
    wall = time.perf_counter() - started
    rows = [
        json.loads(line)
        for line in (DatasetRef.of(config, "train", SNAPSHOT).path / "metrics.jsonl").read_text().splitlines()
    ]
    timed = [row for row in rows if "tokens_per_s" in row][1:]  # the first interval holds compilation
    seconds = sum(row["step_time_s"] * args.log_every for row in timed)
    tokens_per_s = sum(row["tokens"] for row in timed) / seconds
    mfu = [row["mfu"] for row in timed if "mfu" in row]
    result = {
        "case": name,
        # what "auto" becomes here: the backend for bf16 hidden states on this run's device
        "cross_entropy": "plain" if args.fused_cross_entropy == "off" else fused_backend(args),
        "tokens_per_s": round(tokens_per_s, 1),
        "mfu": round(float(np.mean(mfu)), 4) if mfu else None,
        "parameters": manifest.extra["parameters"],
        "active_parameters": manifest.extra["active_parameters"],
        "flops_per_token": manifest.extra["flops_per_token"],
        "memory_gb": rows[-1].get("memory_gb"),
        "final_loss": manifest.extra["final_loss"],
        "wall_s": round(wall, 1),
    }
    print(json.dumps(result), flush=True)
    return result


def fused_backend(args) -> str:
    from pipeline.model.linear_cross_entropy import resolve_backend

    device = "cpu" if args.dry_run else "cuda"
    return resolve_backend(args.fused_cross_entropy, torch.empty(0, dtype=torch.bfloat16, device=device))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes; the figures mean nothing")
    parser.add_argument(
        "--smoke", action="store_true", help=f"the dry run, eager only, fewer steps: {SMOKE_HELP}"
    )
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument(
        "--modes",
        default=None,
        help="comma-separated: eager, compile (torch.compile); default both (--smoke: eager, as compiling "
        "on the CPU takes longer than the rest)",
    )
    parser.add_argument(
        "--presets", default="base,base-moe", help="comma-separated model presets (default: base,base-moe)"
    )
    parser.add_argument(
        "--no-document-masking",
        dest="document_masking",
        action="store_false",
        help="plain causal attention (SDPA's flash path) instead of attending within each packed document",
    )
    parser.add_argument(
        "--fused-cross-entropy",
        choices=FUSED_CROSS_ENTROPY,
        default="off",
        help="the model's fused_cross_entropy: the loss without the batch x seq x vocab logits (default off)",
    )
    parser.add_argument(
        "--fused-chunk-size",
        type=int,
        default=GPTConfig.fused_cross_entropy_chunk_size,
        help="rows per chunk of the chunked backend",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    args.dry_run = args.dry_run or args.smoke
    args.modes = args.modes or ("eager" if args.smoke else "eager,compile")
    if args.dry_run:
        args.steps = args.steps or (4 if args.smoke else 6)
        args.batch_size = args.batch_size or 2
        args.seq_len = args.seq_len or 64
        args.log_every = min(args.log_every, 2)
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no GPU visible: run with --dry-run to exercise the code path on the CPU")
        args.steps = args.steps or 60
        args.batch_size = args.batch_size or 16
        args.seq_len = args.seq_len or 2048
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() and not args.dry_run else "cpu"
    modes = args.modes.split(",")
    if not modes or set(modes) - {"eager", "compile"}:
        parser.error(f"--modes takes eager and/or compile, got {args.modes!r}")
    compile_options = [mode == "compile" for mode in modes]
    results = []
    with tempfile.TemporaryDirectory(prefix="train-gpu-bench-") as folder:
        for preset in args.presets.split(","):
            for compile_model in compile_options:
                results.append(run_case(Path(folder), preset, compile_model, args))
    summary = {
        "device": device,
        "dry_run": args.dry_run,
        "batch": [args.batch_size, args.seq_len],
        "precision": "bf16",
        "document_masking": args.document_masking,
        "fused_cross_entropy": args.fused_cross_entropy,
        "torch": torch.__version__,
        "cases": {r["case"]: {k: v for k, v in r.items() if k != "case"} for r in results},
    }
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
