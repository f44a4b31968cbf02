"""Incremental dedup (dedup.against) on three snapshots with planted exact and near duplicates across them:
removed from the later snapshots only, the same bytes whichever order the runs happen in, and the history's
stored keys read rather than hashed again."""

from __future__ import annotations

import logging
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.core.config import ConfigError
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.dedup import job
from pipeline.dedup.history import EARLIER_DUPLICATE, HistoryGaps, history_gaps, selected_history
from tests.conftest import make_config
from tests.dedup.synthetic import (
    CLEAN_SCHEMA,
    WordSource,
    as_text,
    document,
    near_copy,
    plain_jaccard,
)

SNAPSHOTS = ("2026-11-01", "2026-11-02", "2026-11-03")
SETTINGS = ("dedup.against=all", "spark.shuffle_partitions=2", "spark.output_files=2")


def near_copy_checked(words: list[str], source: WordSource) -> list[str]:
    """A copy of ``words`` at Jaccard about 0.9 (checked >= 0.85 with the plain reference)."""
    copy = near_copy(words, 0.9, source)
    assert plain_jaccard(" ".join(copy), " ".join(words)) >= 0.85
    return copy


def build_snapshots(seed: int = 3) -> tuple[dict[str, list[dict]], dict[str, dict[str, tuple[str, str]]]]:
    """Rows per snapshot, and per snapshot {id: (earlier snapshot, earlier id)} of every planted duplicate
    of an earlier snapshot's document (the earliest, when several earlier snapshots hold one)."""
    rng = random.Random(seed)
    source = WordSource(rng, 5000)
    start = datetime(2026, 11, 1, tzinfo=UTC)
    s1, s2, s3 = SNAPSHOTS

    def doc(url: str, words: list[str], day: int) -> dict:
        # as_text draws fresh case, punctuation and line breaks: exact copies differ only in what dedup ignores.
        return document(url, as_text(words, rng), start + timedelta(days=day, hours=rng.randrange(20)))

    near = lambda words: near_copy_checked(words, source)  # noqa: E731

    fresh = lambda count: [source.draw(rng.randint(80, 160)) for _ in range(count)]  # noqa: E731
    first = fresh(20)
    rows = {s1: [doc(f"https://a.example/{i}", body, 0) for i, body in enumerate(first)]}
    earlier: dict[str, dict[str, tuple[str, str]]] = {s1: {}, s2: {}, s3: {}}

    second = fresh(12)
    rows[s2] = [doc(f"https://b.example/{i}", body, 1) for i, body in enumerate(second)]
    for i in range(3):  # exact copies of s1 documents under new URLs
        copy = doc(f"https://copies.example/exact/{i}", first[i], 1)
        rows[s2].append(copy)
        earlier[s2][copy["id"]] = (s1, rows[s1][i]["id"])
    for i in range(3, 6):  # near copies of s1 documents
        copy = doc(f"https://copies.example/near/{i}", near(first[i]), 1)
        rows[s2].append(copy)
        earlier[s2][copy["id"]] = (s1, rows[s1][i]["id"])
    same_page = doc("https://a.example/6", first[6], 1)  # the same page fetched again: the same id
    rows[s2].append(same_page)
    earlier[s2][same_page["id"]] = (s1, rows[s1][6]["id"])

    third = fresh(10)
    rows[s3] = [doc(f"https://c.example/{i}", body, 2) for i, body in enumerate(third)]
    rows[s3].append(doc("https://c.example/again", third[0], 2))  # a duplicate inside s3: not an earlier one
    for i in (7, 8):
        copy = doc(f"https://more.example/exact/{i}", first[i], 2)
        rows[s3].append(copy)
        earlier[s3][copy["id"]] = (s1, rows[s1][i]["id"])
    for i in (0, 1):  # near copies of s2's own documents
        copy = doc(f"https://more.example/near/{i}", near(second[i]), 2)
        rows[s3].append(copy)
        earlier[s3][copy["id"]] = (s2, rows[s2][i]["id"])
    chain = doc(
        "https://more.example/chain", first[0], 2
    )  # copies s2's copy of s1's document: s1 is earliest
    rows[s3].append(chain)
    earlier[s3][chain["id"]] = (s1, rows[s1][0]["id"])
    late = doc("https://more.example/late-near", near(first[9]), 2)
    rows[s3].append(late)
    earlier[s3][late["id"]] = (s1, rows[s1][9]["id"])
    for snapshot in SNAPSHOTS:
        rng.shuffle(rows[snapshot])
    return rows, earlier


def publish_clean(config, snapshot: str, rows: list[dict]) -> DatasetRef:
    ref = DatasetRef.of(config, "clean", snapshot)
    with StageOutput(ref, config) as out:
        (out.path / "documents").mkdir()
        pq.write_table(
            pa.Table.from_pylist(rows, schema=CLEAN_SCHEMA), out.path / "documents" / "part-0.parquet"
        )
        out.commit(rows={"documents": len(rows)})
    return ref


def dedup(config, snapshot: str):
    return job.run(
        config, [DatasetRef.of(config, "clean", snapshot)], DatasetRef.of(config, "dedup", snapshot)
    )


def data_files(manifest) -> dict[str, str]:
    return {path: entry.sha256 for path, entry in manifest.files.items() if path.endswith(".parquet")}


@pytest.fixture(scope="module")
def corpus():
    return build_snapshots()


@pytest.fixture(scope="module")
def forward(tmp_path_factory, corpus):
    """s1, s2, s3 in name order: every history is stored when it is needed."""
    rows, _ = corpus
    config = make_config(tmp_path_factory.mktemp("forward") / "data", *SETTINGS)
    for snapshot in SNAPSHOTS:
        publish_clean(config, snapshot, rows[snapshot])
    return config, {snapshot: dedup(config, snapshot) for snapshot in SNAPSHOTS}


@pytest.mark.slow
def test_planted_duplicates_of_earlier_snapshots_are_removed_from_the_later_ones_only(corpus, forward):
    rows, earlier = corpus
    _, manifests = forward
    for snapshot in SNAPSHOTS:
        manifest = manifests[snapshot]
        excluded = pq.read_table(Path(manifest.path) / "excluded").to_pylist()
        found = {
            row["id"]: (row["earlier_snapshot"], row["earlier_id"])
            for row in excluded
            if row["drop_reason"] == EARLIER_DUPLICATE
        }
        assert found == earlier[snapshot], snapshot
        assert manifest.counters["dropped"].get(EARLIER_DUPLICATE, 0) == len(earlier[snapshot])
        matches = pq.read_table(Path(manifest.path) / "earlier_duplicates").to_pylist()
        assert {row["id"]: (row["earlier_snapshot"], row["earlier_id"]) for row in matches} == found
        assert all(row["similarity"] >= 0.8 for row in matches)
        kept = {row["id"] for row in pq.read_table(Path(manifest.path) / "documents").to_pylist()}
        others = {row["id"] for row in excluded if row["drop_reason"] != EARLIER_DUPLICATE}
        assert kept | set(found) | others == {row["id"] for row in rows[snapshot]}
    assert manifests[SNAPSHOTS[0]].counters["history"]["snapshots"] == []
    assert manifests[SNAPSHOTS[2]].counters["dropped"]["exact_duplicate"] == 1  # inside s3, not earlier


@pytest.mark.slow
def test_the_history_is_read_from_stored_keys_not_hashed_again(corpus, forward):
    """The MinHash pass counts the documents it hashes (a Spark accumulator in the workers): with the history
    stored, only this snapshot's."""
    rows, _ = corpus
    _, manifests = forward
    s1, s2, s3 = SNAPSHOTS
    history = manifests[s3].counters["history"]
    assert (history["stored"], history["computed"]) == ([s1, s2], [])
    assert manifests[s3].counters["hashed_documents"] == len(rows[s3])
    assert manifests[s2].counters["hashed_documents"] == len(rows[s2])
    assert (
        manifests[s3].extra["keys"]["documents"] == pq.read_table(Path(manifests[s3].path) / "keys").num_rows
    )


@pytest.mark.slow
def test_the_same_result_whatever_order_the_runs_happen_in(tmp_path, corpus, forward):
    """Backwards: s3 first (no earlier dedup output yet: its history is hashed from the inputs), then s2.
    (s1 compares with nothing either way: test_only_earlier_snapshots_are_history.)"""
    rows, _ = corpus
    _, expected = forward
    config = make_config(tmp_path / "data", *SETTINGS)
    for snapshot in SNAPSHOTS:
        publish_clean(config, snapshot, rows[snapshot])
    s1, s2, s3 = SNAPSHOTS
    backwards = {snapshot: dedup(config, snapshot) for snapshot in (s3, s2)}
    for snapshot in (s2, s3):
        assert data_files(backwards[snapshot]) == data_files(expected[snapshot]), snapshot
    assert backwards[s3].counters["history"]["computed"] == [s1, s2]
    assert backwards[s3].counters["hashed_documents"] == sum(len(rows[s]) for s in SNAPSHOTS)
    # s2 found s3's output but compares only with what came before it; s1's keys are not stored yet.
    history = backwards[s2].counters["history"]
    assert (history["snapshots"], history["stored"], history["computed"]) == ([s1], [], [s1])


def test_only_earlier_snapshots_are_history(tmp_path):
    """A snapshot's history is the snapshots before it by name that have a dedup output or input, filtered
    by dedup.against; a backfill of an old snapshot never sees newer ones."""
    config = make_config(tmp_path / "data")
    for stage, snapshot in [
        ("clean", "2026-11-01"),
        ("dedup", "2026-11-02"),
        ("clean", "2026-11-03"),
        ("clean", "2026-11-05"),
    ]:
        with StageOutput(DatasetRef.of(config, stage, snapshot), config) as out:
            out.commit()
    history = lambda snapshot, against: selected_history(  # noqa: E731
        str(tmp_path / "data"), config.project.corpus, snapshot, against, "clean", "dedup"
    )
    assert history("2026-11-04", "all") == ["2026-11-01", "2026-11-02", "2026-11-03"]
    assert history("2026-11-04", "last:2") == ["2026-11-02", "2026-11-03"]
    assert history("2026-11-04", "2026-11-02..") == ["2026-11-02", "2026-11-03"]
    assert history("2026-11-04", ["2026-11-01", "2026-11-05"]) == ["2026-11-01"]
    assert history("2026-11-01", "all") == []
    assert history("2026-11-06", "2026-11-0[15]") == ["2026-11-01", "2026-11-05"]


def test_an_ablation_variant_never_takes_its_own_source_or_a_sibling_as_history(tmp_path):
    """A variant's snapshot ``2026-11-29.ab-<id>`` sorts after ``2026-11-29``: compared by name it took its
    own source (and a sibling variant) as an earlier snapshot and dropped nearly every document as a
    duplicate of itself. History is what sorts before the snapshot the variant derives from."""
    config = make_config(tmp_path / "data")
    for stage, snapshot in [
        ("clean", "2026-11-28"),
        ("clean", "2026-11-29"),
        ("dedup", "2026-11-29"),
        ("clean", "2026-11-29.ab-0123456789abcdef"),
        ("dedup", "2026-11-29.ab-0123456789abcdef"),
        ("dedup", "2026-11-28.ab-fedcba9876543210"),
    ]:
        with StageOutput(DatasetRef.of(config, stage, snapshot), config) as out:
            out.commit()
    history = lambda snapshot, against: selected_history(  # noqa: E731
        str(tmp_path / "data"), config.project.corpus, snapshot, against, "clean", "dedup"
    )
    sibling = "2026-11-29.ab-aaaaaaaaaaaaaaaa"
    assert history(sibling, "all") == ["2026-11-28"]
    assert history(sibling, "last:1") == ["2026-11-28"]
    # Named explicitly: the source and a sibling still are not earlier; an earlier snapshot's variant is.
    named = ["2026-11-29", "2026-11-29.ab-0123456789abcdef", "2026-11-28.ab-fedcba9876543210"]
    assert history(sibling, named) == ["2026-11-28.ab-fedcba9876543210"]
    assert history("2026-11-30", "all") == ["2026-11-28", "2026-11-29"]


@pytest.mark.parametrize(
    ("value", "message"),
    [("last:-1", "last:N"), ("2026-12..2026-11", "range is empty"), ("a b", "not a snapshot name")],
)
def test_a_malformed_against_fails_at_config_load(tmp_path, value, message):
    with pytest.raises(ConfigError, match=rf"dedup\.against.*{message}"):
        make_config(tmp_path, f"dedup.against={value}")


def publish(config, stage: str, snapshot: str, counters: dict | None = None) -> None:
    with StageOutput(DatasetRef.of(config, stage, snapshot), config) as out:
        out.commit(counters=counters)


def test_a_backfill_names_the_later_snapshots_that_compared_without_it(tmp_path, caplog):
    """A backfill of 2026-11-02 after 2026-11-04 and 2026-11-05 ran: it compares only with older snapshots
    (the documented semantics), so what it shares with a later one that ran without it survives in both.
    Those later ones are named, to re-run; one whose history held it already (its input existed then), one
    that ``against`` would not give it, and a variant of its own source are not."""
    config = make_config(tmp_path / "data")
    for stage, snapshot in [
        ("clean", "2026-11-01"),
        ("clean", "2026-11-02"),
        ("clean", "2026-11-02.ab-0123456789abcdef"),
        ("dedup", "2026-11-02.ab-0123456789abcdef"),
    ]:
        publish(config, stage, snapshot)
    publish(config, "dedup", "2026-11-03", {"history": {"snapshots": ["2026-11-01", "2026-11-02"]}})
    publish(config, "dedup", "2026-11-04", {"history": {"snapshots": ["2026-11-01", "2026-11-03"]}})
    publish(config, "dedup", "2026-11-05")  # deduplicated with dedup.against off
    gaps = lambda against: history_gaps(  # noqa: E731
        str(tmp_path / "data"), config.project.corpus, "2026-11-02", against, "clean", "dedup"
    )
    with caplog.at_level(logging.WARNING, logger="pipeline.dedup.history"):
        found = gaps("all")
    assert found == HistoryGaps(rerun_later=["2026-11-04", "2026-11-05"], incomplete_earlier=[])
    assert "2026-11-04" in caplog.text and "2026-11-05" in caplog.text and "Re-run dedup" in caplog.text
    assert gaps("last:2").rerun_later == ["2026-11-04"]  # 2026-11-05's last two are 11-03 and 11-04
    assert gaps("2026-11-01..2026-11-02").rerun_later == ["2026-11-04", "2026-11-05"]
    assert history_gaps(
        str(tmp_path / "data"), config.project.corpus, "2026-11-05", "all", "clean", "dedup"
    ) == HistoryGaps([], [])


def test_an_earlier_snapshot_with_an_incomplete_output_is_named_not_silently_left_out(tmp_path, caplog):
    """An earlier snapshot whose clean output has no _SUCCESS (a failed run), or is still being written (its
    staging folder), is not in the history, as before; now each is named in a warning."""
    config = make_config(tmp_path / "data")
    publish(config, "clean", "2026-11-01")
    stage_folder = tmp_path / "data" / config.project.corpus / "clean"
    (stage_folder / "2026-11-02" / "documents").mkdir(parents=True)  # a run that failed before publishing
    (stage_folder / ".staging-2026-11-03@0a1b2c3d").mkdir()  # a run still writing
    (stage_folder / ".staging-2026-11-09@0a1b2c3d").mkdir()  # later: not history
    root = str(tmp_path / "data")
    with caplog.at_level(logging.WARNING, logger="pipeline.dedup.history"):
        found = history_gaps(root, config.project.corpus, "2026-11-04", "all", "clean", "dedup")
    assert found.incomplete_earlier == ["2026-11-02", "2026-11-03"]
    assert "2026-11-02" in caplog.text and "2026-11-03" in caplog.text and "2026-11-09" not in caplog.text
    assert selected_history(root, config.project.corpus, "2026-11-04", "all", "clean", "dedup") == [
        "2026-11-01"
    ]
    assert history_gaps(root, config.project.corpus, "2026-11-04", "2026-11-01", "clean", "dedup") == (
        HistoryGaps([], [])
    )


def test_an_earlier_snapshot_named_by_hand_with_no_output_at_all_is_named_not_silently_left_out(
    tmp_path, caplog
):
    """``against: [name]`` naming a snapshot with no folder in either stage (a typo, another corpus's date) is
    left out as before, and now named in a warning and in the manifest; a later name is not history at all."""
    config = make_config(tmp_path / "data")
    publish(config, "clean", "2026-11-01")
    root = str(tmp_path / "data")
    against = ["2026-11-01", "2026-11-0l", "2026-10-31", "2026-11-09"]
    with caplog.at_level(logging.WARNING, logger="pipeline.dedup.history"):
        found = history_gaps(root, config.project.corpus, "2026-11-04", against, "clean", "dedup")
    assert found == HistoryGaps([], [], ["2026-10-31"])  # "2026-11-0l" sorts after "2026-11-04"
    assert "2026-10-31" in caplog.text and "misspelt" in caplog.text and "2026-11-09" not in caplog.text
    assert selected_history(root, config.project.corpus, "2026-11-04", against, "clean", "dedup") == [
        "2026-11-01"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pipeline.dedup.history"):
        assert history_gaps(
            root, config.project.corpus, "2026-11-04", "all", "clean", "dedup"
        ) == HistoryGaps([], [])
    assert not caplog.text


@pytest.mark.slow
def test_a_backfill_records_the_later_snapshots_to_rerun_in_its_manifest(tmp_path, corpus, caplog):
    """s2 deduplicated before s1's input existed, then s1 backfilled: s1's manifest names s2 to re-run."""
    rows, _ = corpus
    config = make_config(tmp_path / "data", *SETTINGS)
    s1, s2, _ = SNAPSHOTS
    publish_clean(config, s2, rows[s2])
    assert dedup(config, s2).extra["history"] == {
        "rerun_later": [],
        "incomplete_earlier": [],
        "missing_named": [],
    }
    publish_clean(config, s1, rows[s1])
    with caplog.at_level(logging.WARNING, logger="pipeline.dedup.history"):
        manifest = dedup(config, s1)
    assert manifest.extra["history"] == {"rerun_later": [s2], "incomplete_earlier": [], "missing_named": []}
    assert f"Re-run dedup for ['{s2}']" in caplog.text
