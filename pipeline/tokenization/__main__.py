"""`python -m pipeline.tokenization` / `pretrain tokenize`: train a BPE and encode the finished (deduplicated)
documents into shards.

Writes tokenizer.json and Megatron MMIDIDX token shards (train/, validation/) under
<data_root>/<corpus>/tokenize/<snapshot>/. Main settings: tokenizer.vocab_size, tokenizer.split_cjk,
tokenize.validation_fraction, tokenize.max_tokens_per_shard, tokenize.num_shards. Format: docs/token-shards.md.
"""

from __future__ import annotations

from pipeline.core.cli import run_cli
from pipeline.entrypoint import stage_main


def main(argv: list[str] | None = None) -> int:
    from pipeline.tokenization.job import run

    return stage_main(argv, stage="tokenize", description=__doc__, run=run)


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
