"""The classify and decontaminate stages in the funnel, the gate (max_classifier_drop_share,
max_contaminated_share) and the report's section on them."""

from __future__ import annotations

from pipeline.config import load_config
from pipeline.quality.funnel import filtering_details, funnel, shares
from pipeline.quality.gate import evaluate
from pipeline.quality.page import write_page
from tests.quality.test_funnel import assert_books_balance, write

CLASSIFY_RECORD = {
    "kind": "fasttext",
    "source": "trained:wiki",
    "sha256": "ab" * 32,
    "label": "__label__hq",
    "cut": {
        "mode": "top_fraction",
        "keep": "high",
        "threshold": 0.61,
        "top_fraction": 0.5,
        "target": 45,
        "scored": 90,
        "language_thresholds": {},
    },
    "dropped": 45,
    "bins": 4,
    "histogram": {"en": [30, 15, 20, 25]},
    "passed_through": {"zh": 10},
}


def chain(tmp_path):
    dedup = write(
        tmp_path / "dedup",
        "dedup",
        {"input_documents": 120, "kept": 100, "dropped": {"exact_duplicate": 20}},
        {},
    )
    classify = write(
        tmp_path / "classify",
        "classify",
        {"input_documents": 100, "kept": 55, "dropped": {"classifier:wiki": 45}},
        {},
        [dedup],
    )
    classify.extra = {"classify": {"models": {"wiki": CLASSIFY_RECORD}}}
    (tmp_path / "classify" / "manifest.json").write_text(classify.to_json())
    decontaminated = write(
        tmp_path / "decontaminate",
        "decontaminate",
        {"input_documents": 55, "kept": 50, "dropped": {"contaminated:heldout": 5}},
        {},
        [classify],
    )
    decontaminated.extra = {
        "decontaminate": {
            "sets": {"heldout": {"kind": "heldout", "items": 3, "ngrams": 40}},
            "mode": "drop",
            "ngram_size": 13,
        }
    }
    (tmp_path / "decontaminate" / "manifest.json").write_text(decontaminated.to_json())
    return decontaminated


def test_the_funnel_counts_classifier_and_contamination_drops(tmp_path):
    steps = funnel(chain(tmp_path))
    assert_books_balance(steps)
    assert [(s.stage, s.reason, s.documents) for s in steps[2:]] == [
        ("classify", "classifier:wiki", 45),
        ("decontaminate", "contaminated:heldout", 5),
        ("decontaminate", "kept", 50),
    ]
    assert shares(steps)["classifier_drop_share"] == 0.45
    assert shares(steps)["contaminated_share"] == 5 / 55


def test_the_gate_bounds_both_shares(tmp_path):
    metrics = {"documents": 50, **shares(funnel(chain(tmp_path)))}
    gate = load_config(
        overrides=[
            "quality.gate.mode=fail",
            "quality.gate.max_classifier_drop_share=0.4",
            "quality.gate.max_contaminated_share=0.05",
        ],
        environ={},
    ).quality.gate
    assert evaluate(gate, metrics)["failures"] == [
        "classifier_drop_share 0.4500 > quality.gate.max_classifier_drop_share 0.4",
        "contaminated_share 0.0909 > quality.gate.max_contaminated_share 0.05",
    ]
    relaxed = load_config(
        overrides=["quality.gate.max_classifier_drop_share=0.5", "quality.gate.max_contaminated_share=0.1"],
        environ={},
    ).quality.gate
    assert evaluate(relaxed, metrics)["passed"]


def test_without_the_stages_the_shares_are_not_judged(tmp_path):
    dedup = write(tmp_path / "dedup", "dedup", {"input_documents": 10, "kept": 10, "dropped": {}}, {})
    assert shares(funnel(dedup))["classifier_drop_share"] is None


def test_the_report_shows_each_model_and_set(tmp_path):
    from pipeline.documents.plots import plot_scores

    details = filtering_details(chain(tmp_path))
    assert details["classifiers"]["wiki"]["cut"]["target"] == 45
    assert details["decontamination"]["dropped"] == {"contaminated:heldout": 5}
    image = plot_scores("wiki", details["classifiers"]["wiki"], tmp_path / "scores_wiki.png")
    page = tmp_path / "report.html"
    write_page(
        page,
        "s",
        {"classifiers": details["classifiers"], "decontamination": details["decontamination"]},
        [],
        {"scores_wiki": image},
        [],
        None,
    )
    text = page.read_text()
    assert (
        "Classifiers and decontamination" in text
        and "trained:wiki" in text
        and "top 0.5 (kept 45 of 90" in text
    )
    assert "heldout" in text and 'alt="scores_wiki"' in text
