"""The `dedup` config section: URL, exact, MinHash-LSH near-duplicate and semantic removal (docs/dedup.md)."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from pipeline.core.config import Section
from pipeline.core.snapshots import SnapshotSelection, as_selection
from pipeline.embeddings import EncoderConfig


class SemanticConfig(Section):
    """SemDeDup: k-means on sentence embeddings, then cosine duplicates within each cluster (docs/dedup.md)."""

    enabled: bool = Field(False, description="embed every document left after URL/exact/near dedup (costly)")
    encoder: EncoderConfig = Field(default_factory=EncoderConfig)
    clusters: int | None = Field(
        None, ge=1, description="k-means k; null: ceil(sqrt(documents embedded)), at most the document count"
    )
    threshold: float = Field(
        0.85,
        gt=0,
        le=1,
        description="drop a document whose cosine with an earlier kept document of its cluster is above this",
    )
    max_iterations: int = Field(20, gt=0, description="k-means (Lloyd) iterations at most")
    max_cluster_size: int = Field(
        50_000,
        gt=1,
        description="stop with an error when a k-means cluster is larger (its documents are compared "
        "pairwise in one worker); raise clusters instead",
    )


class DedupConfig(Section):
    """Exact, near-duplicate (MinHash LSH) and URL de-duplication; see docs/dedup.md."""

    url_dedup: bool = Field(
        True,
        description="keep only the newest fetch of each page (pipeline.dedup.urls.page_key: host without www., path, sorted query)",
    )
    exact: bool = Field(True, description="drop documents whose normalised text equals a smaller id's")
    near: bool = Field(True, description="drop near-duplicates found by MinHash LSH")
    threshold: float = Field(0.8, gt=0, lt=1, description="Jaccard similarity of shingle sets")
    ngram_size: int = Field(5, ge=1, le=64, description="words per shingle")
    cjk_ngram_size: int = Field(5, ge=1, le=64, description="characters per shingle in CJK text")
    num_perm: int = Field(128, ge=1, le=1024, description="most permutations bands x rows may use")
    bands: int | None = Field(None, ge=1, description="set with rows to skip the threshold search")
    rows: int | None = Field(None, ge=1)
    false_positive_weight: float = Field(0.05, ge=0)
    false_negative_weight: float = Field(0.95, ge=0)
    verify: bool = Field(True, description="keep only candidate pairs whose true Jaccard >= threshold")
    max_iterations: int = Field(64, gt=0, description="rounds of connected components before giving up")
    semantic: SemanticConfig = Field(default_factory=SemanticConfig)
    against: str | list[str] | None = Field(
        None,
        description="incremental dedup: also drop documents an earlier snapshot of the corpus has (all, last:N, "
        "FROM..TO, names or a glob; only snapshots before this one, by name); null: each snapshot on its own, "
        "as FineWeb found better (docs/dedup.md)",
    )

    @field_validator("against", mode="before")
    @classmethod
    def _names(cls, against: object) -> object:
        return as_selection(against)

    @field_validator("against")
    @classmethod
    def _history(cls, against: str | list[str] | None) -> str | list[str] | None:
        if against is not None:
            SnapshotSelection.parse(against)  # a ValueError names the key and the grammar
        return against

    @model_validator(mode="after")
    def _banding(self) -> DedupConfig:
        if (self.bands is None) != (self.rows is None):
            raise ValueError("set both bands and rows, or neither (then they come from threshold)")
        if self.bands is not None and self.rows is not None and self.bands * self.rows > 4096:
            raise ValueError(f"bands x rows = {self.bands * self.rows} permutations; at most 4096")
        if self.false_positive_weight + self.false_negative_weight == 0:
            raise ValueError("false_positive_weight and false_negative_weight cannot both be 0")
        return self
