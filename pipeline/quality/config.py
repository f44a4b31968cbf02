"""The `quality` config section: the data-quality report's sample and embedding settings, and its gate."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.core.config import Section
from pipeline.embeddings import EncoderConfig
from pipeline.quality.subjects import SubjectConfig


class GateConfig(Section):
    """Thresholds a snapshot must meet before it is trained on; null switches a threshold off."""

    mode: Literal["ignore", "warn", "fail"] = Field(
        "warn",
        description="ignore: no gate; fail: a snapshot that misses a threshold announces no token shards, so `pretrain` does "
        "not train on it; warn: the report and the log say so, training goes ahead",
    )
    min_documents: int | None = Field(
        1, ge=0, description="documents kept after the last stage", json_schema_extra={"metric": "documents"}
    )
    min_kept_share: float | None = Field(
        None,
        ge=0,
        le=1,
        description="kept documents / the funnel's input (URLs crawled or records read)",
        json_schema_extra={"metric": "kept_share"},
    )
    max_duplicate_share: float | None = Field(
        None,
        ge=0,
        le=1,
        description="documents dedup removed / documents dedup read",
        json_schema_extra={"metric": "duplicate_share"},
    )
    max_classifier_drop_share: float | None = Field(
        None,
        ge=0,
        le=1,
        description="documents the classify stage dropped / documents it read",
        json_schema_extra={"metric": "classifier_drop_share"},
    )
    max_contaminated_share: float | None = Field(
        None,
        ge=0,
        le=1,
        description="documents the decontaminate stage dropped / documents it read",
        json_schema_extra={"metric": "contaminated_share"},
    )
    max_mean_pairwise_cosine: float | None = Field(
        None,
        ge=-1,
        le=1,
        description="the sample's mean pairwise embedding cosine (higher: less diverse)",
        json_schema_extra={"metric": "mean_pairwise_cosine"},
    )
    max_self_bleu: float | None = Field(
        None,
        ge=0,
        le=100,
        description="the sample's self-BLEU, 0-100 (higher: documents repeat each other)",
        json_schema_extra={"metric": "self_bleu"},
    )
    max_unassigned_share: float | None = Field(
        None,
        ge=0,
        le=1,
        description="share of the sample no subject claims",
        json_schema_extra={"metric": "unassigned_share"},
    )
    min_subject_share: float | None = Field(
        None,
        ge=0,
        le=1,
        description="every subject of the prototypes must hold at least this share of the sample",
    )


class QualityConfig(Section):
    sample_docs: int = Field(
        2000, gt=0, description="documents (seeded) embedded for the subject and diversity views"
    )
    pairwise_docs: int = Field(
        200, ge=2, description="of the sample, documents (seeded) for self-BLEU and the BERTScore-style F1"
    )
    bertscore_pairs: int = Field(
        500, gt=0, description="document pairs (seeded) the BERTScore-style F1 averages"
    )
    trend_snapshots: int = Field(10, ge=0, description="earlier snapshots the report compares and plots")
    encoder: EncoderConfig = Field(default_factory=EncoderConfig)
    subjects: SubjectConfig = Field(default_factory=SubjectConfig)
    clusters: int = Field(8, gt=0, description="k-means clusters for the topic-spread entropy")
    gate: GateConfig = Field(default_factory=GateConfig)
