"""The Parquet fetch index (one row per URL the crawl queued) and the counts that go in the manifest.

Contract read by the clean stage: rows with ``status == 200`` have a WARC response record at
``<crawl output>/<warc_file>`` byte ``warc_offset``. Rows with no stored response have a null status
and say why in ``failure_reason``; a stored page can carry a reason too (``http_404``,
``binary_content``). ``original_url`` is the queued URL when a redirect led to ``url``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

INDEX_SCHEMA = pa.schema(
    [
        ("url", pa.string()),
        ("domain", pa.string()),
        ("depth", pa.int32()),
        ("status", pa.int32()),
        ("content_type", pa.string()),
        ("content_length", pa.int64()),
        ("fetch_time", pa.timestamp("us", tz="UTC")),
        ("warc_file", pa.string()),
        ("warc_offset", pa.int64()),
        ("warc_length", pa.int64()),
        ("failure_reason", pa.string()),
        ("original_url", pa.string()),
        ("registered_domain", pa.string()),
        ("redirects", pa.int32()),
        ("retries", pa.int32()),
        ("ip_address", pa.string()),
        ("shard", pa.string()),
    ]
)


def index_table(rows: Iterable[dict[str, Any]]) -> pa.Table:
    """Rows sorted by URL, so a shard's index bytes do not depend on fetch order."""
    rows = [
        {**row, "fetch_time": datetime.fromisoformat(row["fetch_time"])}
        if isinstance(row["fetch_time"], str)
        else row
        for row in rows
    ]
    rows.sort(key=lambda row: (row["url"], row.get("original_url") or ""))
    return pa.Table.from_pylist(rows, schema=INDEX_SCHEMA)


def write_index(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def _counts(table: pa.Table, column: str) -> dict[str, int]:
    values = table.column(column).drop_null()
    counted = pc.value_counts(values)
    return {str(item["values"]): int(item["counts"]) for item in counted.to_pylist()}


def crawl_counters(table: pa.Table) -> dict[str, Any]:
    """Totals, and counts by status, by reason and by domain (hosts), for a manifest."""
    status = table.column("status")
    stored = pc.is_valid(table.column("warc_offset"))
    fetched = pc.fill_null(pc.equal(status, 200), False)
    failed = pc.is_valid(table.column("failure_reason"))
    by_domain: dict[str, dict[str, Any]] = {}
    if table.num_rows:
        enriched = table.select(["domain", "content_length"]).append_column(
            "fetched", pc.cast(fetched, pa.int64())
        )
        enriched = enriched.append_column("failed", pc.cast(failed, pa.int64()))
        grouped = enriched.group_by("domain").aggregate(
            [([], "count_all"), ("fetched", "sum"), ("failed", "sum"), ("content_length", "sum")]
        )
        for row in grouped.to_pylist():
            by_domain[row["domain"]] = {
                "requests": row["count_all"],
                "fetched": row["fetched_sum"],
                "failed": row["failed_sum"],
                "bytes": row["content_length_sum"] or 0,
            }
        reasons = table.select(["domain", "failure_reason"]).filter(failed)
        for row in reasons.group_by(["domain", "failure_reason"]).aggregate([([], "count_all")]).to_pylist():
            by_domain[row["domain"]].setdefault("by_reason", {})[row["failure_reason"]] = row["count_all"]
    return {
        "requests": table.num_rows,
        "fetched": int(pc.sum(pc.cast(fetched, pa.int64())).as_py() or 0),
        "stored": int(pc.sum(pc.cast(stored, pa.int64())).as_py() or 0),
        "failed": int(pc.sum(pc.cast(failed, pa.int64())).as_py() or 0),
        "bytes_fetched": int(pc.sum(table.column("content_length")).as_py() or 0),
        "by_status": _counts(table, "status"),
        "by_reason": _counts(table, "failure_reason"),
        "by_domain": dict(sorted(by_domain.items())),
    }


def add_counts(total: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    """Sum two nested count dicts (numbers add, dicts recurse)."""
    merged = dict(total)
    for key, value in part.items():
        if isinstance(value, dict):
            merged[key] = add_counts(merged.get(key, {}), value)
        elif isinstance(value, int | float):
            merged[key] = merged.get(key, 0) + value
    return merged
