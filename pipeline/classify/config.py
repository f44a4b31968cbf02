"""The `classify` section (scoring and selection) and the `classifier_training` section (training one), docs/filtering.md."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.core.config import Section
from pipeline.documents.config import TextSource
from pipeline.embeddings import EncoderConfig

# A model's name becomes a column (score_<name>) and a drop reason (classifier:<name>).
MODEL_NAME = r"^[a-z][a-z0-9_]{0,39}$"
Preprocess = Literal["dclm", "lowercase", "fasttext_tutorial"]


class FastTextParams(Section):
    """fastText's supervised settings; the defaults are DCLM's OH2.5+ELI5 classifier's (fastText's own,
    plus word bigrams)."""

    dim: int = Field(100, gt=0)
    epoch: int = Field(5, gt=0)
    lr: float = Field(0.1, gt=0)
    word_ngrams: int = Field(2, ge=1)
    min_count: int = Field(1, ge=1)
    bucket: int = Field(2_000_000, ge=0, description="hash buckets for the word n-grams")
    loss: Literal["softmax", "hs", "ova", "ns"] = "softmax"
    # fastText 0.9.x (DenseMatrix::uniform) initialises only `thread` tenths of the input vectors and leaves
    # the rest as whatever memory held: with fewer than 10 threads a model trains from garbage and often
    # fails with "Encountered NaN". So 10 at least, whatever the cores (Hogwild threads share them).
    threads: int = Field(10, ge=10, description="fastText's training threads (at least 10, see the code)")

    @model_validator(mode="after")
    def _whole_tenths(self) -> FastTextParams:
        # The tenths are (rows x dim) // 10 values each: a dim that is a multiple of 10 leaves no remainder
        # uninitialised.
        if self.dim % 10:
            raise ValueError(
                f"dim must be a multiple of 10 (fastText initialises its vectors in tenths), got {self.dim}"
            )
        return self


class EmbeddingParams(Section):
    """Logistic regression over sentence embeddings (FineWeb-Edu style: a small head on a frozen encoder)."""

    encoder: EncoderConfig = Field(default_factory=EncoderConfig)
    c: float = Field(1.0, gt=0, description="inverse regularisation strength (scikit-learn's C)")
    max_iter: int = Field(1000, gt=0)


class ClassifierTrainingConfig(Section):
    """How `pretrain train_classifier` builds its examples and trains; the snapshot names the model."""

    kind: Literal["fasttext", "embedding"] = Field(
        "fasttext",
        description="fasttext: a fastText supervised model; embedding: logistic regression over "
        "the sentence embeddings the quality stage computes",
    )
    positives: list[TextSource] = Field(
        default_factory=list, description="reference text (label 1), e.g. a JSONL of good documents"
    )
    negatives: list[TextSource] = Field(
        default_factory=list,
        description="label 0, e.g. [{stage: dedup, snapshot: 2026-11-29}] (seeded sample)",
    )
    labelled: list[TextSource] = Field(
        default_factory=list,
        description="instead of positives/negatives: documents with a score (score_field); a score at or "
        "above positive_min_score is label 1",
    )
    positive_min_score: float = Field(3.0, description="labelled: FineWeb-Edu's 3 on its 0-5 scale")
    max_examples_per_class: int = Field(
        100_000, gt=0, description="each class is sampled down to this (seeded)"
    )
    min_examples_per_class: int = Field(
        100,
        gt=0,
        description="fewer usable examples of either class (distinct texts) is an error, before training",
    )
    max_unusable_share: float = Field(
        0.25,
        ge=0,
        le=1,
        description="a source whose unusable lines (rows, files) are a larger share of it is an error, before "
        "training: that many is a wrong field or format, not a few damaged lines (1: never)",
    )
    balance: bool = Field(True, description="sample the larger class down to the smaller one's size")
    heldout_fraction: float = Field(0.1, gt=0, lt=1, description="examples held out for the metrics (seeded)")
    min_heldout_per_class: int = Field(
        10,
        gt=0,
        description="fewer held-out examples of either class is an error, before training: figures from "
        "fewer (an ROC AUC from three examples) mean nothing",
    )
    preprocess: Preprocess = Field(
        "dclm", description="text preparation at training and at scoring (pipeline.classify.preprocess)"
    )
    fasttext: FastTextParams = Field(default_factory=FastTextParams)
    embedding: EmbeddingParams = Field(default_factory=EmbeddingParams)
    calibration_bins: int = Field(10, ge=2, le=100)

    @model_validator(mode="after")
    def _one_kind_of_examples(self) -> ClassifierTrainingConfig:
        if self.labelled and (self.positives or self.negatives):
            raise ValueError("give labelled, or positives and negatives, not both")
        for index, source in enumerate(self.labelled):
            if source.score_field is None:
                raise ValueError(f"labelled[{index}] needs score_field (the column holding its score)")
        if self.min_examples_per_class > self.max_examples_per_class:
            raise ValueError(
                f"min_examples_per_class ({self.min_examples_per_class}) is above max_examples_per_class "
                f"({self.max_examples_per_class})"
            )
        if self.min_heldout_per_class > self.min_examples_per_class:
            raise ValueError(
                f"min_heldout_per_class ({self.min_heldout_per_class}) is above min_examples_per_class "
                f"({self.min_examples_per_class})"
            )
        return self

    def require_examples(self) -> None:
        """At run time, not at load (the tree is valid without a classifier to train)."""
        if not self.labelled and not (self.positives and self.negatives):
            raise ValueError(
                "classifier_training: give positives and negatives (reference text against a corpus sample), or labelled"
            )


class ScoringModel(Section):
    """One model the classify stage scores every document with, and how it selects."""

    name: str = Field(pattern=MODEL_NAME, description="column score_<name>, drop reason classifier:<name>")
    path: str | None = Field(
        None,
        description="a fastText .bin (a downloaded one: DCLM's, a toxicity model) or a trained model folder",
    )
    trained: str | None = Field(
        None, description="or a model `pretrain train_classifier --snapshot NAME` made in this corpus: NAME"
    )
    sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-fA-F]{64}$",
        description="the model file's SHA-256 (as sha256sum prints it): a file with another digest is refused",
    )
    label: str = Field(
        "__label__hq", description="fastText: the label whose probability is the score (DCLM's: __label__hq)"
    )
    preprocess: Preprocess | None = Field(
        None, description="fastText: text preparation; default: the trained model's, else dclm"
    )
    languages: list[str] | None = Field(
        None,
        description="score only documents in these languages; the others pass through, counted (null: all)",
    )
    threshold: float | None = Field(None, description="keep documents scoring at or above it (keep=high)")
    language_thresholds: dict[str, float] = Field(
        default_factory=dict, description="per language, a threshold that replaces `threshold`: {zh: 0.3}"
    )
    top_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="or keep this share of the scored documents, best first (a global quantile)",
    )
    keep: Literal["high", "low"] = Field(
        "high", description="low: keep documents at or below the threshold (a toxicity or NSFW score)"
    )

    @model_validator(mode="after")
    def _one_source_one_selection(self) -> ScoringModel:
        if (self.path is None) == (self.trained is None):
            raise ValueError(f"model {self.name!r}: give either path or trained")
        if self.top_fraction is not None and (self.threshold is not None or self.language_thresholds):
            raise ValueError(f"model {self.name!r}: give top_fraction or thresholds, not both")
        return self

    @property
    def selects(self) -> bool:
        return self.threshold is not None or bool(self.language_thresholds) or self.top_fraction is not None

    @property
    def column(self) -> str:
        return f"score_{self.name}"

    @property
    def reason(self) -> str:
        return f"classifier:{self.name}"


class ClassifyConfig(Section):
    """The classify stage: score columns per model, selection by threshold or top fraction."""

    models: list[ScoringModel] = Field(
        default_factory=list,
        description="scored in this order; a document dropped by several is counted "
        "under the first. None: the stage passes every document through",
    )
    histogram_bins: int = Field(20, ge=2, le=200, description="bins of the score histograms over [0, 1]")
    quantile_error: float = Field(
        0.001,
        gt=0,
        lt=0.1,
        description="top_fraction: relative error of the approximate quantile that "
        "brackets the exact cut (the cut itself is exact)",
    )

    @model_validator(mode="after")
    def _unique_names(self) -> ClassifyConfig:
        names = [model.name for model in self.models]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"model names {repeated} appear more than once")
        return self
