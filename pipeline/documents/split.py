"""A filtering stage's decision written as its output: the kept rows in ``documents/``, the dropped ones with
their reason in ``excluded/``.

Every stage that keeps some documents and sets the others aside (ingest, clean, dedup, classify,
decontaminate) writes through ``write_split``, so the two folders are laid out, ordered and counted one way.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.spark import write_parquet_parts

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

DOCUMENTS = "documents"
EXCLUDED = "excluded"


def write_split(
    decided: DataFrame,
    path: Path,
    num_files: int,
    *,
    reason: str = "drop_reason",
    document_columns: Sequence[str] | None = None,
    excluded_columns: Sequence[str | Column] | None = None,
    kept_rows: int | None = None,
    excluded_rows: int | None = None,
    tiebreak: tuple[str, ...] = (),
) -> tuple[int, int]:
    """Write ``decided`` into ``path/documents`` (rows whose ``reason`` is null) and ``path/excluded`` (the
    others); returns (kept, excluded) row counts.

    ``document_columns``: the columns a kept document has (default: all but ``reason``).
    ``excluded_columns``: the columns (or expressions) of an excluded row (default: all of them).
    ``kept_rows``/``excluded_rows``: counts the caller already has, so an empty side is written without a
    Spark job. ``tiebreak`` orders rows that share an id (see ``write_parquet``).
    """
    # Both folders in one Spark job: on a small snapshot a stage's time is mostly its number of jobs.
    kept, excluded = write_parquet_parts(
        decided,
        split_parts(decided, path, reason, document_columns, excluded_columns, kept_rows, excluded_rows),
        num_files,
        tiebreak=tiebreak,
    )
    return kept, excluded


def split_parts(
    decided: DataFrame,
    path: Path,
    reason: str = "drop_reason",
    document_columns: Sequence[str] | None = None,
    excluded_columns: Sequence[str | Column] | None = None,
    kept_rows: int | None = None,
    excluded_rows: int | None = None,
) -> list[tuple[Path, Column, Sequence[str | Column], int | None]]:
    """``write_split``'s two parts (``write_parquet_parts``), for a stage that writes another dataset of the same
    frame in the same job (dedup's keys); the arguments are ``write_split``'s."""
    from pyspark.sql import functions as F

    if document_columns is None:
        document_columns = [name for name in decided.columns if name != reason]
    if excluded_columns is None:
        excluded_columns = decided.columns
    return [
        (path / DOCUMENTS, F.col(reason).isNull(), document_columns, kept_rows),
        (path / EXCLUDED, F.col(reason).isNotNull(), excluded_columns, excluded_rows),
    ]
