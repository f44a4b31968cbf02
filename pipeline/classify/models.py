"""The models the classify stage scores with: found and checked in the driver, loaded once per Python worker.

Two kinds, each a file:

* ``fasttext``: any fastText supervised ``.bin`` (DCLM's OH2.5+ELI5 model, a toxicity or NSFW model, one
  trained by `pretrain train_classifier`); the score is the probability fastText gives ``label``
  (``predict(text, k=-1)``) after the model's preprocessing (``pipeline.classify.preprocess``);
* ``embedding``: ``model.json``, logistic regression weights over a sentence encoder's unit embeddings
  (``pipeline.embeddings``); the score is ``sigmoid(embedding . coef + intercept)``.

A model is named by ``path`` (a file or a trained model's folder) or by ``trained`` (the snapshot name of a
`train_classifier` output in this corpus). Either way the stage records the file's SHA-256 in its manifest,
and refuses the file when it differs from the config's ``sha256`` (or a trained model's recorded one).
A fastText file is checked whole in the driver (``check_fasttext_file``: every size its header implies, the
dictionary, the file's length), so a damaged or cut-short file and a wrong ``label`` fail before Spark
starts, without loading a model that may be gigabytes.
"""

from __future__ import annotations

import json
import os
import struct
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

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
# fastText's binary format (src/fasttext.cc saveModel): magic and version, Args, the Dictionary, a quantized
# flag byte and the input matrix, a qout flag byte and the output matrix, nothing after. 0.9.x writes 12.
_FASTTEXT_MAGIC = 793712314
_FASTTEXT_VERSIONS = (11, 12)
_SUPERVISED = 3  # Args.model: cbow 1, skipgram 2, supervised 3
_LOSSES = (1, 2, 3, 4)  # hs, ns, softmax, ova
_KSUB = 256  # centroids per product quantizer (src/productquantizer.h)
_MAX_ENTRY = 1 << 20  # a dictionary entry longer than this is a damaged file, not a word
_CHUNK = 1 << 20


@dataclass(frozen=True)
class FastTextFile:
    """A fastText supervised model file, checked whole: its labels and the shapes its bytes hold."""

    labels: tuple[str, ...]
    dim: int
    words: int
    bucket: int
    quantized: bool
    input_rows: int
    output_rows: int
    size: int


class _ModelBytes:
    """Reads a model file front to back, buffered; any shortfall is a ConfigError naming the file and the part."""

    def __init__(self, handle: BinaryIO, path: str | Path):
        self.handle = handle
        self.path = path
        self.size = os.fstat(handle.fileno()).st_size
        self.buffer = b""
        self.pos = 0  # in buffer
        self.base = 0  # the file offset of buffer[0]

    @property
    def offset(self) -> int:
        return self.base + self.pos

    def damaged(self, problem: str) -> ConfigError:
        return ConfigError(f"{self.path} is not a whole fastText model: {problem}")

    def _fill(self, wanted: int) -> bool:
        """At least ``wanted`` bytes buffered from the current offset, if the file has them."""
        if len(self.buffer) - self.pos >= wanted:
            return True
        self.buffer, self.base, self.pos = self.buffer[self.pos :], self.offset, 0
        self.handle.seek(self.base + len(self.buffer))
        self.buffer += self.handle.read(max(wanted - len(self.buffer), _CHUNK))
        return len(self.buffer) >= wanted

    def need(self, length: int, what: str) -> None:
        """The file holds ``length`` more bytes (a size read from the file, so perhaps negative or huge)."""
        if length < 0:
            raise self.damaged(f"{what} has a negative size ({length})")
        if self.offset + length > self.size:
            raise self.damaged(
                f"{what} needs {length} bytes from byte {self.offset}, the file ends at byte {self.size}"
                " (cut short: a download that stopped early?)"
            )

    def unpack(self, layout: str, what: str) -> tuple[Any, ...]:
        length = struct.calcsize(layout)
        self.need(length, what)
        self._fill(length)
        values = struct.unpack_from(layout, self.buffer, self.pos)
        self.pos += length
        return values

    def flag(self, what: str) -> bool:
        (value,) = self.unpack("<B", what)
        if value not in (0, 1):
            raise self.damaged(f"{what} at byte {self.offset - 1} is {value}, not 0 or 1")
        return bool(value)

    def skip(self, length: int, what: str) -> None:
        """Step over bytes the check cannot judge (matrix values), after making sure the file holds them."""
        self.need(length, what)
        self.buffer, self.base, self.pos = b"", self.offset + length, 0

    def word(self) -> bytes:
        """A dictionary entry's bytes, up to its NUL."""
        end = self.buffer.find(b"\0", self.pos)
        while end < 0:
            if len(self.buffer) - self.pos > _MAX_ENTRY:
                raise self.damaged(f"the dictionary entry at byte {self.offset} runs past {_MAX_ENTRY} bytes")
            searched = len(self.buffer) - self.pos
            if not self._fill(searched + 1):
                raise self.damaged(
                    f"the dictionary entry at byte {self.offset} has no end: the file ends at byte {self.size}"
                    " (cut short: a download that stopped early?)"
                )
            end = self.buffer.find(b"\0", self.pos + searched)
        word = self.buffer[self.pos : end]
        self.pos = end + 1
        return word


def _dense_matrix(data: _ModelBytes, what: str, rows: int, cols: int) -> None:
    found_rows, found_cols = data.unpack("<qq", f"the {what} matrix's shape")
    if (found_rows, found_cols) != (rows, cols):
        raise data.damaged(
            f"the {what} matrix is {found_rows} x {found_cols}, the header and dictionary say {rows} x {cols}"
        )
    data.skip(rows * cols * 4, f"the {what} matrix ({rows} x {cols} float32)")


def _product_quantizer(data: _ModelBytes, what: str, dim: int, dsub: int | None = None) -> int:
    """Checks a ProductQuantizer's header against the matrix it codes and steps over its centroids; its
    number of sub-quantizers (code bytes per row)."""
    found_dim, nsubq, found_dsub, lastdsub = data.unpack("<iiii", f"the {what} quantizer's header")
    dsub = found_dsub if dsub is None else dsub
    if found_dim != dim or found_dsub != dsub or dsub < 1:
        raise data.damaged(
            f"the {what} quantizer codes dim {found_dim} in pieces of {found_dsub}, expected {dim}"
        )
    if (nsubq, lastdsub) != (-(-dim // dsub), dim % dsub or dsub):
        raise data.damaged(f"the {what} quantizer's pieces ({nsubq}, last {lastdsub}) do not cover dim {dim}")
    data.skip(dim * _KSUB * 4, f"the {what} quantizer's centroids")
    return nsubq


def _quantized_matrix(data: _ModelBytes, what: str, rows: int, cols: int) -> None:
    """A QuantMatrix (src/quantmatrix.cc): qnorm flag, rows, cols, code size, codes, the quantizer, and with
    qnorm the norms' codes and their one-dimensional quantizer."""
    qnorm = data.flag(f"the {what} matrix's qnorm flag")
    found_rows, found_cols, codesize = data.unpack("<qqi", f"the {what} matrix's shape")
    if (found_rows, found_cols) != (rows, cols):
        raise data.damaged(
            f"the {what} matrix is {found_rows} x {found_cols}, the header and dictionary say {rows} x {cols}"
        )
    data.skip(codesize, f"the {what} matrix's codes")
    nsubq = _product_quantizer(data, what, cols)
    if codesize != rows * nsubq:
        raise data.damaged(f"the {what} matrix holds {codesize} codes, {rows} rows need {rows * nsubq}")
    if qnorm:
        data.skip(rows, f"the {what} matrix's norm codes")
        _product_quantizer(data, f"{what} norm", 1, 1)


def check_fasttext_file(path: str | Path) -> FastTextFile:
    """Check a fastText supervised ``.bin`` (or quantized ``.ftz``) whole, without loading it: every size
    field against the others and against the file's length, the dictionary read to its end, the output
    matrix one row per label, the file ending exactly where the format does. A damaged file (cut short,
    a field overwritten, bytes appended) is a ConfigError naming the file and what is wrong. Matrix values
    are not judged (any float is a weight): only a digest (``sha256:``) catches a change there."""
    with open(path, "rb") as handle:
        data = _ModelBytes(handle, path)
        if data.size < 8:
            raise ConfigError(f"{path} is not a fastText model file ({data.size} bytes)")
        magic, version = data.unpack("<ii", "the signature")
        if magic != _FASTTEXT_MAGIC or version not in _FASTTEXT_VERSIONS:
            raise ConfigError(f"{path} is not a fastText model file (magic {magic}, version {version})")
        # Args: dim ws epoch minCount neg wordNgrams loss model bucket minn maxn lrUpdateRate, then t
        args = data.unpack("<12id", "the arguments")
        dim, loss, model, bucket = args[0], args[6], args[7], args[8]
        if model != _SUPERVISED:
            raise data.damaged(
                f"the model kind is {model}, not supervised ({_SUPERVISED}): no labels to score"
            )
        if dim < 1 or bucket < 0 or loss not in _LOSSES:
            raise data.damaged(f"the arguments say dim {dim}, bucket {bucket}, loss {loss}")
        size, words, n_labels, _tokens, pruned = data.unpack("<iiiqq", "the dictionary's header")
        if min(words, n_labels) < 0 or size != words + n_labels or n_labels == 0 or pruned < -1:
            raise data.damaged(
                f"the dictionary's header says {size} entries, {words} words, {n_labels} labels, "
                f"pruned index {pruned}"
            )
        labels = []
        kinds = [0, 0]
        for _ in range(size):
            word = data.word()
            _count, kind = data.unpack("<qb", "a dictionary entry")
            if kind not in (0, 1):
                raise data.damaged(f"the dictionary entry ending at byte {data.offset} has type {kind}")
            kinds[kind] += 1
            if kind == 1:
                labels.append(word.decode("utf-8", errors="replace"))
        if kinds != [words, n_labels]:
            raise data.damaged(
                f"the dictionary holds {kinds[0]} words and {kinds[1]} labels, "
                f"its header says {words} and {n_labels}"
            )
        if pruned >= 0:
            data.skip(pruned * 8, "the dictionary's pruned index")
        quantized = data.flag("the quantized flag")
        if pruned >= 0 and not quantized:
            raise data.damaged("the dictionary is pruned but the input matrix is not quantized")
        input_rows = words + (pruned if pruned >= 0 else bucket)
        (_quantized_matrix if quantized else _dense_matrix)(data, "input", input_rows, dim)
        quantized_output = data.flag("the qout flag") and quantized
        (_quantized_matrix if quantized_output else _dense_matrix)(data, "output", n_labels, dim)
        if data.offset != data.size:
            raise data.damaged(
                f"{data.size - data.offset} bytes follow the output matrix, where the format ends "
                f"(byte {data.offset})"
            )
    return FastTextFile(tuple(labels), dim, words, bucket, quantized, input_rows, n_labels, data.size)


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
    """Find ``spec``'s file, check it (whole file, label, digest); ConfigError naming the model if wrong."""
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
            labels = check_fasttext_file(path).labels
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
        digest = sha256_file(path)
    except (OSError, ValueError) as exc:
        if isinstance(exc, ConfigError) and str(exc).startswith(where):
            raise
        raise ConfigError(f"{where}: {exc}") from None
    # The config's digest, else the one train_classifier recorded: a file changed since is refused.
    expected, named_by = (spec.sha256, f"{where}.sha256") if spec.sha256 else (trained.get("sha256"), where)
    if expected is not None and digest != expected.lower():
        raise ConfigError(f"{named_by}: {path} has sha256 {digest}, expected {expected.lower()}")
    return ResolvedModel(
        name=spec.name,
        kind=kind,
        path=str(path),
        sha256=digest,
        source=source,
        preprocess=preprocess,
        label=label,
        labels=labels,
        languages=None if spec.languages is None else tuple(spec.languages),
        details=details,
    )


# --- in the Python workers: one load per process --------------------------------------------------------

_LOADED: dict[tuple[str, str], Any] = {}


def _load(model: ResolvedModel, loads: Counter[str] | None = None):
    """The model object, loaded the first time this process needs it (keyed by digest too, so a file
    replaced under the same path is loaded afresh); ``loads`` counts real loads by model name."""
    key = (model.path, model.sha256)
    if key not in _LOADED:
        if model.kind == "fasttext":
            from fasttext.FastText import _FastText

            # fasttext.load_model only adds a deprecation print around this.
            _LOADED[key] = _FastText(model_path=model.path)
        else:
            _LOADED[key] = EmbeddingClassifier.load(model.path)
        if loads is not None:
            loads[model.name] += 1
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


def score_texts(model: ResolvedModel, texts: Sequence[str], loads: Counter[str] | None = None) -> list[float]:
    loaded = _load(model, loads)
    if model.kind == "fasttext":
        assert model.label is not None  # resolve() checked a fastText model's label
        return fasttext_scores(loaded, texts, model.label, model.preprocess)
    return loaded.scores(texts)


def loads_column(model_name: str) -> str:
    """The counter column of the models ``model_name`` loaded in the workers: summed, not written."""
    return f"_model_loads_{model_name}"


def scored_schema(schema: pa.Schema, models: Sequence[ResolvedModel], with_loads: bool = False) -> pa.Schema:
    for model in models:
        schema = schema.append(pa.field(f"score_{model.name}", pa.float64()))
    if with_loads:
        for model in models:
            schema = schema.append(pa.field(loads_column(model.name), pa.int64()))
    return schema


def score_batches(
    batches: Iterator[pa.RecordBatch], models: Sequence[ResolvedModel]
) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: every column of the batch, plus ``score_<name>`` for each model. A document whose
    language a model does not cover gets null there (it passes that model); a null text scores as "".
    ``_model_loads_<name>`` counts the loads this batch caused on its first row (0 elsewhere): summed in
    the stage's summary, where Spark Connect has no accumulator."""
    for batch in batches:
        if batch.num_rows == 0:
            continue
        loads: Counter[str] = Counter()
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
            scores = score_texts(model, [texts[row] for row in chosen], loads)
            for row, score in zip(chosen, scores, strict=True):
                values[row] = score
            columns.append(pa.array(values, pa.float64()))
        for model in models:
            columns.append(pa.array([loads[model.name]] + [0] * (batch.num_rows - 1), pa.int64()))
        yield pa.RecordBatch.from_arrays(columns, schema=scored_schema(batch.schema, models, with_loads=True))
