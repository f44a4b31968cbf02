"""An output that holds its input's documents unchanged, for a filtering stage with nothing configured.

The classify stage with no model and the decontaminate stage with no evaluation n-gram keep every document.
Rather than start Spark to rewrite identical bytes, ``documents/`` is made of hard links to the input's files
(copies where the filesystem cannot link): the same bytes and checksums, no Spark job. The input's later
republish deletes its own links, never these. ``excluded/`` is one empty Parquet file with the schema a
real run would give it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.storage import DatasetRef


def link_or_copy_tree(source: Path, target: Path) -> None:
    target.mkdir(parents=True)
    for path in sorted(source.rglob("*")):
        destination = target / path.relative_to(source)
        if path.is_dir():
            destination.mkdir(exist_ok=True)
            continue
        try:
            os.link(path, destination)
        except OSError:  # another filesystem, or one without hard links
            shutil.copy2(path, destination)


def documents_schema(folder: Path) -> pa.Schema:
    files = sorted(folder.glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no Parquet files in {folder}")
    return pq.read_schema(files[0])


def pass_through(
    source: DatasetRef, out_path: Path, excluded_fields: Iterable[pa.Field] = ()
) -> tuple[dict[str, int], dict]:
    """Write ``documents/`` (links to the input's) and an empty ``excluded/``; returns (rows, counters)."""
    upstream = source.manifest()
    link_or_copy_tree(source.path / "documents", out_path / "documents")
    schema = documents_schema(out_path / "documents")
    for extra in (*excluded_fields, pa.field("drop_reason", pa.string())):
        schema = schema.append(extra)
    (out_path / "excluded").mkdir()
    pq.ParquetWriter(out_path / "excluded" / "part-00000.parquet", schema, compression="zstd").close()
    documents = int(upstream.rows.get("documents", 0))
    counters = {"input_documents": documents, "kept": documents, "dropped": {}, "dropped_chars": {}}
    if "kept_chars" in upstream.counters:
        chars = int(upstream.counters["kept_chars"])
        counters.update({"input_chars": chars, "kept_chars": chars})
    return {"documents": documents, "excluded": 0}, counters
