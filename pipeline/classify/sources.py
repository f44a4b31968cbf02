"""Text from where a user keeps it, as a Spark DataFrame: JSONL, Parquet, a folder of .txt files, or a stage's
output in this data root. Classifier training reads its examples through here, decontamination its
evaluation files."""

from __future__ import annotations

import glob
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.classify.config import TextSource
from pipeline.core.config import ConfigError
from pipeline.core.storage import DatasetRef

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pipeline.config import PipelineConfig

_SUFFIXES = {
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".txt": "text",
}


def _format_of(path: Path) -> str | None:
    suffixes = [s for s in path.suffixes if s not in (".gz", ".bz2", ".zst")]
    return _SUFFIXES.get(suffixes[-1]) if suffixes else None


def source_files(pattern: str) -> tuple[str, list[str]]:
    """(format, files) for a file, a folder (every file of a known format under it) or a glob."""
    path = Path(pattern).expanduser()
    if path.is_dir():
        files = sorted(str(p) for p in path.rglob("*") if p.is_file() and _format_of(p) is not None)
    else:
        files = (
            sorted(glob.glob(str(path), recursive=True)) if any(c in pattern for c in "*?[") else [str(path)]
        )
        files = [f for f in files if Path(f).is_file()]
    if not files:
        raise ConfigError(f"no readable files at {pattern!r} (JSONL, Parquet or .txt)")
    formats = {_format_of(Path(f)) for f in files}
    known = {fmt for fmt in formats if fmt is not None}
    if len(formats) != 1 or len(known) != 1:
        raise ConfigError(
            f"{pattern!r}: give files of one format (.jsonl/.json, .parquet or .txt), found {sorted(map(str, formats))}"
        )
    return known.pop(), files


def stage_documents(config: PipelineConfig, source: TextSource) -> DatasetRef:
    if source.stage is None or source.snapshot is None:
        raise ConfigError(f"{source.describe()}: not a stage's output (give stage and snapshot)")
    ref = DatasetRef(
        config.project.data_root, source.corpus or config.project.corpus, source.stage, source.snapshot
    )
    return ref.require()


def read_text_source(
    spark: SparkSession, source: TextSource, config: PipelineConfig, *, score: bool = False
) -> DataFrame:
    """(text) or, with ``score``, (text, score) rows of ``source``; ``max_documents`` sampled by a seeded hash."""
    from pyspark.sql import functions as F

    if source.stage is not None:
        frame = spark.read.parquet(str(stage_documents(config, source).path / "documents"))
        origin = source.describe()
    else:
        assert source.path is not None  # the validator: files or a stage's output
        fmt, files = source_files(source.path)
        fmt = fmt if source.format == "auto" else source.format
        origin = source.path
        if fmt == "jsonl":
            frame = spark.read.json(files)
        elif fmt == "parquet":
            frame = spark.read.parquet(*files)
        else:
            frame = spark.read.text(files, wholetext=True).withColumnRenamed("value", source.text_field)
    wanted = [source.text_field, *([source.score_field] if score and source.score_field else [])]
    missing = [name for name in wanted if name not in frame.columns]
    if missing:
        raise ConfigError(
            f"{origin}: no column {missing} (columns: {frame.columns}); set text_field/score_field"
        )
    columns = [F.col(source.text_field).cast("string").alias("text")]
    if score:
        if source.score_field is None:
            raise ConfigError(f"{origin}: labelled examples need score_field, the column holding each score")
        columns.append(F.col(source.score_field).cast("double").alias("score"))
    frame = frame.select(*columns).where(F.col("text").isNotNull() & (F.length(F.trim("text")) > 0))
    if source.max_documents is not None:
        order = F.xxhash64(F.lit(config.project.seed), F.col("text"))
        frame = frame.orderBy(order, "text").limit(source.max_documents)
    return frame
