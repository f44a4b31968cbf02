"""The `quality` config section: the data-quality report's sample and embedding settings, and its gate."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.core.config import Section
from pipeline.embeddings import EncoderConfig


class GateConfig(Section):
    """Thresholds a snapshot must meet before it is trained on; null switches a threshold off."""

    mode: Literal["ignore", "warn", "fail"] = Field(
        "warn",
        description="ignore: no gate; fail: a snapshot that misses a threshold announces no token shards, so `pretrain` does "
        "not train on it; warn: the report and the log say so, training goes ahead",
    )
    min_documents: int | None = Field(1, ge=0, description="documents kept after the last stage")
    min_kept_share: float | None = Field(
        None, ge=0, le=1, description="kept documents / the funnel's input (URLs crawled or records read)"
    )
    max_duplicate_share: float | None = Field(
        None, ge=0, le=1, description="documents dedup removed / documents dedup read"
    )
    max_mean_pairwise_cosine: float | None = Field(
        None, ge=-1, le=1, description="the sample's mean pairwise embedding cosine (higher: less diverse)"
    )


class QualityConfig(Section):
    sample_docs: int = Field(2000, gt=0, description="documents embedded for the diversity statistics")
    encoder: EncoderConfig = Field(default_factory=EncoderConfig)
    clusters: int = Field(8, gt=0, description="k-means clusters for the topic-spread entropy")
    gate: GateConfig = Field(default_factory=GateConfig)
