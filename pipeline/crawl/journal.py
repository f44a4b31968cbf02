"""The crash-safe record of a shard's crawl: what was queued, what was stored, and where.

One JSON line per event in ``<job>/journal.jsonl``, appended by the single crawler process:

- ``{"e": "attempt", ...}``  a crawler process started;
- ``{"e": "enq", "k": key, "u": url, "d": depth, "kind": "page"|"sitemap"}``  a URL entered the frontier;
- ``{"e": "done", "k": key, "kind": ..., "row": {...}, "end": [warc_file, offset] | null, "links": {...}}``
  a frontier URL reached its outcome: its WARC records (if any) are written and flushed before this line.

Scrapy's own JOBDIR (pickled disk queues, a buffered ``requests.seen``, queue state written only at a
clean close) does not survive SIGKILL: requests it had marked seen but not yet fetched would be lost.
This journal does: a torn last line is cut off, WARC bytes past the last journaled record are truncated,
and the frontier is rebuilt as "queued minus done". Nothing stored is fetched again, and nothing
half-written stays.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
JOURNAL_NAME = "journal.jsonl"


class CorruptJournalError(RuntimeError):
    """A line before the last is not valid JSON: not a torn write, so refuse to guess."""


@dataclass(frozen=True)
class Entry:
    key: str  # canonical URL: the de-duplication key
    url: str  # as found, without fragment: what is fetched
    depth: int
    kind: str = "page"

    def to_event(self) -> dict[str, Any]:
        return {"e": "enq", "k": self.key, "u": self.url, "d": self.depth, "kind": self.kind}


@dataclass
class JournalState:
    """Everything a journal says, as of its last complete line."""

    entries: dict[str, Entry] = field(default_factory=dict)
    done: dict[str, dict[str, Any]] = field(default_factory=dict)
    attempts: int = 0
    warc_ends: dict[str, int] = field(default_factory=dict)

    def pending(self) -> list[Entry]:
        """Queued but without an outcome: what a resumed crawl requests again, in queue order."""
        return [entry for key, entry in self.entries.items() if key not in self.done]

    def rows(self, kind: str = "page") -> list[dict[str, Any]]:
        return [event["row"] for event in self.done.values() if event["kind"] == kind]

    def apply(self, event: dict[str, Any]) -> None:
        kind = event["e"]
        if kind == "enq":
            self.entries.setdefault(event["k"], Entry(event["k"], event["u"], event["d"], event["kind"]))
        elif kind == "done":
            self.done[event["k"]] = event
            if event.get("end"):
                warc_file, end = event["end"]
                self.warc_ends[warc_file] = max(end, self.warc_ends.get(warc_file, 0))
        elif kind == "attempt":
            self.attempts = max(self.attempts, event["n"])


def read_journal(job_dir: Path, repair: bool = False) -> JournalState:
    """Replay the journal; with repair, cut a torn last line off the file (the writer must be dead)."""
    path = Path(job_dir) / JOURNAL_NAME
    state = JournalState()
    if not path.exists():
        return state
    data = path.read_bytes()
    complete = data.rfind(b"\n") + 1
    lines = data[:complete].splitlines()
    for number, line in enumerate(lines, 1):
        try:
            event = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):  # a torn write that happened to end in a newline byte
                complete -= len(line) + 1
                break
            raise CorruptJournalError(f"{path}:{number} is not a JSON line: {exc}") from None
        state.apply(event)
    if complete < len(data):
        log.warning("journal %s: dropping a torn last line (%d bytes)", path, len(data) - complete)
        if repair:
            with open(path, "r+b") as handle:
                handle.truncate(complete)
    return state


def truncate_warc_tails(output: Path, state: JournalState) -> dict[str, int]:
    """Cut each WARC file back to its last journaled record; remove files with none. Returns bytes cut."""
    cut: dict[str, int] = {}
    for path in sorted((Path(output) / "warc").glob("*.warc.gz")):
        relative = path.relative_to(output).as_posix()
        keep = state.warc_ends.get(relative, 0)
        size = path.stat().st_size
        if keep > size:
            raise CorruptJournalError(f"{relative}: journal says {keep} bytes were written, file has {size}")
        if keep == size:
            continue
        cut[relative] = size - keep
        if keep == 0:
            path.unlink()
        else:
            with open(path, "r+b") as handle:
                handle.truncate(keep)
        log.warning("%s: removed %d bytes written after the last journaled record", relative, size - keep)
    return cut


def recover(job_dir: Path, output: Path) -> JournalState:
    """Bring a killed shard back to its last consistent point (call with the shard lock held)."""
    state = read_journal(job_dir, repair=True)
    truncate_warc_tails(output, state)
    return state


class Journal:
    """Appends events; `done` flushes, so an outcome line is never visible before its WARC bytes."""

    def __init__(self, job_dir: Path) -> None:
        Path(job_dir).mkdir(parents=True, exist_ok=True)
        self.path = Path(job_dir) / JOURNAL_NAME
        self.handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def _write(self, event: dict[str, Any]) -> None:
        self.handle.write(json.dumps(event, separators=(",", ":"), default=str) + "\n")

    def attempt(self, number: int, **info: Any) -> None:
        self._write({"e": "attempt", "n": number, **info})
        self.flush()

    def enqueue(self, entry: Entry) -> None:
        # Not flushed on its own: the discovering page's `done` line, written after, flushes it first.
        self._write(entry.to_event())

    def done(
        self,
        key: str,
        kind: str,
        row: dict[str, Any],
        end: tuple[str, int] | None = None,
        links: dict[str, int] | None = None,
    ) -> None:
        self._write({"e": "done", "k": key, "kind": kind, "row": row, "end": end, "links": links})
        self.flush()

    def flush(self) -> None:
        self.handle.flush()

    def sync(self) -> None:
        """Also survive a power loss, not only a killed process (at close)."""
        self.handle.flush()
        os.fsync(self.handle.fileno())

    def close(self) -> None:
        if not self.handle.closed:
            self.sync()
            self.handle.close()
