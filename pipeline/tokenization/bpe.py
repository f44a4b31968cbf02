"""Byte-level BPE tokenizer training with HF tokenizers.

Pipeline: Unicode normaliser (``bpe.unicode_form``, NFC by default) -> (optional) one pre-token per CJK
ideograph -> GPT-2 byte-level pre-tokenizer -> BPE. Everything after the normaliser is lossless, so
``decode(encode(x)) == unicodedata.normalize(form, x)`` for any valid text x that holds no special-token string
(the stage encodes those as plain text, see ``encoder``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from pipeline.data.tokenizer_files import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE
from pipeline.tokenization.config import TokenizerConfig

# The code point blocks BERT's _is_chinese_char treats as CJK ideographs (Hangul and kana are not in them).
CJK_RANGES = (
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xF900, 0xFAFF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0x2F800, 0x2FA1F),
)


def cjk_pattern() -> str:
    return "[" + "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in CJK_RANGES) + "]"


def special_tokens(config: TokenizerConfig) -> list[str]:
    reserved = [f"<|reserved_{i}|>" for i in range(config.reserved_tokens)]
    return [config.eos_token, config.pad_token, *reserved]


def build_tokenizer(config: TokenizerConfig) -> Tokenizer:
    """An untrained tokenizer with the full normaliser / pre-tokenizer / decoder pipeline."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = {"NFC": normalizers.NFC, "NFKC": normalizers.NFKC}[config.unicode_form]()
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if config.split_cjk:
        # BERT inserts spaces around each ideograph; "isolated" splitting gives the same pre-tokens
        # without changing the text, so decoding still restores it exactly.
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(cjk_pattern()), behavior="isolated"), byte_level]
        )
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def train_tokenizer(texts: Iterable[str], config: TokenizerConfig) -> Tokenizer:
    tokenizer = build_tokenizer(config)
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=special_tokens(config),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def save_tokenizer(tokenizer: Tokenizer, folder: Path, config: TokenizerConfig) -> Path:
    """``tokenizer.json`` plus the ``tokenizer_config.json`` that lets ``AutoTokenizer.from_pretrained(folder)``
    find the special tokens; ``PreTrainedTokenizerFast(tokenizer_file=...)`` needs only the first."""
    folder = Path(folder)
    path = folder / TOKENIZER_FILE
    tokenizer.save(str(path))
    write_tokenizer_config(folder, config.eos_token, config.pad_token, special_tokens(config)[2:])
    return path


def write_tokenizer_config(
    folder: Path, eos_token: str, pad_token: str | None, additional: list[str]
) -> None:
    """``tokenizer_config.json``: the special tokens by name, as transformers reads them. Documents follow an
    end-of-text token, so it is the bos token too."""
    hf_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": eos_token,
        "bos_token": eos_token,
        "pad_token": pad_token,
        "additional_special_tokens": additional,
        "clean_up_tokenization_spaces": False,
        "add_prefix_space": False,
        "model_max_length": 1 << 30,
    }
    (Path(folder) / TOKENIZER_CONFIG_FILE).write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")


def load_tokenizer(path: str | Path) -> Tokenizer:
    path = Path(path)
    if path.is_dir():
        path = path / TOKENIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer at {path}")
    return Tokenizer.from_file(str(path))
