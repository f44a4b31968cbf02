"""Which snapshots' held-out material the default ``heldout`` set reads: only those before the one
decontaminated, so the set does not depend on what else ran, or finished, first (a re-run backfill
writes the same bytes)."""

import random

from pipeline.core.snapshots import variant_snapshot
from pipeline.decontaminate.sources import heldout_snapshots
from tests.conftest import make_config


def test_the_default_reads_earlier_snapshots_only_and_never_a_variant(tmp_path):
    config = make_config(tmp_path)
    dates = [f"2026-03-{day:02d}" for day in range(1, 8)]
    folder = tmp_path / config.project.corpus / "tokenize"
    for name in [*random.Random(5).sample(dates, len(dates)), variant_snapshot(dates[1], "0123abcd")]:
        (folder / name).mkdir(parents=True)
    (folder / ".staging-2026-03-08@99").mkdir()
    for index, current in enumerate(dates):
        assert heldout_snapshots(config, "tokenize", current, None) == dates[:index]
    # A variant of a snapshot reads what that snapshot reads: every variant of it sees the same set.
    assert heldout_snapshots(config, "tokenize", variant_snapshot(dates[3], "ffff0000"), None) == dates[:3]


def test_chosen_snapshots_are_read_as_named_except_the_current_one(tmp_path):
    config = make_config(tmp_path)
    chosen = ["2026-03-05", "2026-03-01"]
    assert heldout_snapshots(config, "tokenize", "2026-03-03", chosen) == chosen
    assert heldout_snapshots(config, "tokenize", "2026-03-05", chosen) == ["2026-03-01"]
