"""The exported tokenizer files: AutoTokenizer (offline, from the folder) gives exactly the ids the tokenize
stage writes, on English, Chinese (CJK splitting on and off), code, byte-fallback text and special-token
strings inside text, and decodes them back."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.export.job import save_tokenizer_files
from pipeline.tokenization.bpe import save_tokenizer, special_tokens, train_tokenizer
from pipeline.tokenization.config import TokenizerConfig
from pipeline.tokenization.encoder import DocumentEncoder

TRAINING_TEXT = [
    "The bees are in the garden, and the garden is in bloom. " * 3,
    "def main(argv):\n    return sum(int(x) for x in argv)  # tabs\tand spaces\n",
    "今天的天气很好，我们去公园散步。春眠不觉晓，处处闻啼鸟。",
    "Numbers 12345 and e-mail like a@b.c; émigré café naïve.",
]
SAMPLES = [
    "In the garden, the bees hum.",
    "夜来风雨声，花落知多少。今天的天气很好",
    "for i in range(10):\n\tprint(f'{i:>3}')  # comment\r\n",
    "emoji 🐝🌸, rare script ᚠᛇᚻ, control \x07 bytes and U+FFFD \ufffd",
    "a literal <|endoftext|> and <|pad|> inside a document",
    "  leading spaces and trailing  ",
]


@pytest.fixture(scope="module", params=[False, True], ids=["cjk-off", "cjk-on"])
def tokenizers(request, tmp_path_factory):
    from transformers import AutoTokenizer

    config = TokenizerConfig(vocab_size=400, min_frequency=1, split_cjk=request.param)
    tokenizer = train_tokenizer(TRAINING_TEXT * 5, config)
    source = tmp_path_factory.mktemp("tokenize")
    save_tokenizer(tokenizer, source, config)
    folder = tmp_path_factory.mktemp("export")
    added = special_tokens(config)[2:]
    save_tokenizer_files(source / "tokenizer.json", config.eos_token, config.pad_token, added, folder, 256)
    encoder = DocumentEncoder.for_tokenizer(tokenizer, config.eos_token, chunk_chars=100_000)
    return encoder, AutoTokenizer.from_pretrained(folder, local_files_only=True), config


def stage_ids(encoder: DocumentEncoder, text: str) -> list[int]:
    tokens, _ = encoder.encode([text])
    return tokens[:-1].tolist()  # the stage appends end-of-text after each document


@pytest.mark.parametrize("text", SAMPLES)
def test_autotokenizer_gives_the_stage_ids(tokenizers, text):
    encoder, auto, _ = tokenizers
    ids = auto(text)["input_ids"]
    assert ids == stage_ids(encoder, text)
    assert auto.decode(ids) == encoder.tokenizer.decode(ids, skip_special_tokens=False)


def test_special_tokens_are_named(tokenizers):
    encoder, auto, config = tokenizers
    assert auto.eos_token == auto.bos_token == config.eos_token and auto.pad_token == config.pad_token
    assert auto.eos_token_id == encoder.eos_id


@settings(max_examples=60, deadline=None)
@given(text=st.text(st.characters(codec="utf-8"), max_size=80))
def test_autotokenizer_gives_the_stage_ids_on_random_text(tokenizers, text):
    encoder, auto, _ = tokenizers
    assert auto(text)["input_ids"] == stage_ids(encoder, text)
