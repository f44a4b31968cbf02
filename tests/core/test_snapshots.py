"""The snapshot-selection grammar shared by data.mixture and dedup.against."""

from __future__ import annotations

import fnmatch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.snapshots import (
    SnapshotSelection,
    base_snapshot,
    complete_snapshots,
    is_variant,
    snapshot_folders,
    variant_snapshot,
)
from pipeline.core.storage import DatasetRef, StageOutput
from tests.conftest import make_config

NAMES = ["2026-10-31", "2026-11-01", "2026-11-02", "2026-11-10", "2026-12-01", "demo"]


@pytest.mark.parametrize(
    ("spec", "chosen"),
    [
        ("all", NAMES),
        ("last:2", ["2026-12-01", "demo"]),
        ("2026-11-01..2026-11-10", ["2026-11-01", "2026-11-02", "2026-11-10"]),
        ("..2026-11-01", ["2026-10-31", "2026-11-01"]),
        ("2026-11-02..", ["2026-11-02", "2026-11-10", "2026-12-01", "demo"]),
        ("2026-11-*", ["2026-11-01", "2026-11-02", "2026-11-10"]),
        ("2026-1?-01", ["2026-11-01", "2026-12-01"]),
        ("demo", ["demo"]),
        (["demo", "2026-11-02"], ["2026-11-02", "demo"]),
        (["nope"], []),
    ],
)
def test_each_form_selects_in_name_order(spec, chosen):
    assert SnapshotSelection.parse(spec).select(NAMES) == chosen


def test_missing_names_only_explicit_ones():
    assert SnapshotSelection.parse(["demo", "gone"]).missing(NAMES) == ["gone"]
    assert SnapshotSelection.parse("2099-*").missing(NAMES) == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("last:0", "last:N needs a whole number"),
        ("last:x", "last:N needs a whole number"),
        ("2026-12-01..2026-11-01", "the range is empty"),
        ("a b", "not a snapshot name"),
        ([], "empty list"),
        (["ok", "../etc"], "not a snapshot name"),
    ],
)
def test_malformed_selections_say_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message):
        SnapshotSelection.parse(spec)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.from_regex(r"[a-z0-9][a-z0-9._-]{0,6}", fullmatch=True), max_size=12, unique=True),
    st.from_regex(r"[a-z0-9]{0,3}", fullmatch=True),
    st.from_regex(r"[a-z0-9]{0,3}", fullmatch=True),
)
def test_a_range_is_the_names_between_its_bounds(names, first, last):
    names = [name for name in names if ".." not in name]
    if first and last and first > last:
        first, last = last, first
    spec = f"{first}..{last}"
    if spec == "..":
        spec = "all"
    plain = [n for n in names if not is_variant(n)]  # a pattern never picks an ablation variant
    expected = sorted(n for n in plain if (not first or n >= first) and (not last or n <= last))
    assert SnapshotSelection.parse(spec).select(names) == expected
    assert SnapshotSelection.parse(f"{first}*").select(names) == sorted(
        n for n in plain if fnmatch.fnmatchcase(n, f"{first}*")
    )


def test_listing_leaves_out_staging_locks_and_incomplete_outputs(tmp_path):
    config = make_config(tmp_path)
    for snapshot in ("b", "a"):
        with StageOutput(DatasetRef.of(config, "clean", snapshot), config) as out:
            out.commit()
    folder = tmp_path / config.project.corpus / "clean"
    (folder / "c").mkdir()  # a folder without _SUCCESS
    (folder / ".staging-d@1234").mkdir()
    assert snapshot_folders(str(tmp_path), config.project.corpus, "clean") == ["a", "b", "c"]
    assert complete_snapshots(str(tmp_path), config.project.corpus, "clean") == ["a", "b"]
    assert complete_snapshots(str(tmp_path), "nothing", "clean") == []


def test_a_variant_names_the_snapshot_it_derives_from_and_only_its_name_selects_it():
    name = variant_snapshot("2026-11-29", "0123abcd")
    assert is_variant(name) and not is_variant("2026-11-29")
    assert base_snapshot(name) == base_snapshot("2026-11-29") == "2026-11-29"
    available = ["2026-11-28", "2026-11-29", name, "2026-11-30"]
    for pattern in ("all", "last:3", "2026-11-29..2026-11-30", "2026-11-*"):
        assert name not in SnapshotSelection.parse(pattern).select(available), pattern
    assert SnapshotSelection.parse("last:2").select(available) == ["2026-11-29", "2026-11-30"]
    assert SnapshotSelection.parse([name, "2026-11-28"]).select(available) == ["2026-11-28", name]
    assert SnapshotSelection.parse([name]).missing(available) == []
