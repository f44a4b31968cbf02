"""Snapshot over snapshot: how this snapshot's figures compare with the earlier reports on the same corpus.

The earlier reports are the complete quality outputs of the corpus whose snapshot name sorts before this
one (snapshots are named by date, ``2026-11-29``, so name order is time order, also for a backfill that
runs them out of order). Each contributes its ``metrics.json``; the report shows the change from the
previous one and plots the last ``quality.trend_snapshots``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.core.storage import DatasetRef, local_path

log = logging.getLogger(__name__)

# The figures worth following from one snapshot to the next, with the direction that is better.
TRACKED: dict[str, str] = {
    "documents": "higher",
    "characters": "higher",
    "kept_share": "higher",
    "duplicate_share": "lower",
    "host_entropy_normalised": "higher",
    "distinct_2gram_ratio": "higher",
    "mean_pairwise_cosine": "lower",
    "cluster_entropy": "higher",
    "self_bleu": "lower",
    "bertscore_f1": "lower",
    "vendi_score": "higher",
    "compression_ratio_mean": "higher",
    "subject_entropy_normalised": "higher",
    "unassigned_share": "lower",
}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def earlier_reports(ref: DatasetRef, last: int) -> list[tuple[str, dict[str, Any]]]:
    """(snapshot, metrics) of the ``last`` complete reports on ``ref``'s corpus before ``ref.snapshot``,
    oldest first. A report whose metrics cannot be read is skipped with a warning, not fatal."""
    folder = local_path(ref.root) / ref.corpus / ref.stage
    if not folder.is_dir():
        return []
    earlier = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or path.name >= ref.snapshot:
            continue
        other = DatasetRef(ref.root, ref.corpus, ref.stage, path.name)
        if not other.is_complete():
            continue
        try:
            earlier.append((path.name, json.loads((other.path / "metrics.json").read_text())))
        except (OSError, ValueError) as exc:
            log.warning("trends: skipping %s: %s", other.what, exc)
    return earlier[-last:] if last else []


def deltas(current: Mapping[str, Any], previous: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """One row per tracked figure: value, previous value, change, and whether the change is for the better."""
    rows = []
    for key, better in TRACKED.items():
        value = _number(current.get(key))
        before = _number(previous.get(key)) if previous else None
        if value is None and before is None:
            continue
        change = value - before if value is not None and before is not None else None
        rows.append(
            {
                "metric": key,
                "value": value,
                "previous": before,
                "delta": change,
                "better": None if not change else (change > 0) == (better == "higher"),
            }
        )
    return rows


def plot_trends(history: Sequence[tuple[str, Mapping[str, Any]]], path: Path) -> Path | None:
    """Small multiples, one per tracked figure present in at least two snapshots; None when nothing to draw."""
    keys = [k for k in TRACKED if sum(_number(m.get(k)) is not None for _, m in history) >= 2]
    if not keys:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(3, len(keys))
    rows = math.ceil(len(keys) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4 * columns, 2.6 * rows), squeeze=False)
    names = [snapshot for snapshot, _ in history]
    for axis, key in zip(axes.flat, keys, strict=False):
        points = [(i, _number(m.get(key))) for i, (_, m) in enumerate(history)]
        xs = [i for i, v in points if v is not None]
        axis.plot(xs, [v for _, v in points if v is not None], marker="o", color="tab:blue")
        axis.set_xticks(range(len(names)), names, rotation=30, fontsize=7, ha="right")
        axis.set_title(f"{key} ({TRACKED[key]} is better)", fontsize=9)
    for axis in list(axes.flat)[len(keys) :]:
        axis.axis("off")
    figure.suptitle("quality over snapshots")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path
