"""The models the classify stage scores with: found and checked in the driver, loaded once per Python worker.

Two kinds, each a file:

* ``fasttext``: any fastText supervised ``.bin`` (DCLM's OH2.5+ELI5 model, a toxicity or NSFW model, one
  trained by `pretrain train_classifier`); the score is the probability fastText gives ``label``
  (``predict(text, k=-1)``) after the model's preprocessing (``pipeline.classify.preprocess``);
* ``embedding``: ``model.json``, logistic regression weights over a sentence encoder's unit embeddings
  (``pipeline.embeddings``); the score is ``sigmoid(embedding . coef + intercept)``.

A model is named by ``path`` (a file or a trained model's folder) or by ``trained`` (the snapshot name of a
`train_classifier` output in this corpus). Either way the stage records the file's SHA-256 in its manifest.
The labels of a fastText file are read from its header (``fasttext_labels``), so a wrong ``label`` fails in
the driver, before Spark starts, without loading a model that may be gigabytes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from pipeline.classify.config import ScoringModel
from pipeline.classify.preprocess import preprocessor
from pipeline.core.config import ConfigError
from pipeline.core.manifest import sha256_file
from pipeline.core.storage import DatasetRef

if TYPE_CHECKING:
    from pipeline.config import PipelineConfig

TRAIN_STAGE = "train_classifier"
FASTTEXT_FILE = "model.bin"
EMBEDDING_FILE = "model.json"
# fastText's binary format: magic number and the version this reader knows (0.9.x writes 12).
_FASTTEXT_MAGIC = 793712314
_FASTTEXT_VERSIONS = (11, 12)


def fasttext_labels(path: str | Path) -> list[str]:
    """The labels of a fastText supervised ``.bin``, read from its dictionary (the header before the
    matrices): what ``model.labels`` says, without loading the model."""
    with open(path, "rb") as handle:
        magic, version = struct.unpack("<ii", handle.read(8))
        if magic != _FASTTEXT_MAGIC or version not in _FASTTEXT_VERSIONS:
            raise ValueError(f"{path} is not a fastText model file (magic {magic}, version {version})")
        handle.read(12 * 4 + 8)  # Args: 12 int32 (dim ... lrUpdateRate) and the sampling threshold t
        size, _words, n_labels = struct.unpack("<iii", handle.read(12))
        handle.read(16)  # ntokens, pruneidx_size
        labels = []
        buffer = handle.read(1 << 20)
        offset = 0
        for _ in range(size):
            end = buffer.find(b"\0", offset)
            while end < 0 or end + 10 > len(buffer):  # an entry: bytes, NUL, int64 count, int8 type
                more = handle.read(1 << 20)
                if not more:
                    raise ValueError(f"{path}: the fastText dictionary is truncated")
                buffer = buffer[offset:] + more
                offset = 0
                end = buffer.find(b"\0", offset)
            word = buffer[offset:end]
            kind = buffer[end + 9]
            if kind == 1:
                labels.append(word.decode("utf-8", errors="replace"))
            offset = end + 10
        if len(labels) != n_labels:
            raise ValueError(f"{path}: found {len(labels)} labels, the header says {n_labels}")
        return labels


@dataclass(frozen=True)
class ResolvedModel:
    """A configured model, found and checked: what the workers load and what the manifest records."""

    name: str
    kind: str  # fasttext | embedding
    path: str
    sha256: str
    source: str  # how the config named it: the path, or trained:<snapshot>
    preprocess: str = "dclm"
    label: str | None = None
    labels: tuple[str, ...] = ()
    languages: tuple[str, ...] | None = None
    details: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def record(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "source": self.source,
            "path": self.path,
            "sha256": self.sha256,
            "preprocess": self.preprocess if self.kind == "fasttext" else None,
            "label": self.label,
            "labels": list(self.labels),
            "languages": None if self.languages is None else list(self.languages),
            **self.details,
        }


def _model_file(path: Path) -> tuple[str, Path]:
    """(kind, file) for a path that is a model file or a folder holding one."""
    if path.is_dir():
        for kind, name in (("fasttext", FASTTEXT_FILE), ("embedding", EMBEDDING_FILE)):
            if (path / name).is_file():
                return kind, path / name
        raise FileNotFoundError(f"{path} holds neither {FASTTEXT_FILE} nor {EMBEDDING_FILE}")
    if not path.is_file():
        raise FileNotFoundError(f"no model file at {path}")
    return ("embedding" if path.suffix == ".json" else "fasttext"), path


def resolve(spec: ScoringModel, config: PipelineConfig) -> ResolvedModel:
    """Find ``spec``'s file, check it (label, format) and digest it; ConfigError naming the model if wrong."""
    where = f"classify.models[{spec.name}]"
    trained: dict[str, Any] = {}
    try:
        if spec.trained is not None:
            ref = DatasetRef.of(config, TRAIN_STAGE, spec.trained).require()
            trained = ref.manifest().extra.get("model", {})
            kind, path = _model_file(ref.path)
            source = f"trained:{spec.trained}"
        else:
            assert spec.path is not None  # the validator: a path or a trained model
            kind, path = _model_file(Path(spec.path).expanduser())
            source = str(spec.path)
        path = path.resolve()
        if kind == "fasttext":
            labels = tuple(fasttext_labels(path))
            if spec.label not in labels:
                raise ConfigError(
                    f"{where}.label: {spec.label!r} is not a label of {path}; its labels: {list(labels)}"
                )
            label = spec.label
            preprocess = spec.preprocess or trained.get("preprocess") or "dclm"
            preprocessor(preprocess)
            details: dict[str, Any] = {}
        else:
            saved = json.loads(path.read_text())
            if saved.get("kind") != "embedding" or "coef" not in saved:
                raise ConfigError(f"{where}: {path} is not an embedding classifier (model.json)")
            labels, label, preprocess = (), None, "none"
            details = {"encoder": saved["encoder"]["model"]}
    except (OSError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{where}: {exc}") from None
    return ResolvedModel(
        name=spec.name,
        kind=kind,
        path=str(path),
        sha256=sha256_file(path),
        source=source,
        preprocess=preprocess,
        label=label,
        labels=labels,
        languages=None if spec.languages is None else tuple(spec.languages),
        details=details,
    )


# --- in the Python workers: one load per process --------------------------------------------------------

_LOADED: dict[tuple[str, str], Any] = {}


def _load(model: ResolvedModel, loads=None):
    """The model object, loaded the first time this process needs it (keyed by digest too, so a file
    replaced under the same path is loaded afresh); ``loads`` (a Spark accumulator) counts real loads."""
    key = (model.path, model.sha256)
    if key not in _LOADED:
        if model.kind == "fasttext":
            from fasttext.FastText import _FastText

            # fasttext.load_model only adds a deprecation print around this.
            _LOADED[key] = _FastText(model_path=model.path)
        else:
            _LOADED[key] = EmbeddingClassifier.load(model.path)
        if loads is not None:
            loads.add(1)
    return _LOADED[key]


def fasttext_scores(ft_model, texts: Sequence[str], label: str, preprocess: str) -> list[float]:
    """The probability fastText's ``predict(text, k=-1)`` gives ``label``, for each text, in one call."""
    if not texts:
        return []
    prepare = preprocessor(preprocess)
    labels, probabilities = ft_model.predict([prepare(text) for text in texts], k=-1)
    scores = []
    for names, values in zip(labels, probabilities, strict=True):
        try:
            scores.append(float(values[names.index(label)]))
        except ValueError:  # a one-vs-all model can leave a label out; its probability is then ~0
            scores.append(0.0)
    return scores


@dataclass(frozen=True)
class EmbeddingClassifier:
    """Logistic regression over unit sentence embeddings; ``model.json`` holds it whole."""

    encoder: dict[str, Any]
    coef: np.ndarray
    intercept: float

    @classmethod
    def load(cls, path: str | Path) -> EmbeddingClassifier:
        saved = json.loads(Path(path).read_text())
        return cls(saved["encoder"], np.asarray(saved["coef"], dtype=np.float64), float(saved["intercept"]))

    def to_json(self, **extra: Any) -> str:
        return json.dumps(
            {
                "kind": "embedding",
                "encoder": self.encoder,
                "coef": [float(x) for x in self.coef],
                "intercept": self.intercept,
                **extra,
            },
            indent=1,
        )

    def probabilities(self, embeddings: np.ndarray) -> np.ndarray:
        logits = embeddings.astype(np.float64) @ self.coef + self.intercept
        return 1.0 / (1.0 + np.exp(-logits))

    def scores(self, texts: Sequence[str]) -> list[float]:
        from pipeline.embeddings import EncoderConfig, encode

        if not texts:
            return []
        return [float(p) for p in self.probabilities(encode(list(texts), EncoderConfig(**self.encoder)))]


def score_texts(model: ResolvedModel, texts: Sequence[str], loads=None) -> list[float]:
    loaded = _load(model, loads)
    if model.kind == "fasttext":
        assert model.label is not None  # resolve() checked a fastText model's label
        return fasttext_scores(loaded, texts, model.label, model.preprocess)
    return loaded.scores(texts)


def scored_schema(schema: pa.Schema, models: Sequence[ResolvedModel]) -> pa.Schema:
    for model in models:
        schema = schema.append(pa.field(f"score_{model.name}", pa.float64()))
    return schema


def score_batches(
    batches: Iterator[pa.RecordBatch], models: Sequence[ResolvedModel], loads: dict | None = None
) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: every column of the batch, plus ``score_<name>`` for each model. A document whose
    language a model does not cover gets null there (it passes that model); a null text scores as ""."""
    loads = loads or {}
    for batch in batches:
        texts = [text or "" for text in batch.column("text").to_pylist()]
        langs = batch.column("lang").to_pylist() if "lang" in batch.schema.names else [None] * batch.num_rows
        columns = list(batch.columns)
        for model in models:
            chosen: Sequence[int]
            if model.languages is None:
                chosen = range(len(texts))
            else:
                covered = set(model.languages)
                chosen = [row for row, lang in enumerate(langs) if lang in covered]
            values: list[float | None] = [None] * len(texts)
            scores = score_texts(model, [texts[row] for row in chosen], loads.get(model.name))
            for row, score in zip(chosen, scores, strict=True):
                values[row] = score
            columns.append(pa.array(values, pa.float64()))
        yield pa.RecordBatch.from_arrays(columns, schema=scored_schema(batch.schema, models))
