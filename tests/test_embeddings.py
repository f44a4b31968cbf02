"""pipeline.embeddings: the bundled model runs on our own BERT (pipeline.embeddings.bert), checked against
sentence-transformers itself; damaged weights are refused; other models fall back to sentence-transformers."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from pipeline.embeddings import (
    BUNDLED_MODEL,
    EncoderConfig,
    SentenceTransformerEncoder,
    embed_batches,
    embedding_dim,
    encode,
    load_encoder,
    model_path,
)
from pipeline.embeddings.bert import BertSentenceEncoder, WeightsError, plain_bert_reason

BUNDLED = Path(model_path(BUNDLED_MODEL))
ATOL = 1e-5

EDGE_TEXTS = [
    "",
    " ",
    "\n\t",
    "a",
    "The river turned the mill wheel all winter long.",
    "Café, naïve façade; Ångström über Straße. Ελληνικά και русский текст.",
    "我们今天去北京看长城。東京は日本の首都です。한국어 문장입니다.",
    "emoji 😀🚀 and symbols ∑ ∫ √ ≠ — “quoted” ‘text’ … \u200b zero width",
    "literal [CLS] and [SEP] and [PAD] and [MASK] and [UNK] in the text",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism " * 3,
    "word " * 600,  # far past 256 and 512 tokens
    "长" * 700,  # one token per ideograph: truncated too
]


VOCABULARY = (
    "the of and a to in is you that it he was for on are as with his they I at be this have from or",
    "one had by word but not what all were we when your can said there use an each which she do how",
    "sourdough qubit mill wheel river unbelievable tokenization 1999 3.14 42 % $ @ # ( ) , . ! ? ; :",
    "é à ß ø ç 北京 長城 東京 한국 Москва Ελλάδα עברית العربية हिन्दी 😀 🚀 ∑",
)


def random_texts(count: int, seed: int) -> list[str]:
    """Texts of 0 to ~700 words drawn from English words, word pieces, digits, punctuation and other scripts."""
    rng = np.random.default_rng(seed)
    vocabulary = [word for line in VOCABULARY for word in line.split()]
    texts = []
    for _ in range(count):
        length = int(rng.choice([0, 1, 3, 10, 40, 120, 300, 700]))
        words = rng.choice(vocabulary, size=length)
        texts.append(" ".join(words))
    return texts


def real_texts() -> list[str]:
    """Paragraphs of this repository's documentation: real prose, code, tables and long runs."""
    root = Path(__file__).resolve().parent.parent / "docs"
    paragraphs = []
    for name in ("quality.md", "dedup.md", "training.md"):
        paragraphs += [p for p in (root / name).read_text(encoding="utf-8").split("\n\n") if p.strip()][:4]
    return paragraphs


TEXTS = EDGE_TEXTS + random_texts(12, seed=0) + real_texts()


def reference(max_seq_length: int):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(BUNDLED), device="cpu")
    model.max_seq_length = max_seq_length
    return model


@pytest.fixture(scope="module")
def st_256():
    return reference(256)


def test_the_bundled_model_runs_on_our_bert():
    assert plain_bert_reason(BUNDLED) is None
    encoder = load_encoder(BUNDLED_MODEL, 256)
    assert isinstance(encoder, BertSentenceEncoder)
    assert embedding_dim(EncoderConfig()) == 384
    assert encoder.added_token_ids == {0, 101, 102}  # [PAD], [CLS], [SEP]


def assert_tokens_match(ours, outputs):
    """``ours``: TokenVectors per text; ``outputs``: sentence-transformers' ``output_value=None`` dicts."""
    assert len(ours) == len(outputs)
    for tokens, output in zip(ours, outputs, strict=True):
        keep = output["attention_mask"].bool()
        np.testing.assert_array_equal(tokens.ids, output["input_ids"][keep].numpy())
        assert tokens.vectors.dtype == np.float32
        np.testing.assert_allclose(
            tokens.vectors, output["token_embeddings"][keep].numpy(), rtol=0, atol=ATOL
        )


@pytest.mark.parametrize("batch_size", [1, 64])
def test_sentence_and_token_embeddings_match_sentence_transformers(st_256, batch_size):
    config = EncoderConfig(batch_size=batch_size)
    ours = encode(TEXTS, config)
    theirs = st_256.encode(TEXTS, batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False)
    assert ours.dtype == np.float32 and ours.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=ATOL)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-5)

    tokens = load_encoder(BUNDLED_MODEL, 256).token_embeddings(TEXTS, batch_size)
    assert_tokens_match(
        tokens, st_256.encode(TEXTS, batch_size=batch_size, output_value=None, show_progress_bar=False)
    )
    lengths = [len(text_tokens.ids) for text_tokens in tokens]
    assert max(lengths) == 256 and min(lengths) == 2  # truncated with [SEP] kept; "" is [CLS] [SEP]


@pytest.mark.parametrize("max_seq_length", [16, 512])
def test_truncation_to_other_lengths_matches_sentence_transformers(max_seq_length):
    texts = EDGE_TEXTS + real_texts()[:3]
    model = reference(max_seq_length)
    config = EncoderConfig(max_seq_length=max_seq_length, batch_size=8)
    theirs = model.encode(texts, batch_size=8, normalize_embeddings=True, show_progress_bar=False)
    np.testing.assert_allclose(encode(texts, config), theirs, rtol=0, atol=ATOL)
    ours = load_encoder(BUNDLED_MODEL, max_seq_length).token_embeddings(texts, 8)
    assert_tokens_match(ours, model.encode(texts, batch_size=8, output_value=None, show_progress_bar=False))
    assert max(len(tokens.ids) for tokens in ours) == max_seq_length


def test_no_texts_and_embed_batches():
    config = EncoderConfig()
    assert encode([], config).shape == (0, 384)
    batch = pa.RecordBatch.from_pydict({"id": ["a", "b"], "text": ["first text", "второй текст"]})
    (out,) = embed_batches(iter([batch]), config)
    assert out.column("id").to_pylist() == ["a", "b"]
    vectors = np.array(out.column("embedding").to_pylist(), dtype=np.float32)
    np.testing.assert_array_equal(vectors, encode(["first text", "второй текст"], config))


def test_loading_and_encoding_imports_neither_sentence_transformers_nor_transformers():
    probe = (
        "import sys\n"
        "from pipeline.embeddings import EncoderConfig, encode\n"
        "encode(['a text'], EncoderConfig())\n"
        "print(sorted(m for m in ('sentence_transformers', 'transformers', 'sklearn') if m in sys.modules))\n"
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=root, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


# --- a copy of the bundled folder, changed


def copy_of_bundled(folder: Path) -> Path:
    """The bundled folder's files linked into ``folder`` (the big weights too), so that a test replaces just
    the one it changes."""
    for source in BUNDLED.rglob("*"):
        if source.is_file():
            target = folder / source.relative_to(BUNDLED)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source)
    return folder


def replace_json(folder: Path, name: str, change) -> None:
    path = folder / name
    value = json.loads(path.read_text(encoding="utf-8"))
    value = change(value) or value
    path.unlink()
    path.write_text(json.dumps(value), encoding="utf-8")


def bundled_tensors() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(BUNDLED / "model.safetensors")


def write_weights(folder: Path, tensors: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    path = folder / "model.safetensors"
    path.unlink()
    save_file(tensors, path)
    return path


def damaged(tensors):
    """Each way of damaging a weights file, and the words its error must say."""
    wrong_shape = dict(tensors)
    wrong_shape["encoder.layer.2.intermediate.dense.weight"] = torch.zeros(1000, 384)
    missing = {k: v for k, v in tensors.items() if k != "encoder.layer.5.output.LayerNorm.bias"}
    unexpected = dict(tensors)
    unexpected["encoder.layer.6.output.dense.bias"] = torch.zeros(384)
    wrong_dtype = dict(tensors)
    wrong_dtype["embeddings.position_ids"] = torch.zeros(1, 512, dtype=torch.float32)
    return {
        "wrong shape": (
            wrong_shape,
            "encoder.layer.2.intermediate.dense.weight is torch.float32 (1000, 384)",
        ),
        "missing": (missing, "missing encoder.layer.5.output.LayerNorm.bias"),
        "unexpected": (unexpected, "unexpected encoder.layer.6.output.dense.bias"),
        "wrong dtype": (
            wrong_dtype,
            "embeddings.position_ids is torch.float32 (1, 512), expected torch.int64",
        ),
    }


@pytest.mark.parametrize("case", ["wrong shape", "missing", "unexpected", "wrong dtype"])
def test_mismatched_weights_are_refused_with_one_error_naming_the_file(tmp_path, case):
    folder = copy_of_bundled(tmp_path)
    tensors, words = damaged(bundled_tensors())[case]
    path = write_weights(folder, tensors)
    assert plain_bert_reason(folder) is None  # not handed to sentence-transformers: refused
    with pytest.raises(WeightsError, match=re.escape(str(path))) as raised:
        load_encoder(str(folder), 256)
    assert words in str(raised.value)


def test_weights_of_another_shape_than_config_json_are_refused(tmp_path):
    folder = copy_of_bundled(tmp_path)
    replace_json(folder, "config.json", lambda config: config.update(num_hidden_layers=7, hidden_size=768))
    with pytest.raises(WeightsError) as raised:
        load_encoder(str(folder), 256)
    message = str(raised.value)
    assert str(folder / "model.safetensors") in message and "7 layers, hidden size 768" in message
    assert "missing encoder.layer.6.attention.self.query.weight" in message
    assert (
        "embeddings.word_embeddings.weight is torch.float32 (30522, 384), expected torch.float32 (30522, 768)"
        in (message)
    )


@pytest.mark.parametrize("cut", ["truncated", "garbage", "empty"])
def test_a_damaged_weights_file_is_refused(tmp_path, cut):
    folder = copy_of_bundled(tmp_path)
    data = (BUNDLED / "model.safetensors").read_bytes()
    path = folder / "model.safetensors"
    path.unlink()
    path.write_bytes(
        {"truncated": data[: len(data) - 4096], "garbage": b"\x00not safetensors" * 64, "empty": b""}[cut]
    )
    with pytest.raises(WeightsError, match=re.escape(f"{path}: not a readable safetensors file")):
        load_encoder(str(folder), 256)


# --- other shapes of model fall back to sentence-transformers


def test_what_is_not_a_plain_bert_says_why(tmp_path):
    assert plain_bert_reason(Path("sentence-transformers/all-mpnet-base-v2")) == "not a local folder"
    changes = {
        "cls pooling": (
            "1_Pooling/config.json",
            lambda c: c.update(pooling_mode_cls_token=True, pooling_mode_mean_tokens=False),
            "not mean pooling alone",
        ),
        "no normalize": ("modules.json", lambda m: m[:2], "modules.json is not"),
        "a dense layer": (
            "modules.json",
            lambda m: [
                *m[:2],
                {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
            ],
            "modules.json is not",
        ),
        "roberta": ("config.json", lambda c: c.update(model_type="roberta"), "not a BERT encoder"),
        "tanh gelu": ("config.json", lambda c: c.update(hidden_act="gelu_new"), "not a BERT encoder"),
        "relative positions": (
            "config.json",
            lambda c: c.update(position_embedding_type="relative_key"),
            "not a BERT encoder",
        ),
        "lower-casing": ("sentence_bert_config.json", lambda c: c.update(do_lower_case=True), "more than"),
        "a prompt": (
            "config_sentence_transformers.json",
            lambda c: c.update(prompts={"query": "query: "}, default_prompt_name="query"),
            "default prompt",
        ),
        "tokenizer settings": (
            "tokenizer_config.json",
            lambda c: c.update(do_lower_case=False),
            "do_lower_case",
        ),
        "another tokenizer": (
            "tokenizer_config.json",
            lambda c: c.update(tokenizer_class="XLMRobertaTokenizer"),
            "names",
        ),
    }
    for case, (name, change, words) in changes.items():
        folder = copy_of_bundled(tmp_path / case.replace(" ", "_"))
        replace_json(folder, name, change)
        reason = plain_bert_reason(folder)
        assert reason is not None and words in reason, (case, reason)

    half = copy_of_bundled(tmp_path / "half")
    write_weights(half, {k: v.half() if v.is_floating_point() else v for k, v in bundled_tensors().items()})
    assert "not float32" in plain_bert_reason(half)
    no_tokenizer = copy_of_bundled(tmp_path / "no_tokenizer")
    (no_tokenizer / "tokenizer.json").unlink()
    assert plain_bert_reason(no_tokenizer) == "no tokenizer.json"


def test_a_model_of_another_shape_runs_on_sentence_transformers(tmp_path, st_256):
    """CLS pooling: load_encoder hands the folder to sentence-transformers, which honours it; the same BERT
    underneath gives the same token vectors as ours."""
    from sentence_transformers import SentenceTransformer

    folder = copy_of_bundled(tmp_path)
    replace_json(
        folder,
        "1_Pooling/config.json",
        lambda c: c.update(pooling_mode_cls_token=True, pooling_mode_mean_tokens=False),
    )
    config = EncoderConfig(model=str(folder), batch_size=8)
    encoder = load_encoder(config.model, config.max_seq_length)
    assert isinstance(encoder, SentenceTransformerEncoder)
    texts = TEXTS[:20]
    cls_model = SentenceTransformer(str(folder), device="cpu")
    cls_model.max_seq_length = 256
    theirs = cls_model.encode(texts, batch_size=8, normalize_embeddings=True, show_progress_bar=False)
    ours = encode(texts, config)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=ATOL)
    assert embedding_dim(config) == 384
    mean_pooled = encode(texts, EncoderConfig(batch_size=8))
    assert np.abs(ours - mean_pooled).max() > 0.01  # CLS pooling, not ours in disguise
    assert encoder.added_token_ids == load_encoder(BUNDLED_MODEL, 256).added_token_ids
    bert_tokens = load_encoder(BUNDLED_MODEL, 256).token_embeddings(texts, 8)
    for a, b in zip(encoder.token_embeddings(texts, 8), bert_tokens, strict=True):
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_allclose(a.vectors, b.vectors, rtol=0, atol=ATOL)
