"""`pretrain generate`: sample text from a training run's checkpoint.

    pretrain generate --snapshot 2026-11-29 --prompt "In the garden" --max-tokens 64 --temperature 0.8

Reads the final checkpoint of the snapshot's latest complete training run (``--run`` names another, and
``--checkpoint`` any checkpoint file or checkpoints folder, such as a run still training), decodes with the
model's KV cache and stops at the end-of-text token. ``--temperature 0`` decodes greedily, which the
exported model reproduces token for token through transformers' ``generate``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.core.arguments import number_in, text
from pipeline.core.storage import DatasetRef, StageFailure
from pipeline.entrypoint import resolve, stage_parser

MIN_TEMPERATURE = 1e-6  # below it logits / temperature overflow to inf and the softmax is NaN


def temperature(value: str) -> float:
    """0 (greedy), or a finite temperature of at least MIN_TEMPERATURE."""
    parsed = number_in(float, 0.0)(value)
    if 0 < parsed < MIN_TEMPERATURE:
        raise argparse.ArgumentTypeError(
            f"{value} is below {MIN_TEMPERATURE:g}, where sampling overflows; use 0 to decode greedily"
        )
    return parsed


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("pretrain generate", __doc__)
    # Every sampling argument is checked here, at parse time: one line and exit status 2, since the sampler
    # itself fails on a negative temperature, top_p 0 or 1.5 and top_k 0 with a traceback.
    parser.add_argument(
        "--prompt", action="append", required=True, type=text, help="text to continue (repeatable)"
    )
    parser.add_argument(
        "--max-tokens", type=number_in(int, 1), default=64, help="new tokens at most (default: 64)"
    )
    parser.add_argument(
        "--temperature",
        type=temperature,
        default=0.8,
        help="0 decodes greedily; above 0 samples (default: 0.8)",
    )
    parser.add_argument(
        "--top-k", type=number_in(int, 1), default=None, help="sample among the k most likely tokens (>= 1)"
    )
    parser.add_argument(
        "--top-p",
        type=number_in(float, 0.0, 1.0, low_open=True),
        default=None,
        help="nucleus sampling: keep the most likely tokens up to probability p, in (0, 1]",
    )
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default: project.seed)")
    parser.add_argument("--run", default=None, help="training run id (default: the latest complete run)")
    parser.add_argument(
        "--checkpoint", type=Path, default=None, help="a step-*.pt file or a checkpoints folder"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    return parser


def generate(argv: list[str] | None = None) -> list[dict]:
    import torch
    from tokenizers import Tokenizer

    from pipeline.model.inference import continue_ids, load_model
    from pipeline.model.trained import TrainedRun

    args = build_parser().parse_args(argv)
    if args.run:
        args.overrides = [f"train.run_id={args.run}", *args.overrides]
    config, snapshot = resolve(args)
    if args.checkpoint is not None:
        model = load_model(args.checkpoint)
        tokenizer_file = DatasetRef.of(config, "tokenize", snapshot).require().path / "tokenizer.json"
        eos_token = config.bpe.eos_token
    else:
        trained = TrainedRun.of(DatasetRef.of(config, "train", snapshot))
        model, tokenizer_file = trained.model(), trained.tokenizer_file
        eos_token = trained.tokenize.extra["eos_token"]
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokenizer.encode_special_tokens = True  # as the tokenize stage encoded the training text
    stop = tokenizer.token_to_id(eos_token)
    if stop is None:
        raise StageFailure(f"the tokenizer has no end-of-text token {eos_token!r}")
    generator = torch.Generator().manual_seed(config.project.seed if args.seed is None else args.seed)
    results = []
    for prompt in args.prompt:
        ids = tokenizer.encode(prompt, add_special_tokens=False).ids or [stop]
        budget = min(args.max_tokens, model.config.max_position_embeddings - len(ids))
        if budget < 0:
            raise StageFailure(
                f"the prompt is {len(ids)} tokens; the context is {model.config.max_position_embeddings}"
            )
        continuation = continue_ids(
            model,
            ids,
            budget,
            stop,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            generator=generator,
        )
        results.append(
            {
                "prompt": prompt,
                "completion": tokenizer.decode(continuation.new_ids),
                "tokens": len(continuation.new_ids),
                "stopped_at_eos": continuation.stopped,
            }
        )
    return results


def main(argv: list[str] | None = None) -> int:
    for result in generate(argv):
        if "--json" in (argv if argv is not None else sys.argv[1:]):
            print(json.dumps(result, ensure_ascii=False))
        else:
            end = " <|end of text|>" if result["stopped_at_eos"] else ""
            print(f"{result['prompt']}{result['completion']}{end}")
    return 0


if __name__ == "__main__":
    from pipeline.core.cli import run_cli

    raise SystemExit(run_cli(main))
