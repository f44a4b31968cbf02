"""Settings of the shared document pieces: where a stage reads text from."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.core.config import Section


class TextSource(Section):
    """Where text comes from: files (JSONL, Parquet or plain text), or a stage's output in this data root."""

    path: str | None = Field(
        None,
        description="a file, a folder or a glob of .jsonl/.json(.gz), .parquet or .txt files (one document "
        "per .txt file)",
    )
    stage: str | None = Field(None, description="or a stage's output: its documents/ (ingest, dedup, ...)")
    snapshot: str | None = Field(None, description="the snapshot of that stage's output")
    corpus: str | None = Field(
        None, description="the corpus of that stage's output (default: project.corpus)"
    )
    format: Literal["auto", "jsonl", "parquet", "text"] = Field("auto", description="auto: by file suffix")
    text_field: str = Field("text", description="the column or JSON key holding the text")
    score_field: str | None = Field(None, description="labelled examples: the column holding each score")
    max_documents: int | None = Field(
        None, gt=0, description="read at most this many documents, chosen by a seeded hash"
    )

    @model_validator(mode="after")
    def _one_origin(self) -> TextSource:
        if (self.path is None) == (self.stage is None):
            raise ValueError("give either path (files) or stage and snapshot (a stage's output)")
        if self.stage is not None and self.snapshot is None:
            raise ValueError(f"stage {self.stage!r} needs a snapshot")
        return self

    def describe(self) -> str:
        if self.path is not None:
            return self.path
        return f"{self.corpus or '<corpus>'}/{self.stage}/{self.snapshot}"
