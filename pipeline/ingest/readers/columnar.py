"""What the columnar readers (Parquet, Arrow) share: record batches into rows, a bad value costing only its
record."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pipeline.ingest.config import IngestConfig
from pipeline.ingest.readers.records import file_failure, quarantined, tabular_row


def no_text_column(config: IngestConfig, names: list[str]) -> str:
    return f"missing_text_column: {config.text_column} (columns: {', '.join(names)[:200]})"


def wanted_columns(config: IngestConfig, names: list[str]) -> list[str]:
    wanted = [config.text_column, config.url_column, config.id_column, *config.metadata_columns]
    return [name for name in dict.fromkeys(wanted) if name in names]


def batch_rows(
    source: str,
    fmt: str,
    batches: Iterator[pa.RecordBatch],
    first: int,
    config: IngestConfig,
    missing: str | None = None,
) -> Iterator[dict[str, Any]]:
    """Rows of a columnar file's record batches (Parquet, Arrow), numbered from ``first``: texts are read
    as bytes, so invalid UTF-8 and oversized texts are quarantined one by one, not for the whole batch.
    ``missing``: the file has no text column; every record is quarantined with that reason."""
    number = first - 1
    try:
        for batch in batches:
            if missing is not None:
                for _ in range(batch.num_rows):
                    number += 1
                    yield quarantined(source, number, fmt, missing)
                continue
            text_column = batch.column(config.text_column)
            if pa.types.is_string(text_column.type) or pa.types.is_large_string(text_column.type):
                raw_texts = text_column.cast(pa.large_binary()).to_pylist()  # no UTF-8 check on the way
            else:
                raw_texts = _values(text_column)
            others = {
                name: _values(batch.column(name)) for name in batch.schema.names if name != config.text_column
            }
            for row, raw in enumerate(raw_texts):
                number += 1
                nbytes: int | None = None
                if isinstance(raw, bytes):
                    nbytes = len(raw)
                    if nbytes > config.max_record_bytes:
                        reason = f"too_large: {nbytes} bytes > {config.max_record_bytes}"
                        yield quarantined(source, number, fmt, reason, nbytes)
                        continue
                    try:
                        raw = raw.decode("utf-8")
                    except UnicodeDecodeError as exc:
                        yield quarantined(source, number, fmt, f"invalid_utf8: byte {exc.start}", nbytes)
                        continue
                elif isinstance(raw, _Undecodable):
                    yield quarantined(source, number, fmt, raw.reason(config.text_column), nbytes)
                    continue
                bad = next(
                    (name for name, values in others.items() if isinstance(values[row], _Undecodable)), None
                )
                if bad is not None:
                    yield quarantined(source, number, fmt, others[bad][row].reason(bad), nbytes)
                    continue
                fields = {name: values[row] for name, values in others.items()}
                fields[config.text_column] = raw
                try:
                    yield tabular_row(source, number, fmt, fields, nbytes or 0, config)
                except Exception as exc:
                    yield quarantined(source, number, fmt, f"ingest_error:{type(exc).__name__}", nbytes)
    except Exception as exc:
        yield quarantined(source, number + 1, fmt, file_failure(exc))


@dataclass(frozen=True)
class _Undecodable:
    """A column value that could not be turned into a Python value; its record is quarantined alone."""

    kind: str  # invalid_utf8 | undecodable
    detail: str

    def reason(self, column: str) -> str:
        return f"{self.kind}: column {column}: {self.detail}"[:300]


def _values(column: pa.Array) -> list[Any]:
    """The column's values, one per record; a value that cannot be decoded becomes ``_Undecodable`` for its
    record only, so one invalid UTF-8 url does not quarantine its whole row group (1,000 rows) as one row."""
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        values = column.cast(pa.large_binary()).to_pylist()  # read as bytes: no UTF-8 check for the batch
        decoded: list[Any] = []
        for value in values:
            if value is None:
                decoded.append(None)
                continue
            try:
                decoded.append(value.decode("utf-8"))
            except UnicodeDecodeError as exc:
                decoded.append(_Undecodable("invalid_utf8", f"byte {exc.start}"))
        return decoded
    try:
        return column.to_pylist()
    except Exception:  # one bad value (a nested string, an out-of-range date): find it record by record
        values = []
        for index in range(len(column)):
            try:
                values.append(column[index].as_py())
            except Exception as exc:
                values.append(_Undecodable("undecodable", f"{type(exc).__name__}: {exc}"))
        return values
