"""The `quality` config section: the data-quality report's sample and embedding settings."""

from __future__ import annotations

from pydantic import Field

from pipeline.core.config import Section


class QualityConfig(Section):
    sample_docs: int = Field(2000, gt=0, description="documents embedded for the diversity statistics")
    max_seq_length: int = Field(256, gt=0, le=512, description="embedding model's token limit per document")
    clusters: int = Field(8, gt=0, description="k-means clusters for the topic-spread entropy")
