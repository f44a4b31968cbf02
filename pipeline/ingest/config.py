"""The `ingest` config section: which files to read, how to read them, and the size cap (docs/ingest.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.core.config import Section

Format = Literal["auto", "warc", "wet", "jsonl", "parquet", "arrow"]


class IngestConfig(Section):
    sources: list[str] = Field(
        default_factory=list,
        description="files, folders or globs, local or URIs pyarrow opens (s3://, hdfs://); empty: re-read "
        "the files the snapshot's stored ingest names",
    )
    format: Format = Field(
        "auto", description="auto: by extension (.warc[.gz], .wet[.gz], .jsonl[.gz], .parquet, .arrow)"
    )
    text_column: str = Field("text", min_length=1, description="JSONL/Parquet/Arrow: the document text")
    id_column: str | None = Field(
        None, description="JSONL/Parquet/Arrow: a stable id; else a hash of the URL, else of the text"
    )
    url_column: str | None = Field("url", description="JSONL/Parquet/Arrow: the URL, when there is one")
    metadata_columns: list[str] = Field(
        default_factory=list, description="JSONL/Parquet/Arrow: columns kept, as JSON, in documents/metadata"
    )
    split_bytes: int = Field(
        128 * 1024 * 1024,
        ge=0,
        description="an uncompressed JSONL file larger than this is read by several tasks, one per piece "
        "of this size (0: one task per file)",
    )
    driver_checksum_bytes: int = Field(
        64 * 1024 * 1024,
        ge=0,
        description="sources that add up to no more than this are checksummed in the driver; larger ones "
        "in a Spark job, one task per file (its fixed cost outweighs hashing a few small files)",
    )
    max_record_bytes: int = Field(
        10 * 1024 * 1024, gt=0, description="a larger record (WARC payload, JSONL line, text) is quarantined"
    )
    max_json_depth: int = Field(
        64, gt=0, le=512, description="a JSONL record nested deeper than this is quarantined (too_deep)"
    )
    follow_symlinks: bool = Field(
        False,
        description="read files reached through symbolic links that lead outside a source folder (default: "
        "refuse them, counted in the manifest as refused_symlinks)",
    )
