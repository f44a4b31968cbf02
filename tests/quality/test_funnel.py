"""The drop funnel follows the report's lineage back to the crawl, and every step keeps the books."""

import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.manifest import MANIFEST_NAME, Manifest
from pipeline.core.storage import DatasetRef
from pipeline.quality.funnel import Step, funnel, plot_waterfall


def write(folder, stage, counters, rows, inputs=()):
    manifest = Manifest(
        stage=stage,
        corpus="c",
        snapshot="s",
        path=str(folder),
        config_hash="h",
        code_version="v",
        rows=rows,
        counters=counters,
        inputs=[{"stage": i.stage, "snapshot": "s", "path": i.path, "digest": "d"} for i in inputs],
    )
    folder.mkdir(parents=True)
    (folder / MANIFEST_NAME).write_text(manifest.to_json())
    return Manifest.read(folder / MANIFEST_NAME)


def assert_books_balance(steps: list[Step]):
    assert steps[0].reason == "input" and steps[-1].reason == "kept"
    dropped = sum(step.documents for step in steps[1:-1])
    assert steps[0].documents == dropped + steps[-1].documents


@given(
    st.dictionaries(st.sampled_from(["dns_error", "http_404", "robots_disallowed"]), st.integers(0, 50)),
    st.integers(0, 40),
    st.integers(0, 5),
    st.dictionaries(
        st.sampled_from(["language.not_kept", "c4.min_num_sentences", "fineweb.empty"]), st.integers(0, 20)
    ),
    st.dictionaries(
        st.sampled_from(["exact_duplicate", "near_duplicate", "url_duplicate"]), st.integers(0, 10)
    ),
)
def test_every_documents_in_equals_kept_plus_dropped(
    tmp_path_factory, crawl_failed, fetched, not_200, cleaned, dups
):
    root = tmp_path_factory.mktemp("funnel")
    requests = fetched + sum(crawl_failed.values())
    crawl = write(
        root / "crawl", "crawl", {"requests": requests, "fetched": fetched, "by_reason": crawl_failed}, {}
    )
    clean_in = fetched - min(not_200, fetched)
    clean_kept = max(0, clean_in - sum(cleaned.values()))
    cleaned = {rule: n for rule, n in cleaned.items()} if clean_kept else {}
    clean_in = clean_kept + sum(cleaned.values())
    clean = write(
        root / "clean",
        "clean",
        {"input_pages": clean_in, "kept": clean_kept, "dropped": cleaned},
        {},
        [crawl],
    )
    left, removed_by_reason = clean_kept, {}
    for reason, n in sorted(dups.items()):  # no more duplicates than documents
        removed_by_reason[reason] = min(n, left)
        left -= removed_by_reason[reason]
    dups, removed = removed_by_reason, clean_kept - left
    dedup = write(
        root / "dedup",
        "dedup",
        {"input_documents": clean_kept, "kept": clean_kept - removed, "dropped": dups},
        {"documents": clean_kept - removed},
        [clean],
    )
    steps = funnel(dedup)
    assert_books_balance(steps)
    assert steps[0] == Step("crawl", "input", requests)
    assert steps[-1] == Step("dedup", "kept", clean_kept - removed)
    assert [s.reason for s in steps if s.stage == "clean" and s.reason != "not_taken_in"] == sorted(
        cleaned, key=lambda r: ["language", "c4", "fineweb"].index(r.split(".")[0])
    )


def test_an_input_that_is_gone_ends_the_lineage_there(tmp_path):
    clean = write(
        tmp_path / "clean", "clean", {"input_pages": 5, "kept": 3, "dropped": {"fineweb.empty": 2}}, {}
    )
    gone = Manifest(**{**clean.__dict__, "path": str(tmp_path / "removed")})
    dedup = write(tmp_path / "dedup", "dedup", {"input_documents": 3, "kept": 3, "dropped": {}}, {}, [gone])
    assert funnel(dedup) == [Step("dedup", "input", 3), Step("dedup", "kept", 3)]


@pytest.mark.slow
def test_the_sample_corpus_funnel_balances_and_plots(sample_corpus, tmp_path):
    config, snapshot = sample_corpus
    clean = DatasetRef.of(config, "clean", snapshot)
    steps = funnel(clean.manifest())
    assert_books_balance(steps)
    documents = pq.read_table(clean.path / "documents").column("text").to_pylist()
    assert steps[-1] == Step("clean", "kept", len(documents), sum(map(len, documents)))
    assert all(step.characters is not None for step in steps if step.stage == "clean")
    assert any(step.stage == "crawl" and step.reason == "robots_disallowed" for step in steps)
    assert plot_waterfall(steps, tmp_path / "funnel.png").stat().st_size > 1000


@given(
    st.dictionaries(st.sampled_from(["language.not_kept", "c4.min_num_sentences"]), st.integers(1, 9)),
    st.lists(st.integers(1, 5000), min_size=1, max_size=20),
)
def test_characters_ride_along_where_the_manifests_count_them(tmp_path_factory, cleaned, kept_lengths):
    root = tmp_path_factory.mktemp("chars")
    dropped_chars = {rule: 7 * n for rule, n in cleaned.items()}
    kept_chars = sum(kept_lengths)
    clean_counters = {
        "input_pages": len(kept_lengths) + sum(cleaned.values()),
        "kept": len(kept_lengths),
        "dropped": cleaned,
        "input_chars": kept_chars + sum(dropped_chars.values()),
        "kept_chars": kept_chars,
        "dropped_chars": dropped_chars,
    }
    clean = write(root / "clean", "clean", clean_counters, {})
    steps = funnel(clean)
    assert_books_balance(steps)
    assert steps[0].characters == sum(s.characters for s in steps[1:])
    assert {s.reason: s.characters for s in steps[1:-1]} == dropped_chars
    assert steps[-1] == Step("clean", "kept", len(kept_lengths), kept_chars)


def test_dedup_reasons_come_in_the_order_dedup_decides_them(tmp_path):
    dropped = {
        "url_duplicate": 1,
        "semantic_duplicate": 2,
        "null_text": 3,
        "exact_duplicate": 4,
        "near_duplicate": 5,
    }
    dedup = write(tmp_path / "dedup", "dedup", {"input_documents": 20, "kept": 5, "dropped": dropped}, {})
    assert [step.reason for step in funnel(dedup)] == [
        "input",
        "null_text",
        "url_duplicate",
        "exact_duplicate",
        "near_duplicate",
        "semantic_duplicate",
        "kept",
    ]
