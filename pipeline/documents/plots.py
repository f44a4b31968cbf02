"""The score histogram of a classifier, a line per language, with its cut: where a person chooses a threshold.

Drawn by the classify stage (``plots/scores_<name>.png``) and again by the quality report, from the record the
classify stage keeps in its manifest (``extra["classify"]["models"][name]``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_scores(name: str, record: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    bins = record["bins"]
    edges = np.linspace(0, 1, bins + 1)
    figure, axis = plt.subplots(figsize=(7, 3.5))
    for lang, counts in record["histogram"].items():
        axis.stairs(counts, edges, label=f"{lang} ({sum(counts):,})")
    cut = record.get("cut", {})
    bounds = (
        {}
        if cut.get("mode", "none") == "none"
        else {"": cut.get("threshold"), **cut.get("language_thresholds", {})}
    )
    for lang, value in bounds.items():
        if value is not None:
            axis.axvline(value, color="tab:red", linestyle="--", linewidth=1)
            axis.annotate(f"cut {lang} {value:.3g}".replace("  ", " "), (value, 0), rotation=90, fontsize=7)
    mode = cut.get("mode", "none")
    title = f"classifier {name}: scores ({mode}"
    title += f" {cut['top_fraction']})" if mode == "top_fraction" else ")"
    axis.set(title=title, xlabel="score", ylabel="documents", xlim=(0, 1))
    if record["histogram"]:
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path
