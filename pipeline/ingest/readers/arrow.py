"""Arrow IPC files (Hugging Face ``save_to_disk`` shards), record batch by record batch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from pipeline.ingest.config import IngestConfig
from pipeline.ingest.readers.columnar import batch_rows, no_text_column, wanted_columns
from pipeline.ingest.readers.records import file_failure, quarantined
from pipeline.ingest.sources import open_source


def read_arrow(
    source: str, fmt: str, size: int, config: IngestConfig, part: int | None = None
) -> Iterator[dict[str, Any]]:
    """An Arrow IPC file as Hugging Face's ``Dataset.save_to_disk`` writes its shards (the stream format;
    the random-access file format is read too), record batch by record batch."""
    with open_source(source) as handle:
        try:
            try:
                stream = pa.ipc.open_stream(handle)
                names, batches = stream.schema.names, iter(stream)
            except pa.ArrowInvalid:  # not a stream: the file format starts with its own magic bytes
                handle.seek(0)
                reader = pa.ipc.open_file(handle)
                names = reader.schema.names
                batches = (reader.get_batch(index) for index in range(reader.num_record_batches))
        except Exception as exc:
            yield quarantined(source, 0, fmt, file_failure(exc))
            return
        if config.text_column not in names:
            batches = (batch.select([]) for batch in batches)  # read only to number the records
            yield from batch_rows(source, fmt, batches, 0, config, no_text_column(config, names))
            return
        columns = wanted_columns(config, names)
        yield from batch_rows(source, fmt, (batch.select(columns) for batch in batches), 0, config)
