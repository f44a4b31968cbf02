"""A BERT sentence encoder in one file: what sentence-transformers computes for a model whose pipeline is
exactly Transformer (a BERT) -> Pooling (mean) -> Normalize, without importing sentence-transformers.

Importing sentence_transformers pulls in transformers, scikit-learn and more (about 8 s on an idle 2-core
machine, most of the quality stage's fixed cost); this file needs only torch, ``tokenizers`` and
``safetensors`` (which sentence-transformers installs). ``plain_bert_reason`` reads a model folder's
JSON files and says why a folder is not such a model; ``pipeline.embeddings.load_encoder`` hands every
other model (other architectures, other poolings, hub names) to sentence-transformers.

The math is transformers' ``BertModel`` in eval mode (post-LN layers, exact erf GELU, absolute positions),
then mean pooling over the attention mask and L2 normalisation; ``tests/test_embeddings.py`` compares
both sentence and token vectors with sentence-transformers itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# modules.json "type": the current names and the pre-v5 ones older folders (the bundled one) carry
TRANSFORMER = {"sentence_transformers.models.Transformer", "sentence_transformers.base.modules.transformer"}
POOLING = {
    "sentence_transformers.models.Pooling",
    "sentence_transformers.sentence_transformer.modules.pooling",
}
NORMALIZE = {"sentence_transformers.models.Normalize", "sentence_transformers.base.modules.normalize"}
# 1_Pooling/config.json: every mode but the mean must be off
OTHER_POOLING_MODES = (
    "pooling_mode_cls_token",
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
    "pooling_mode_lasttoken",
)
BERT_TOKENIZER_CLASSES = {None, "BertTokenizer", "BertTokenizerFast"}


class WeightsError(ValueError):
    """A weights file that does not hold exactly the tensors its config.json describes."""


class TokenVectors(NamedTuple):
    """One text's tokens, padding removed: their ids and their last-layer vectors (float32, not normalised)."""

    ids: np.ndarray  # (tokens,) int64
    vectors: np.ndarray  # (tokens, dim) float32


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float

    @classmethod
    def from_json(cls, config: dict[str, Any]) -> BertConfig:
        return cls(**{name: config[name] for name in cls.__dataclass_fields__})


class Embeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, ids: torch.Tensor, token_types: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.size(1), device=ids.device)
        return self.norm(self.word(ids) + self.token_type(token_types) + self.position(positions))


class Layer(nn.Module):
    """Post-LN: x = norm(x + attention(x)), then x = norm(x + mlp(x))."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.heads = config.num_attention_heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.attention_out = nn.Linear(hidden, hidden)
        self.attention_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.up = nn.Linear(hidden, config.intermediate_size)
        self.down = nn.Linear(config.intermediate_size, hidden)
        self.mlp_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, attend: torch.Tensor) -> torch.Tensor:
        """x (batch, seq, hidden); attend (batch, 1, 1, seq), True at the tokens (not padding) to attend to."""
        batch, seq, hidden = x.shape
        q, k, v = (
            projection(x).view(batch, seq, self.heads, hidden // self.heads).transpose(1, 2)
            for projection in (self.query, self.key, self.value)
        )
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=attend)
        x = self.attention_norm(x + self.attention_out(attended.transpose(1, 2).reshape(batch, seq, hidden)))
        return self.mlp_norm(x + self.down(F.gelu(self.up(x))))  # BERT's "gelu" is the exact (erf) one


class Bert(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.num_hidden_layers))

    def forward(
        self, ids: torch.Tensor, token_types: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        """The last layer's vectors (batch, seq, hidden); padding rows hold values nothing should read."""
        x = self.embeddings(ids, token_types)
        attend = attention_mask.bool()[:, None, None, :]
        for layer in self.layers:
            x = layer(x, attend)
        return x


def checkpoint_names(config: BertConfig) -> dict[str, str]:
    """transformers' ``BertModel`` parameter names (as in model.safetensors) -> ours."""
    names = {
        "embeddings.word_embeddings.weight": "embeddings.word.weight",
        "embeddings.position_embeddings.weight": "embeddings.position.weight",
        "embeddings.token_type_embeddings.weight": "embeddings.token_type.weight",
        "embeddings.LayerNorm.weight": "embeddings.norm.weight",
        "embeddings.LayerNorm.bias": "embeddings.norm.bias",
    }
    per_layer = {
        "attention.self.query": "query",
        "attention.self.key": "key",
        "attention.self.value": "value",
        "attention.output.dense": "attention_out",
        "attention.output.LayerNorm": "attention_norm",
        "intermediate.dense": "up",
        "output.dense": "down",
        "output.LayerNorm": "mlp_norm",
    }
    for i in range(config.num_hidden_layers):
        for theirs, ours in per_layer.items():
            for kind in ("weight", "bias"):
                names[f"encoder.layer.{i}.{theirs}.{kind}"] = f"layers.{i}.{ours}.{kind}"
    return names


def unused_tensors(config: BertConfig) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Tensors a BertModel file may also hold, which sentence embeddings never read: the pooler (BertModel's
    [CLS] head) and the position-id buffer older transformers versions saved. Checked, then dropped."""
    hidden = config.hidden_size
    return {
        "pooler.dense.weight": ((hidden, hidden), torch.float32),
        "pooler.dense.bias": ((hidden,), torch.float32),
        "embeddings.position_ids": ((1, config.max_position_embeddings), torch.int64),
    }


def load_weights(model: Bert, path: Path) -> None:
    """Load ``path`` into ``model`` after checking the file whole: readable, every expected tensor present with
    its shape and dtype (float32), nothing unexpected. Any problem raises one ``WeightsError`` naming the file
    and listing them all."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(path)
    except (SafetensorError, OSError) as error:
        raise WeightsError(f"{path}: not a readable safetensors file: {error}") from error
    names = checkpoint_names(model.config)
    ours = model.state_dict()
    expected = {theirs: (tuple(ours[name].shape), torch.float32) for theirs, name in names.items()}
    optional = unused_tensors(model.config)
    problems = [f"missing {name}" for name in sorted(expected.keys() - tensors.keys())]
    problems += [f"unexpected {name}" for name in sorted(tensors.keys() - expected.keys() - optional.keys())]
    for name, tensor in sorted(tensors.items()):
        shape, dtype = expected.get(name) or optional.get(name) or (None, None)
        if shape is not None and (tuple(tensor.shape), tensor.dtype) != (shape, dtype):
            problems.append(f"{name} is {tensor.dtype} {tuple(tensor.shape)}, expected {dtype} {shape}")
    if problems:
        raise WeightsError(
            f"{path} does not hold the weights its config.json describes "
            f"({model.config.num_hidden_layers} layers, hidden size {model.config.hidden_size}): "
            + "; ".join(problems)
        )
    model.load_state_dict({names[theirs]: tensors[theirs] for theirs in names}, strict=True, assign=True)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def plain_bert_reason(folder: Path) -> str | None:
    """None when ``folder`` is a sentence-transformers model this file runs exactly (Transformer with a BERT and
    its tokenizer.json -> mean Pooling -> Normalize, float32 safetensors weights); otherwise why not."""
    if not folder.is_dir():
        return "not a local folder"
    for name in (
        "modules.json",
        "config.json",
        "tokenizer.json",
        "model.safetensors",
        "1_Pooling/config.json",
    ):
        if not (folder / name).is_file():
            return f"no {name}"
    modules = read_json(folder / "modules.json")
    kinds = [(module.get("type"), module.get("path")) for module in modules]
    if (
        len(kinds) != 3
        or kinds[0] not in {(kind, "") for kind in TRANSFORMER}
        or kinds[1] not in {(kind, "1_Pooling") for kind in POOLING}
        or kinds[2][0] not in NORMALIZE
    ):
        return f"modules.json is not Transformer -> Pooling (1_Pooling) -> Normalize: {kinds}"
    pooling = read_json(folder / "1_Pooling/config.json")
    if not pooling.get("pooling_mode_mean_tokens") or any(pooling.get(mode) for mode in OTHER_POOLING_MODES):
        return f"1_Pooling/config.json is not mean pooling alone: {pooling}"
    if not pooling.get("include_prompt", True):
        return "1_Pooling/config.json leaves the prompt out of the mean"
    if (folder / "sentence_bert_config.json").is_file():
        transformer = read_json(folder / "sentence_bert_config.json")
        if transformer.get("do_lower_case") or set(transformer) - {"max_seq_length", "do_lower_case"}:
            return f"sentence_bert_config.json asks for more than a maximum length: {transformer}"
    settings = folder / "config_sentence_transformers.json"
    if settings.is_file() and read_json(settings).get("default_prompt_name"):
        return "config_sentence_transformers.json prepends a default prompt"
    config = read_json(folder / "config.json")
    if (
        config.get("model_type") != "bert"
        or config.get("hidden_act") != "gelu"
        or config.get("position_embedding_type", "absolute") != "absolute"
        or config.get("is_decoder")
        or config.get("add_cross_attention")
    ):
        return "config.json is not a BERT encoder with absolute positions and exact GELU"
    if missing := [name for name in BertConfig.__dataclass_fields__ if name not in config]:
        return f"config.json lacks {missing}"
    dtypes = weight_dtypes(folder / "model.safetensors")
    if dtypes is not None and dtypes - {"F32", "I64"}:
        return f"model.safetensors holds {sorted(dtypes)} tensors, not float32"
    return tokenizer_reason(folder)


def weight_dtypes(path: Path) -> set[str] | None:
    """The dtypes a safetensors file's header lists (8 bytes of header length, then JSON); None where it cannot
    be read, so that such a file goes on to ``load_weights`` and its one clear error."""
    try:
        with path.open("rb") as file:
            size = int.from_bytes(file.read(8), "little")
            if size > 100_000_000:
                return None
            header = json.loads(file.read(size))
        return {entry["dtype"] for name, entry in header.items() if name != "__metadata__"}
    except (ValueError, KeyError, TypeError, AttributeError, OSError):
        return None


def tokenizer_reason(folder: Path) -> str | None:
    """transformers' BERT tokenizer applies tokenizer_config.json's lower-casing, accent and Chinese-character
    settings over tokenizer.json's normaliser; run here only where the two agree (or the former is absent)."""
    if not (folder / "tokenizer_config.json").is_file():
        return None
    settings = read_json(folder / "tokenizer_config.json")
    if settings.get("tokenizer_class") not in BERT_TOKENIZER_CLASSES:
        return f"tokenizer_config.json names {settings.get('tokenizer_class')}"
    normalizer = read_json(folder / "tokenizer.json").get("normalizer") or {}
    if normalizer.get("type") != "BertNormalizer":
        return "tokenizer.json's normaliser is not BERT's"
    pairs = (
        ("do_lower_case", "lowercase", True),
        ("strip_accents", "strip_accents", None),
        ("tokenize_chinese_chars", "handle_chinese_chars", True),
    )
    for setting, field, default in pairs:
        if settings.get(setting, default) != normalizer.get(field, default):
            return f"tokenizer_config.json's {setting} differs from tokenizer.json's {field}"
    return None


class BertSentenceEncoder:
    """A plain-BERT sentence-transformers folder (see ``plain_bert_reason``), run with this file's ``Bert``
    and the ``tokenizers`` library: truncation to ``max_seq_length`` tokens, specials included, padding
    per batch."""

    def __init__(self, folder: Path, max_seq_length: int) -> None:
        from tokenizers import Tokenizer

        config = BertConfig.from_json(read_json(folder / "config.json"))
        if max_seq_length > config.max_position_embeddings:
            raise ValueError(
                f"max_seq_length {max_seq_length} exceeds the {config.max_position_embeddings} positions of {folder}"
            )
        self.max_seq_length = max_seq_length
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()  # a saved tokenizer.json may pad to a fixed length; batches pad below
        self.tokenizer.enable_truncation(max_seq_length)
        # Built on the CPU with its random initialisation (0.1-0.3 s), then the file's tensors take the parameters'
        # place (assign): built on the meta device instead, the first use of meta kernels imports ~800 modules (3 s).
        self.model = Bert(config)
        load_weights(self.model, folder / "model.safetensors")
        self.model.eval()
        self.dim = config.hidden_size
        # the ids the tokenizer adds around a text ([CLS], [SEP]), and the padding token's
        pad = self.tokenizer.token_to_id(pad_token(folder))
        self.added_token_ids = frozenset(self.tokenizer.encode("").ids) | (
            {pad} if pad is not None else set()
        )

    def _forward(
        self, texts: Sequence[str], batch_size: int
    ) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per batch: the texts' positions in ``texts``, their token ids and attention mask (batch, longest) and
        the last layer (batch, longest, dim). Texts are batched longest first, as sentence-transformers does,
        so a batch holds little padding."""
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        for start in range(0, len(order), batch_size):
            indices = order[start : start + batch_size]
            encodings = self.tokenizer.encode_batch([texts[i] for i in indices])
            longest = max(len(encoding.ids) for encoding in encodings)
            ids, types, mask = (torch.zeros(len(indices), longest, dtype=torch.int64) for _ in range(3))
            for row, encoding in enumerate(encodings):
                length = len(encoding.ids)
                ids[row, :length] = torch.tensor(encoding.ids)
                types[row, :length] = torch.tensor(encoding.type_ids)
                mask[row, :length] = 1
            with torch.inference_mode():
                hidden = self.model(ids, types, mask)
            yield indices, ids, mask, hidden

    def sentence_embeddings(self, texts: Sequence[str], batch_size: int) -> np.ndarray:
        """Unit-length float32 rows: the mean of each text's token vectors, L2-normalised."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for indices, _, mask, hidden in self._forward(texts, batch_size):
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
            out[indices] = F.normalize(mean, p=2, dim=1).numpy()
        return out

    def token_embeddings(self, texts: Sequence[str], batch_size: int) -> list[TokenVectors]:
        """Per text, its token ids and last-layer vectors, padding removed, added tokens kept."""
        out: dict[int, TokenVectors] = {}
        for indices, ids, mask, hidden in self._forward(texts, batch_size):
            for row, index in enumerate(indices):
                keep = mask[row].bool()
                out[index] = TokenVectors(ids[row][keep].numpy(), hidden[row][keep].numpy())
        return [out[index] for index in range(len(texts))]


def pad_token(folder: Path) -> str:
    """The padding token transformers would use: tokenizer_config.json's, else special_tokens_map.json's."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if (folder / name).is_file():
            token = read_json(folder / name).get("pad_token")
            if isinstance(token, dict):
                token = token.get("content")
            if isinstance(token, str):
                return token
    return "[PAD]"
