"""docs/scaling-out.md names real config keys: every `section.key` it mentions is in the config tree."""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.config import load_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "scaling-out.md"


def flatten(tree: dict, prefix: str = "") -> set[str]:
    keys = set()
    for name, value in tree.items():
        keys.add(prefix + name)
        if isinstance(value, dict):
            keys |= flatten(value, f"{prefix}{name}.")
    return keys


def test_every_config_key_in_the_doc_exists():
    tree = load_config(None, []).model_dump()
    known = flatten(tree)
    sections = set(tree)
    text = DOC.read_text()
    mentioned = {
        match.split("=")[0]
        for match in re.findall(r"`([a-z_]+\.[a-z_.]+)(?:[=` ])", text)
        if match.split(".")[0] in sections
    }
    assert len(mentioned) >= 20, sorted(mentioned)
    missing = mentioned - known
    assert not missing, f"docs/scaling-out.md names keys the config does not have: {sorted(missing)}"


def test_every_embedded_default_has_a_row():
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| **")]
    concerns = {re.match(r"\| \*\*([^*]+)\*\*", row)[1].split(" (")[0] for row in rows}
    assert concerns >= {
        "Orchestration",
        "Data jobs",
        "Training",
        "Experiment tracking",
        "Logs",
        "Metrics",
        "Storage",
    }
    for row in rows:
        assert row.count(" | ") == 3, f"a row needs 4 cells: {row[:60]}"
