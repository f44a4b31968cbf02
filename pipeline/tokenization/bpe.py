"""Byte-level BPE tokenizer training with HF tokenizers."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from pipeline.core.config import TokenizerConfig

TOKENIZER_FILE = "tokenizer.json"


def special_tokens(config: TokenizerConfig) -> list[str]:
    reserved = [f"<|reserved_{i}|>" for i in range(config.reserved_tokens)]
    return [config.eos_token, config.pad_token, *reserved]


def train_tokenizer(texts: Iterable[str], config: TokenizerConfig) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=special_tokens(config),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def load_tokenizer(path: str | Path) -> Tokenizer:
    path = Path(path)
    if path.is_dir():
        path = path / TOKENIZER_FILE
    return Tokenizer.from_file(str(path))
