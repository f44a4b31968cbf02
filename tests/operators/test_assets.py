"""Announcing a snapshot's token shards: the event that schedules `pretrain`, held back by a failed gate."""

from collections import defaultdict
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowSkipException

from operators.assets import TOKEN_SHARDS, announce_token_shards
from pipeline.core.manifest import MANIFEST_NAME, Manifest

PARAMS = {"config_path": None, "overrides": ["train.steps=3"]}


def published(folder, stage, extra=None):
    folder.mkdir(parents=True)
    manifest = Manifest(stage, "c", "s", str(folder), "h", "v", extra=extra or {})
    (folder / MANIFEST_NAME).write_text(manifest.to_json())
    return str(folder)


def events():
    return defaultdict(SimpleNamespace)


@pytest.mark.parametrize(
    "gate",
    [
        {"mode": "warn", "passed": False, "failures": ["kept documents 0 < quality.gate.min_documents 1"]},
        {"mode": "fail", "passed": True, "failures": []},
        None,  # a report from before the gate existed
    ],
)
def test_a_passed_or_warning_gate_announces_the_shards(tmp_path, gate):
    tokens = published(tmp_path / "tokenize", "tokenize")
    report = published(tmp_path / "quality", "quality", {"gate": gate} if gate else {})
    outlet = events()
    announce_token_shards(outlet, path=tokens, snapshot="s", params=PARAMS, report_paths=[report])
    assert outlet[TOKEN_SHARDS].extra["snapshot"] == "s" and outlet[TOKEN_SHARDS].extra["path"] == tokens


def test_a_failed_gate_in_mode_fail_announces_nothing_and_says_why(tmp_path):
    tokens = published(tmp_path / "tokenize", "tokenize")
    failures = ["duplicate share 0.6000 > quality.gate.max_duplicate_share 0.3"]
    report = published(
        tmp_path / "quality", "quality", {"gate": {"mode": "fail", "passed": False, "failures": failures}}
    )
    outlet = events()
    with pytest.raises(AirflowSkipException, match=r"quality gate failed.*duplicate share 0\.6000"):
        announce_token_shards(outlet, path=tokens, snapshot="s", params=PARAMS, report_paths=[report])
    assert TOKEN_SHARDS not in outlet
