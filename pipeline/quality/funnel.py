"""The drop funnel: what each stage before the report removed, and why, in documents.

Read from the manifests along the report's lineage (its input's manifest names the manifest it was made
from, and so on back to the crawl or ingest), so it costs nothing to compute and describes exactly the
outputs the report's documents came from. Every step keeps the books: documents in = kept + dropped.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.core.manifest import MANIFEST_NAME, Manifest

# Clean's rules in the order the recipe applies them (the manifest lists them alphabetically).
CLEAN_RULE_ORDER = (
    "url",
    "extract",
    "clean",
    "normalize",
    "language",
    "gopher_repetition",
    "gopher_quality",
    "c4",
    "fineweb",
)


@dataclass(frozen=True)
class Step:
    stage: str
    reason: str  # why these documents left; "kept" for the last row
    documents: int
    characters: int | None = None  # of those documents, where the stage's manifest counts them


def lineage(manifest: Manifest) -> list[Manifest]:
    """``manifest`` and the manifests it was made from, following each first input, oldest first."""
    chain = [manifest]
    while chain[-1].inputs:
        path = Path(chain[-1].inputs[0]["path"]) / MANIFEST_NAME
        if not path.is_file():  # an input since replaced or removed: the funnel starts here
            break
        chain.append(Manifest.read(path))
    return chain[::-1]


# Dedup's reasons in the order it decides them (a document without text never reaches the others).
DEDUP_REASON_ORDER = ("null_text", "url_duplicate", "exact_duplicate", "near_duplicate", "semantic_duplicate")


def _dedup_reason_rank(reason: str) -> tuple[int, str]:
    order = DEDUP_REASON_ORDER.index(reason) if reason in DEDUP_REASON_ORDER else len(DEDUP_REASON_ORDER)
    return order, reason


def _clean_rule_rank(rule: str) -> tuple[int, str]:
    prefix = rule.split(".", 1)[0].split(":", 1)[0]
    order = CLEAN_RULE_ORDER.index(prefix) if prefix in CLEAN_RULE_ORDER else len(CLEAN_RULE_ORDER)
    return order, rule


def _drops(manifest: Manifest) -> Iterator[Step]:
    counters = manifest.counters
    if manifest.stage in ("crawl", "crawl-shards"):
        for reason, count in sorted(counters.get("by_reason", {}).items()):
            yield Step("crawl", reason, int(count))
    elif "dropped" in counters and isinstance(
        counters["dropped"], dict
    ):  # clean, dedup, and stages like them
        order = {"clean": _clean_rule_rank, "dedup": _dedup_reason_rank}.get(manifest.stage)
        characters = counters.get("dropped_chars", {})
        for reason in sorted(counters["dropped"], key=order):
            chars = characters.get(reason)
            yield Step(
                manifest.stage,
                reason,
                int(counters["dropped"][reason]),
                None if chars is None else int(chars),
            )


def _documents_in(manifest: Manifest) -> int | None:
    counters = manifest.counters
    for key in ("requests", "input_pages", "input_documents"):
        if key in counters:
            return int(counters[key])
    return None


def _documents_out(manifest: Manifest) -> int | None:
    counters, rows = manifest.counters, manifest.rows
    if manifest.stage in ("crawl", "crawl-shards"):
        return int(counters.get("fetched", rows.get("pages", 0)))
    if "kept" in counters:
        return int(counters["kept"])
    return int(rows["documents"]) if "documents" in rows else None


def _count(counters: dict, key: str) -> int | None:
    return int(counters[key]) if key in counters else None


def funnel(manifest: Manifest) -> list[Step]:
    """The steps from the first manifest of the lineage to ``manifest``'s kept documents.

    Between two stages, documents the next stage did not take in (a crawl's stored pages that were not
    HTTP 200, for instance) are a step of their own, so the rows still add up.
    """
    steps: list[Step] = []
    previous_out: int | None = None
    chain = lineage(manifest)
    for index, stage in enumerate(chain):
        documents_in = _documents_in(stage)
        if previous_out is not None and documents_in is not None and documents_in != previous_out:
            steps.append(Step(stage.stage, "not_taken_in", previous_out - documents_in))
        if previous_out is None and documents_in is not None:
            steps.append(Step(stage.stage, "input", documents_in, _count(stage.counters, "input_chars")))
        steps.extend(_drops(stage))
        out = _documents_out(stage)
        previous_out = out if out is not None else previous_out
        if index == len(chain) - 1 and out is not None:
            steps.append(Step(stage.stage, "kept", out, _count(stage.counters, "kept_chars")))
    return steps


def documents_read_by(steps: list[Step], stage: str) -> int:
    """Documents a stage took in: what was left before its first step."""
    left = None
    for step in steps:
        if step.reason == "input":
            left = step.documents
        elif step.stage == stage:
            return left or 0
        elif step.reason != "kept" and left is not None:
            left -= step.documents
    return 0


def _dropped_share(steps: list[Step], stage: str, prefix: str) -> float | None:
    """What ``stage`` dropped for reasons starting with ``prefix`` / what it read; None without the stage."""
    read = documents_read_by(steps, stage)
    removed = sum(s.documents for s in steps if s.stage == stage and s.reason.startswith(prefix))
    return removed / read if read else None


def shares(steps: list[Step]) -> dict[str, float | None]:
    """``kept_share``: kept / the funnel's input; ``duplicate_share``: what dedup removed as a duplicate / what
    it read; ``classifier_drop_share`` and ``contaminated_share``: the same for the classify and decontaminate
    stages. None where the funnel has no such rows."""
    first = steps[0].documents if steps and steps[0].reason == "input" else 0
    kept = steps[-1].documents if steps and steps[-1].reason == "kept" else None
    removed = sum(s.documents for s in steps if s.stage == "dedup" and s.reason.endswith("_duplicate"))
    dedup_read = documents_read_by(steps, "dedup")
    return {
        "kept_share": kept / first if first and kept is not None else None,
        "duplicate_share": removed / dedup_read if dedup_read else None,
        "classifier_drop_share": _dropped_share(steps, "classify", "classifier:"),
        "contaminated_share": _dropped_share(steps, "decontaminate", "contaminated:"),
    }


def filtering_details(manifest: Manifest) -> dict:
    """The classify and decontaminate records along the lineage: each model's cut, score histograms per
    language, drops and pass-throughs; each evaluation set's items and n-grams."""
    details: dict = {"classifiers": {}, "decontamination": {}}
    for stage in lineage(manifest):
        if stage.stage == "classify":
            details["classifiers"] = stage.extra.get("classify", {}).get("models", {})
        elif stage.stage == "decontaminate":
            record = stage.extra.get("decontaminate", {})
            details["decontamination"] = {
                "sets": record.get("sets", {}),
                "mode": record.get("mode"),
                "ngram_size": record.get("ngram_size"),
                "dropped": stage.counters.get("dropped", {}),
                "cut_documents": stage.counters.get("cut_documents"),
            }
    return details


def clean_details(manifest: Manifest) -> dict:
    """What the funnel's rows do not show, from the clean manifest along the lineage: documents kept and
    dropped per language, and the PII clean redacted in the kept documents (it drops none for PII)."""
    for stage in lineage(manifest):
        if stage.stage == "clean":
            counters = stage.counters
            kept, dropped = counters.get("kept_by_language", {}), counters.get("dropped_by_language", {})
            return {
                "languages": {
                    lang: {"kept": int(kept.get(lang, 0)), "dropped": int(dropped.get(lang, 0))}
                    for lang in sorted(set(kept) | set(dropped))
                },
                "pii_redacted": {kind: int(n) for kind, n in counters.get("pii_redacted", {}).items()},
            }
    return {"languages": {}, "pii_redacted": {}}


def as_rows(steps: list[Step]) -> list[dict]:
    return [asdict(step) for step in steps]


def plot_waterfall(steps: list[Step], path: Path) -> Path:
    """Documents left after each step, the drops as falling bars: where a snapshot lost its documents."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drops = [step for step in steps if step.reason not in ("input", "kept")]
    start = steps[0].documents if steps and steps[0].reason == "input" else sum(s.documents for s in drops)
    labels, bottoms, heights = [], [], []
    left = start
    for step in drops:
        left -= step.documents
        labels.append(f"{step.stage}: {step.reason}")
        bottoms.append(left)
        heights.append(step.documents)
    figure, axis = plt.subplots(figsize=(8, max(3.0, 0.28 * (len(drops) + 2) + 1)))
    names = ["input", *labels, "kept"]
    axis.barh(names[0], start, color="tab:blue")
    axis.barh(labels, heights, left=bottoms, color="tab:red")
    axis.barh(names[-1], left, color="tab:green")
    axis.invert_yaxis()
    axis.set(title="drop funnel (documents)", xlabel="documents")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path
