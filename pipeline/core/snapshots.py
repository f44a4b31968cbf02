"""Which snapshots of a corpus a setting names: one small grammar, read by the mixture spec (``data.mixture``)
and incremental dedup (``dedup.against``).

A selection is a list of names or one string:

    all                   every snapshot
    last:N                the N last snapshots, by name order
    FROM..TO              names from FROM to TO inclusive, by name order; either side may be left out
                          (ISO dates sort by name, so 2026-11-01..2026-11-30 is a date range)
    2026-11-*             a glob (fnmatch: *, ?, [...])
    2026-11-29            one name

Name order is plain string order, the same in Python and Spark. Which names exist (and are complete) is the
caller's business: ``select`` picks among the names it is given, and ``missing`` says which explicitly named
ones are not among them.

An ablation variant's outputs are snapshots too, named ``<snapshot>.ab-<identity>`` (``variant_snapshot``).
Only a selection that names one picks it: patterns (``all``, ``last:N``, ranges, globs) leave variants out,
so no mixture, dedup history or held-out set takes one up by accident.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from pipeline.core.storage import SNAPSHOT_PATTERN, DatasetRef, local_path

Kind = Literal["all", "last", "range", "glob", "names"]
RANGE_SEPARATOR = ".."
GLOB_CHARACTERS = "*?["
VARIANT_MARK = ".ab-"


def variant_snapshot(snapshot: str, identity: str) -> str:
    """Where an ablation variant of ``snapshot`` writes (pipeline.ablate.plan): never the snapshot itself."""
    return f"{snapshot}{VARIANT_MARK}{identity}"


def base_snapshot(name: str) -> str:
    """The snapshot a variant's name derives from; a plain snapshot's own name."""
    return name.partition(VARIANT_MARK)[0]


def is_variant(name: str) -> bool:
    return VARIANT_MARK in name


@dataclass(frozen=True)
class SnapshotSelection:
    kind: Kind
    names: tuple[str, ...] = ()  # "names": the names; "glob": the pattern
    first: str | None = None  # "range": inclusive bounds, None for open
    last: str | None = None
    count: int = 0  # "last": how many

    @classmethod
    def parse(cls, spec: str | Sequence[str]) -> SnapshotSelection:
        """The selection ``spec`` describes; ValueError with the grammar when it describes none."""
        if not isinstance(spec, str):
            names = tuple(spec)
            if not names:
                raise ValueError("an empty list of snapshots selects nothing")
            for name in names:
                _check_name(name, spec)
            return cls("names", names=names)
        text = spec.strip()
        if text == "all":
            return cls("all")
        if text.startswith("last:"):
            count = text[len("last:") :]
            if not count.isdigit() or int(count) < 1:
                raise ValueError(f"snapshots {spec!r}: last:N needs a whole number N >= 1")
            return cls("last", count=int(count))
        if RANGE_SEPARATOR in text:
            start, _, end = text.partition(RANGE_SEPARATOR)
            for bound in (start, end):
                if bound:
                    _check_name(bound, spec)
            if start and end and start > end:
                raise ValueError(f"snapshots {spec!r}: the range is empty ({start!r} sorts after {end!r})")
            return cls("range", first=start or None, last=end or None)
        if any(character in text for character in GLOB_CHARACTERS):
            return cls("glob", names=(text,))
        _check_name(text, spec)
        return cls("names", names=(text,))

    def select(self, available: Sequence[str]) -> list[str]:
        """The names among ``available`` this selection picks, in name order (a pattern picks no variant)."""
        if self.kind == "names":
            return [name for name in sorted(set(available)) if name in self.names]
        ordered = sorted(name for name in set(available) if not is_variant(name))
        if self.kind == "all":
            return ordered
        if self.kind == "last":
            return ordered[-self.count :]
        if self.kind == "range":
            return [
                name
                for name in ordered
                if (self.first is None or name >= self.first) and (self.last is None or name <= self.last)
            ]
        return [name for name in ordered if fnmatch.fnmatchcase(name, self.names[0])]  # a glob

    def missing(self, available: Collection[str]) -> list[str]:
        """Names given explicitly that are not among ``available`` (patterns miss nothing by name)."""
        present = set(available)
        return [name for name in self.names if name not in present] if self.kind == "names" else []

    @property
    def explicit(self) -> bool:
        return self.kind == "names"

    def describe(self) -> str:
        if self.kind == "all":
            return "all"
        if self.kind == "last":
            return f"last:{self.count}"
        if self.kind == "range":
            return f"{self.first or ''}{RANGE_SEPARATOR}{self.last or ''}"
        return ",".join(self.names)


def _check_name(name: object, spec: object) -> None:
    if not isinstance(name, str) or not SNAPSHOT_PATTERN.fullmatch(name):
        raise ValueError(
            f"snapshots {spec!r}: {name!r} is not a snapshot name ({SNAPSHOT_PATTERN.pattern}); a selection "
            f"is a list of names, 'all', 'last:N', 'FROM..TO' or a glob such as '2026-11-*'"
        )


def snapshot_folders(root: str, corpus: str, stage: str) -> list[str]:
    """Names of the snapshot folders under ``<root>/<corpus>/<stage>/``, complete or not, in name order
    (staging folders, locks and anything not named like a snapshot are left out)."""
    folder = local_path(root) / corpus / stage
    if not folder.is_dir():
        return []
    return sorted(
        entry.name for entry in folder.iterdir() if entry.is_dir() and SNAPSHOT_PATTERN.fullmatch(entry.name)
    )


def complete_snapshots(root: str, corpus: str, stage: str) -> list[str]:
    """The snapshots of ``stage`` whose output is complete (``_SUCCESS`` and manifest), in name order."""
    return [
        name
        for name in snapshot_folders(root, corpus, stage)
        if DatasetRef(root, corpus, stage, name).is_complete()
    ]


def as_selection(value: object) -> object:
    """A selection as config files write it, back to names: YAML reads ``2026-11-29`` as a date and
    ``20261129`` as a number, and both are snapshot names here."""
    import datetime

    if isinstance(value, list | tuple):
        return [as_selection(item) for item in value]
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value
