"""Publish a table of documents as a stage's output, the way the classify and decontaminate tests feed them."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.storage import DatasetRef, StageOutput

DOCUMENT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("url", pa.string()),
        ("domain", pa.string()),
        ("text", pa.string()),
        ("n_chars", pa.int64()),
        ("lang", pa.string()),
    ]
)


def document(text: str, lang: str = "en", key: str | None = None) -> dict:
    digest = hashlib.sha1((key or text).encode()).hexdigest()[:16]
    return {
        "id": digest,
        "url": f"https://site{int(digest[:2], 16) % 7}.example/{digest}",
        "domain": f"site{int(digest[:2], 16) % 7}.example",
        "text": text,
        "n_chars": len(text),
        "lang": lang,
    }


def publish_documents(config, stage: str, snapshot: str, rows: list[dict], files: int = 4) -> DatasetRef:
    """``rows`` as ``<stage>/<snapshot>/documents/`` in ``files`` Parquet files, with a manifest."""
    table = pa.Table.from_pylist(rows, schema=DOCUMENT_SCHEMA)
    ref = DatasetRef.of(config, stage, snapshot)
    with StageOutput(ref, config, []) as out:
        folder = out.path / "documents"
        folder.mkdir()
        size = -(-table.num_rows // files) if table.num_rows else 0
        for index in range(files):
            pq.write_table(table.slice(index * size, size), folder / f"part-{index:05d}.parquet")
        chars = sum(row["n_chars"] for row in rows)
        out.commit(
            rows={"documents": table.num_rows},
            counters={
                "input_documents": table.num_rows,
                "kept": table.num_rows,
                "dropped": {},
                "kept_chars": chars,
                "input_chars": chars,
            },
        )
    return ref
