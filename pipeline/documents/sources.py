"""Text from where a user keeps it, as a Spark DataFrame: JSONL, Parquet, a folder of .txt files, or a stage's
output in this data root. Classifier training reads its examples through here, decontamination its
evaluation files.

Nothing from outside is trusted: every line (row, file) is judged, and an unusable one (not JSON, not an
object, a text that is missing, empty or not a string, a score that is missing, not a number or not finite)
keeps its reason, so the caller can count it and name its file and line."""

from __future__ import annotations

import bz2
import functools
import glob
import gzip
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from pipeline.core.config import ConfigError
from pipeline.core.spark import map_in_arrow
from pipeline.core.storage import DatasetRef
from pipeline.documents.config import TextSource

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


def judge_json_line(
    line: str, text_field: str, score_field: str | None
) -> tuple[str | None, float | None, str | None]:
    """(text, score, reason) of one JSONL line: ``reason`` says why the line is unusable, None when it is not."""
    if not line.strip():
        return None, None, "blank line"
    try:
        record = json.loads(line)
    except ValueError:
        return None, None, "not JSON"
    if not isinstance(record, dict):
        return None, None, "not a JSON object"
    text = record.get(text_field)
    if text is None:
        return None, None, f"no {text_field!r}"
    if not isinstance(text, str):
        return None, None, f"{text_field!r} is not a string"
    if not text.strip():
        return None, None, f"empty {text_field!r}"
    if score_field is None:
        return text, None, None
    value = record.get(score_field)
    if value is None:
        return None, None, f"no {score_field!r}"
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None, None, f"{score_field!r} is not a number"
    try:
        score = float(value)
    except ValueError:
        return None, None, f"{score_field!r} is not a number"
    if not math.isfinite(score):
        return None, None, f"{score_field!r} is not finite"
    return text, score, None


def _open_text(path: str):
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    if path.endswith(".bz2"):
        return bz2.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def first_unusable_line(path: str, text_field: str, score_field: str | None) -> tuple[int, str] | None:
    """(line number, reason) of the first unusable line of a JSONL file, read again in the driver (only when
    Spark counted one: its line reader gives no line numbers); None for a file Python cannot open."""
    if path.endswith(".zst"):
        return None
    with _open_text(path) as handle:
        for number, line in enumerate(handle, start=1):
            reason = judge_json_line(line, text_field, score_field)[2]
            if reason is not None:
                return number, reason
    return None


def local_file(uri: str) -> str:
    """The local path of a file URI as Spark gives it (``_metadata.file_path``)."""
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme in ("", "file") else uri


def _judged_json_lines(batches: Iterator[Any], text_field: str, score_field: str | None) -> Iterator[Any]:
    import pyarrow as pa

    for batch in batches:
        judged = [
            judge_json_line(line, text_field, score_field) for line in batch.column("value").to_pylist()
        ]
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([text for text, _, _ in judged], pa.string()),
                pa.array([score for _, score, _ in judged], pa.float64()),
                batch.column("file"),
                pa.array([reason for _, _, reason in judged], pa.string()),
            ],
            names=["text", "score", "file", "reason"],
        )


_NUMERIC = ("tinyint", "smallint", "int", "bigint", "float", "double", "decimal")


def _judged_columns(
    frame: DataFrame, source: TextSource, origin: str, score: bool, text_column: str | None = None
) -> DataFrame:
    """(text, score, file, reason) of a table's rows (Parquet, a stage's output, .txt files); ``text_column``
    where the text is not in ``text_field`` (Spark's text reader calls it value)."""
    from pyspark.sql import functions as F

    types = dict(frame.dtypes)
    text_column = text_column or source.text_field
    wanted = [text_column, *([source.score_field] if score and source.score_field else [])]
    missing = [name for name in wanted if name not in types]
    if missing:
        raise ConfigError(
            f"{origin}: no column {missing} (columns: {frame.columns}); set text_field/score_field"
        )
    if types[text_column] != "string":
        raise ConfigError(
            f"{origin}: column {text_column!r} holds {types[text_column]}, not text; set text_field"
        )
    text = F.col(text_column)
    reason = F.when(text.isNull(), F.lit(f"no {source.text_field!r}")).when(
        F.length(F.trim(text)) == 0, F.lit(f"empty {source.text_field!r}")
    )
    value = F.lit(None).cast("double")
    if score and source.score_field is not None:
        field, kind = source.score_field, types[source.score_field]
        if kind != "string" and not kind.startswith(_NUMERIC):
            raise ConfigError(f"{origin}: column {field!r} holds {kind}, not a number; set score_field")
        value = F.col(field).try_cast("double")
        reason = (
            reason.when(F.col(field).isNull(), F.lit(f"no {field!r}"))
            .when(value.isNull(), F.lit(f"{field!r} is not a number"))
            .when(F.isnan(value) | (F.abs(value) == float("inf")), F.lit(f"{field!r} is not finite"))
        )
    return frame.select(
        text.alias("text"),
        value.alias("score"),
        F.col("_metadata.file_path").alias("file"),
        reason.alias("reason"),
    )


def read_text_source(
    spark: SparkSession, source: TextSource, config: PipelineConfig, *, score: bool = False
) -> DataFrame:
    """(text, score, file, reason) rows of ``source``, one a line (JSONL), row (Parquet) or file (.txt):
    ``reason`` is None for a usable one (a non-empty text and, with ``score``, a finite score), else why not;
    ``file`` is the file's URI (``local_file`` makes it a path)."""
    from pyspark.sql import functions as F

    if score and source.score_field is None:
        raise ConfigError(
            f"{source.describe()}: labelled examples need score_field, the column holding each score"
        )
    if source.stage is not None:
        frame = spark.read.parquet(str(stage_documents(config, source).path / "documents"))
        return _judged_columns(frame, source, source.describe(), score)
    assert source.path is not None  # the validator: files or a stage's output
    fmt, files = source_files(source.path)
    fmt = fmt if source.format == "auto" else source.format
    if fmt == "parquet":
        return _judged_columns(spark.read.parquet(*files), source, source.path, score)
    if fmt == "text":
        frame = spark.read.text(files, wholetext=True)
        return _judged_columns(frame, source, source.path, score, text_column="value")
    lines = spark.read.text(files).select("value", F.col("_metadata.file_path").alias("file"))
    return map_in_arrow(
        lines,
        functools.partial(
            _judged_json_lines,
            text_field=source.text_field,
            score_field=source.score_field if score else None,
        ),
        "text string, score double, file string, reason string",
    )


def usable(frame: DataFrame, source: TextSource, config: PipelineConfig) -> DataFrame:
    """The usable rows of a judged source, (text, score); ``max_documents`` sampled by a seeded hash."""
    from pyspark.sql import functions as F

    frame = frame.where(F.col("reason").isNull()).select("text", "score")
    if source.max_documents is not None:
        order = F.xxhash64(F.lit(config.project.seed), F.col("text"))
        frame = frame.orderBy(order, "text").limit(source.max_documents)
    return frame
