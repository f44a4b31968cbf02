"""Parquet, one row group (a task's part) or the whole file, batch by batch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pipeline.ingest.config import IngestConfig
from pipeline.ingest.readers.columnar import batch_rows, no_text_column, wanted_columns
from pipeline.ingest.readers.records import BATCH_ROWS, file_failure, quarantined
from pipeline.ingest.sources import open_source


def read_parquet(
    source: str, fmt: str, size: int, config: IngestConfig, part: int | None = None
) -> Iterator[dict[str, Any]]:
    """One row group (``part``) of a Parquet file, or all of it; records are numbered across the file."""
    import pyarrow.parquet as pq

    with open_source(source) as handle:
        try:
            parquet = pq.ParquetFile(handle)
        except Exception as exc:
            yield quarantined(source, 0, fmt, file_failure(exc))
            return
        metadata = parquet.metadata
        groups = list(range(metadata.num_row_groups)) if part is None else [part]
        first = sum(metadata.row_group(index).num_rows for index in range(groups[0] if groups else 0))
        names = parquet.schema_arrow.names
        if config.text_column not in names:
            reason = no_text_column(config, names)
            rows = sum(metadata.row_group(index).num_rows for index in groups)
            for number in range(first, first + rows):
                yield quarantined(source, number, fmt, reason)
            return
        columns = wanted_columns(config, names)
        batches = parquet.iter_batches(batch_size=BATCH_ROWS, row_groups=groups, columns=columns)
        yield from batch_rows(source, fmt, batches, first, config)
