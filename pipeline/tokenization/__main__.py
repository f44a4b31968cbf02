"""`python -m pipeline.tokenization` / `pretrain tokenize`: encode the finished (deduplicated) documents into
shards with the corpus's shared tokenizer.

Writes Megatron MMIDIDX token shards (train/, validation/) and a copy of the tokenizer used under
<data_root>/<corpus>/tokenize/<snapshot>/. tokenize.tokenizer picks it: default (the corpus's; the first
snapshot tokenized trains and stores one when there is none), a stored NAME or CORPUS/NAME (`pretrain
tokenizer`), or snapshot (a BPE of this snapshot's own). Other settings: bpe.vocab_size,
bpe.split_cjk (a BPE trained here), tokenize.validation_fraction, tokenize.max_tokens_per_shard,
tokenize.num_shards. Format: docs/token-shards.md.
"""

from __future__ import annotations

from pipeline.core.cli import run_cli
from pipeline.core.proc import exit_now
from pipeline.entrypoint import stage_main


def main(argv: list[str] | None = None) -> int:
    return stage_main(argv, stage="tokenize", description=__doc__)


if __name__ == "__main__":
    exit_now(run_cli(main))  # without the interpreter's teardown: see pipeline.core.proc.exit_now
