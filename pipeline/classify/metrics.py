"""Held-out figures of a binary classifier: precision, recall, ROC AUC, calibration, and their plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def binary_metrics(
    labels: np.ndarray, scores: np.ndarray, bins: int = 10, threshold: float = 0.5
) -> dict[str, Any]:
    """Precision and recall of ``score >= threshold``, ROC AUC, and the calibration table (mean score and
    share of positives in each of ``bins`` equal-width score bins)."""
    from sklearn.metrics import roc_auc_score

    labels = np.asarray(labels, dtype=np.int64)
    scores = np.asarray(scores, dtype=np.float64)
    predicted = scores >= threshold
    true_positive = int(np.sum(predicted & (labels == 1)))
    positives, predicted_positive = int(np.sum(labels == 1)), int(np.sum(predicted))
    both = 0 < positives < len(labels)
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.digitize(scores, edges[1:-1]), 0, bins - 1)
    calibration = []
    for index in range(bins):
        inside = which == index
        count = int(inside.sum())
        calibration.append(
            {
                "low": float(edges[index]),
                "high": float(edges[index + 1]),
                "documents": count,
                "mean_score": float(scores[inside].mean()) if count else None,
                "positive_share": float(labels[inside].mean()) if count else None,
            }
        )
    return {
        "heldout_documents": len(labels),
        "heldout_positives": positives,
        "threshold": threshold,
        "precision": true_positive / predicted_positive if predicted_positive else None,
        "recall": true_positive / positives if positives else None,
        "accuracy": float(np.mean(predicted == (labels == 1))) if len(labels) else None,
        "roc_auc": float(roc_auc_score(labels, scores)) if both else None,
        "calibration": calibration,
    }


def plot_calibration(metrics: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [row for row in metrics["calibration"] if row["documents"]]
    figure, axis = plt.subplots(figsize=(4.5, 4.5))
    axis.plot([0, 1], [0, 1], color="0.7", linestyle="--", label="perfectly calibrated")
    axis.plot(
        [r["mean_score"] for r in rows], [r["positive_share"] for r in rows], marker="o", label="held out"
    )
    axis.set(
        title=f"calibration (ROC AUC {metrics['roc_auc']:.3f})"
        if metrics["roc_auc"] is not None
        else "calibration",
        xlabel="mean score in bin",
        ylabel="share of positives",
        xlim=(0, 1),
        ylim=(0, 1),
    )
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


def plot_score_histogram(labels: np.ndarray, scores: np.ndarray, path: Path, bins: int = 20) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = np.asarray(labels)
    figure, axis = plt.subplots(figsize=(6, 3.5))
    edges = np.linspace(0, 1, bins + 1).tolist()
    for value, name in ((1, "positives"), (0, "negatives")):
        axis.hist(np.clip(scores[labels == value], 0, 1), bins=edges, histtype="step", label=name)
    axis.set(title="held-out scores by true label", xlabel="score", ylabel="documents")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path
