"""The report a person reads: ``report.html``, one static page with its plots inline, and ``plots/*.png``.

The page answers four questions in this order: which subjects the snapshot covers, how diverse it is,
what cleaning and dedup removed and why, and whether it got better or worse than the previous snapshot.
The gate's verdict and the figures that changed most sit at the top.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# What each figure means, for the page (docs/quality.md has the full definitions).
DEFINITIONS = {
    "self_bleu": "mean BLEU (0-100) of each sampled document against the others: higher, more alike",
    "bertscore_f1": "mean greedy token-embedding F1 over sampled pairs: higher, more alike",
    "vendi_score": "effective number of distinct documents in the sample (1 to the sample size)",
    "mean_pairwise_cosine": "mean cosine between sample embeddings: higher, more alike",
    "mean_nearest_neighbour_cosine": "mean cosine to each document's nearest neighbour",
    "near_duplicate_share": "sampled documents with a neighbour above cosine 0.95",
    "cluster_entropy": "normalised entropy of k-means cluster sizes: 1 is evenly spread",
    "distinct_1gram_ratio": "distinct words / words in the sample",
    "distinct_2gram_ratio": "distinct word pairs / word pairs in the sample",
    "compression_ratio_mean": "gzip bytes / text bytes, mean: lower, more repetitive",
    "compression_ratio_p10": "the 10th percentile of the same: the most repetitive tenth",
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    _pyplot().close(figure)
    return path


def plot_hosts(hosts: list[dict], path: Path) -> Path:
    plt = _pyplot()
    top = hosts[:20]
    figure, axis = plt.subplots(figsize=(8, max(2.5, 0.3 * len(top) + 1)))
    axis.barh(
        [row["domain"] or "(none)" for row in reversed(top)],
        [row["documents"] for row in reversed(top)],
        color="tab:blue",
    )
    axis.set(title="documents per web host (top 20)", xlabel="documents")
    return _save(figure, path)


def plot_lengths(lengths: np.ndarray, path: Path) -> Path:
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(7, 3.5))
    if len(lengths):
        bins = np.logspace(math.log10(max(1, lengths.min())), math.log10(max(2, lengths.max())), 40)
        axis.hist(lengths, bins=bins, color="tab:green")
        axis.set_xscale("log")
    axis.set(title="document length (sample)", xlabel="characters (log scale)", ylabel="documents")
    return _save(figure, path)


def plot_embeddings(embeddings: np.ndarray, labels: Sequence[str], path: Path, title: str) -> Path:
    """The sample's embeddings on their first two principal components, coloured by ``labels``."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(6, 5))
    if len(embeddings) >= 3:
        centred = embeddings - embeddings.mean(axis=0)
        _, _, components = np.linalg.svd(centred, full_matrices=False)
        projected = centred @ components[:2].T
        names, counts = np.unique(np.asarray(labels, dtype=object).astype(str), return_counts=True)
        top = [str(n) for n in names[np.argsort(-counts, kind="stable")][:8]]
        shown = np.array([label if label in top else "other" for label in map(str, labels)])
        for name in [*top, "other"]:
            mask = shown == name
            if mask.any():
                axis.scatter(projected[mask, 0], projected[mask, 1], s=8, label=name)
        axis.legend(fontsize=7, loc="best")
    axis.set(title=title, xlabel="PC1", ylabel="PC2")
    return _save(figure, path)


# --- the page ----------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return "<td class='na'>n/a</td>"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)  # a count that went through the trends' arithmetic
    if isinstance(value, float):
        return f"<td class='num'>{value:.4g}</td>"
    if isinstance(value, int):
        return f"<td class='num'>{value:,}</td>"
    return f"<td>{html.escape(str(value))}</td>"


def table_html(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def image_html(path: Path | None, wide: bool = False) -> str:
    if path is None:
        return ""
    data = base64.b64encode(path.read_bytes()).decode()
    style = ' class="wide"' if wide else ""
    return f'<img alt="{html.escape(path.stem)}"{style} src="data:image/png;base64,{data}">'


def _gate(verdict: Mapping[str, Any] | None) -> str:
    if not verdict or verdict["mode"] == "ignore":
        return ""
    if verdict["passed"]:
        return "<p class='pass'><b>Quality gate: passed.</b></p>"
    items = "".join(f"<li>{html.escape(failure)}</li>" for failure in verdict["failures"])
    effect = "not announced for training" if verdict["mode"] == "fail" else "announced anyway (mode warn)"
    return f"<div class='fail'><h2>Quality gate: failed, {effect}</h2><ul>{items}</ul></div>"


def _warnings(warnings: Sequence[str]) -> str:
    if not warnings:
        return ""
    items = "".join(f"<li>{html.escape(w)}</li>" for w in warnings)
    return f"<div class='warn'><b>Warnings</b><ul>{items}</ul></div>"


def _card(link: str | None, snapshot: str) -> str:
    if link is None:
        return f"<p><small>No dataset card yet: <code>pretrain card --snapshot {html.escape(snapshot)}</code> writes one.</small></p>"
    return f"<p>Dataset card: <a href='{html.escape(link, quote=True)}'>{html.escape(link)}</a></p>"


def _trend_rows(trend: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    def arrow(row):
        if row["better"] is None:
            return ""
        return "better" if row["better"] else "worse"

    return [[r["metric"], r["value"], r["previous"], r["delta"], arrow(r)] for r in trend]


PAGE_STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:1200px}td,th{padding:2px 10px;text-align:left}"
    "td.num{text-align:right;font-variant-numeric:tabular-nums}td.na{color:#999}"
    "img{max-width:48%;margin:4px;vertical-align:top}img.wide{max-width:96%}.fail{background:#fde2e1;padding:4px 12px}"
    ".warn{background:#fff4d6;padding:4px 12px}.pass{color:#176b2c}section{margin-top:1.5em}"
    "small{color:#555}"
)


def _cut_text(cut: Mapping[str, Any]) -> str:
    mode = cut.get("mode")
    if mode == "top_fraction":
        return f"top {cut['top_fraction']:.3g} (kept {cut['target']:,} of {cut['scored']:,}; cut at {cut.get('threshold')})"
    if mode == "threshold":
        per_language = ", ".join(
            f"{lang} {value}" for lang, value in cut.get("language_thresholds", {}).items()
        )
        side = ">=" if cut.get("keep") == "high" else "<="
        return f"score {side} {cut.get('threshold')}" + (f" ({per_language})" if per_language else "")
    return "scores only"


def _filtering_section(metrics: Mapping[str, Any], images: Mapping[str, Path | None]) -> str:
    """Classifiers (cut, drops, score histograms) and decontamination (sets, n-grams, drops), when run."""
    classifiers = metrics.get("classifiers") or {}
    decontamination = metrics.get("decontamination") or {}
    if not classifiers and not decontamination.get("sets"):
        return ""
    rows = [
        [
            name,
            record.get("kind"),
            record.get("source"),
            (record.get("sha256") or "")[:12],
            _cut_text(record.get("cut") or {}),
            record.get("dropped"),
            json.dumps(record.get("passed_through") or {}),
        ]
        for name, record in classifiers.items()
    ]
    plots = "".join(image_html(images.get(f"scores_{name}")) for name in classifiers)
    set_rows = [
        [
            name,
            row.get("kind"),
            row.get("items"),
            row.get("ngrams"),
            decontamination.get("dropped", {}).get(f"contaminated:{name}", 0),
        ]
        for name, row in (decontamination.get("sets") or {}).items()
    ]
    return f"""<section><h2>Classifiers and decontamination</h2><small>Scores are of every document the classify
stage read, kept or dropped, per language; the dashed line is the cut. Choose a threshold where the histogram says.</small>
{table_html(["model", "kind", "source", "sha256", "selection", "dropped", "passed through (by language)"], rows)}{plots}
{table_html(["evaluation set", "kind", "items", "n-grams", "documents dropped"], set_rows)}</section>"""


def write_page(
    path: Path,
    snapshot: str,
    metrics: Mapping[str, Any],
    hosts: list[dict],
    images: Mapping[str, Path | None],
    trend: Sequence[Mapping[str, Any]],
    previous: str | None,
    warnings: Sequence[str] = (),
    card: str | None = None,
) -> None:
    """``images`` by name: subjects, diversity plots (compression, embeddings), funnel, trends, hosts.
    ``card``: the link to the documents' dataset card (``pretrain card``), when they have one."""
    subjects = metrics.get("subjects") or {}
    subject_rows = [
        [name, row["documents"], row["share"], row.get("mean_margin")] for name, row in subjects.items()
    ]
    if "unassigned_share" in metrics:
        subject_rows.append(
            ["(unassigned)", metrics.get("unassigned_documents"), metrics["unassigned_share"], None]
        )
    diversity = [[key, metrics.get(key), text] for key, text in DEFINITIONS.items() if key in metrics]
    funnel_rows = [
        [s["stage"], s["reason"], s["documents"], s.get("characters")] for s in metrics.get("funnel", [])
    ]
    language_rows = [
        [lang, row["kept"], row["dropped"]] for lang, row in metrics.get("funnel_languages", {}).items()
    ]
    pii = ", ".join(f"{kind} {count:,}" for kind, count in metrics.get("pii_redacted", {}).items()) or "none"
    host_rows = [[row["domain"], row["documents"], row["characters"]] for row in hosts[:50]]
    filtering = _filtering_section(metrics, images)
    other = [
        [key, value if isinstance(value, int | float | str) or value is None else json.dumps(value)]
        for key, value in sorted(metrics.items())
        if key
        not in (
            "funnel",
            "funnel_languages",
            "gate",
            "subjects",
            "warnings",
            "classifiers",
            "decontamination",
        )
    ]
    compared = (
        f"<p>Compared with snapshot <b>{html.escape(previous)}</b>.</p>"
        + table_html(["metric", "this snapshot", "previous", "change", ""], _trend_rows(trend))
        if previous
        else "<p>No earlier snapshot of this corpus to compare with yet.</p>"
    )
    sampled = metrics.get("sampled_documents")
    pairwise = metrics.get("pairwise_docs")
    page = f"""<!DOCTYPE html><html><head><meta charset='utf-8'>
<title>Data quality: {html.escape(snapshot)}</title><style>{PAGE_STYLE}</style></head><body>
<h1>Data quality report: {html.escape(snapshot)}</h1>
<p>{metrics.get("documents", 0):,} documents, {metrics.get("characters", 0):,} characters;
sample of {sampled} documents (pairwise metrics on {pairwise}), seed {metrics.get("seed")}.</p>
{_card(card, snapshot)}
{_gate(metrics.get("gate"))}{_warnings(warnings)}
<section><h2>Subjects</h2><small>Each sampled document goes to the subject whose prototype texts it is
closest to (embedding cosine); "unassigned" when no subject is close or two are tied.</small>
{table_html(["subject", "documents", "share", "mean margin"], subject_rows)}{image_html(images.get("subjects"))}</section>
<section><h2>Diversity</h2>{table_html(["metric", "value", "meaning"], diversity)}
{image_html(images.get("compression"))}{image_html(images.get("embeddings"))}</section>
<section><h2>Drop funnel</h2>{table_html(["stage", "step", "documents", "characters"], funnel_rows)}{image_html(images.get("funnel"))}
<p>Clean, per language:</p>{table_html(["language", "kept", "dropped"], language_rows)}
<p>PII redacted in the kept documents (replaced by placeholders, not dropped): {html.escape(pii)}.</p></section>
{filtering}
<section><h2>Across snapshots</h2>{compared}{image_html(images.get("trends"), wide=True)}</section>
<section><h2>Hosts</h2><small>The web host of each document (not its subject).</small>
{image_html(images.get("hosts"))}{image_html(images.get("lengths"))}
{table_html(["host", "documents", "characters"], host_rows)}</section>
<section><h2>Metrics</h2>{table_html(["metric", "value"], other)}</section>
</body></html>
"""
    path.write_text(page)
