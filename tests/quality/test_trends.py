"""Snapshot over snapshot: the earlier reports a report compares with, and the changes it shows."""

import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.config import load_config
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.quality.trends import TRACKED, deltas, earlier_reports, plot_trends


def publish_report(config, snapshot, metrics):
    ref = DatasetRef.of(config, "quality", snapshot)
    with StageOutput(ref, config, []) as out:
        (out.path / "metrics.json").write_text(json.dumps(metrics))
        out.commit(rows={"documents": metrics.get("documents", 0)})
    return ref


@pytest.fixture
def config(tmp_path):
    return load_config(overrides=[f"project.data_root={tmp_path}"], environ={})


def test_earlier_reports_are_the_complete_ones_before_this_snapshot_in_name_order(config, tmp_path):
    names = ["2026-11-03", "2026-11-01", "2026-11-05", "2026-11-02", "2026-11-04"]
    random.Random(3).shuffle(names)  # the order they ran in does not matter
    for name in names:
        publish_report(config, name, {"documents": int(name[-2:])})
    unfinished = DatasetRef.of(config, "quality", "2026-11-00").path
    unfinished.mkdir()  # no manifest: a report that never finished
    (unfinished / "metrics.json").write_text("{}")
    current = DatasetRef.of(config, "quality", "2026-11-04")

    assert earlier_reports(current, 10) == [
        ("2026-11-01", {"documents": 1}),
        ("2026-11-02", {"documents": 2}),
        ("2026-11-03", {"documents": 3}),
    ]
    assert [s for s, _ in earlier_reports(current, 2)] == ["2026-11-02", "2026-11-03"]
    assert earlier_reports(current, 0) == []
    assert earlier_reports(DatasetRef.of(config, "quality", "2026-10-01"), 10) == []


def test_a_report_with_unreadable_metrics_is_skipped_not_fatal(config, caplog):
    bad = publish_report(config, "2026-11-01", {})
    (bad.path / "metrics.json").write_text("{not json")
    publish_report(config, "2026-11-02", {"documents": 2})
    assert earlier_reports(DatasetRef.of(config, "quality", "2026-11-03"), 5) == [
        ("2026-11-02", {"documents": 2})
    ]
    assert "2026-11-01" in caplog.text


numbers = st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False), st.integers(-1000, 1000))


@given(
    st.dictionaries(st.sampled_from(list(TRACKED)), numbers),
    st.dictionaries(st.sampled_from(list(TRACKED)), numbers),
)
def test_deltas_match_a_reference_and_say_which_way_is_better(current, previous):
    rows = {row["metric"]: row for row in deltas(current, previous)}
    for key, better in TRACKED.items():
        value, before = current.get(key), previous.get(key)
        if value is None and before is None:
            assert key not in rows
            continue
        row = rows[key]
        if value is None or before is None:
            assert row["delta"] is None and row["better"] is None
        else:
            assert row["delta"] == pytest.approx(value - before)
            if value != before:
                assert row["better"] == ((value > before) == (better == "higher"))


def test_self_bleu_going_up_is_worse_and_vendi_going_up_is_better():
    rows = {
        r["metric"]: r
        for r in deltas({"self_bleu": 30.0, "vendi_score": 9.0}, {"self_bleu": 20.0, "vendi_score": 5.0})
    }
    assert rows["self_bleu"]["better"] is False and rows["vendi_score"]["better"] is True
    assert all(r["previous"] is None for r in deltas({"documents": 3}, None))


def test_trend_plot_needs_two_snapshots(tmp_path):
    history = [("2026-11-01", {"documents": 3, "self_bleu": 10.0}), ("2026-11-02", {"documents": 5})]
    assert plot_trends(history[:1], tmp_path / "one.png") is None
    path = plot_trends(history, tmp_path / "two.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
