"""One writer per stage output: an OS file lock held for the whole run, child processes included.

The lock is an ``flock`` on ``.lock-<name>`` beside the output folder (``<data_root>/<corpus>/<stage>/``,
always a local folder: the Python-side writers only write local data roots, see
``pipeline.core.storage.local_path``). flock belongs to the open file, so a child that inherits the file
(every child started by ``pipeline.core.proc.run_streaming``, which passes ``held_lock_fds()`` on) keeps the
lock for as long as it lives, even when its parent is gone; the kernel drops it when the last holder exits,
however it exits, so a killed run never leaves a stale lock.

A second run does not wait: it fails at once with ``OutputBusyError`` naming the holder (pid, host,
command, start time), which the lock file records.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
from datetime import UTC, datetime
from pathlib import Path

_HELD: dict[Path, int] = {}  # lock file -> fd, for every lock this process holds
# Lock files an ancestor holds for this process's run (set by run_streaming for its children): a child
# writing the output its parent locked (the crawler under `pretrain crawl`, rank 0 under `pretrain train`)
# is that run, not a second writer.
INHERITED_ENV = "PRETRAIN_HELD_LOCKS"


class OutputBusyError(RuntimeError):
    """Another run is writing this output; the message names it."""


def lock_path(output: Path) -> Path:
    return output.parent / f".lock-{output.name}"


def held_lock_fds() -> tuple[int, ...]:
    """The descriptors of the locks this process holds; children get them so the lock outlives us."""
    return tuple(_HELD.values())


def child_lock_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: ours) plus the locks held for this run, for a child process to recognise."""
    env = dict(os.environ if env is None else env)
    held = sorted({*inherited_locks(), *(str(path) for path in _HELD)})
    if held:
        env[INHERITED_ENV] = os.pathsep.join(held)
    return env


def inherited_locks() -> set[str]:
    return {path for path in os.environ.get(INHERITED_ENV, "").split(os.pathsep) if path}


class OutputLock:
    """``with OutputLock(path, what="clean sample/2026-11-29"):`` holds the output's lock or raises."""

    def __init__(self, output: Path, what: str | None = None) -> None:
        self.path = lock_path(output)
        self.what = what or str(output)
        self.fd: int | None = None

    def acquire(self) -> OutputLock:
        if self.path in _HELD or str(self.path) in inherited_locks():
            return self  # this process, or the ancestor that started it for this run, holds it
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise OutputBusyError(
                f"{self.what} is being written by another run ({holder}); wait for it to finish or stop it, "
                f"then run this again (lock: {self.path})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_holder_record()).encode(), 0)
        os.set_inheritable(fd, True)
        self.fd = fd
        _HELD[self.path] = fd
        return self

    def release(self) -> None:
        if self.fd is None:
            return
        _HELD.pop(self.path, None)
        os.close(self.fd)  # children that inherited it keep the lock until they exit
        self.fd = None

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _holder_record() -> dict[str, object]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": " ".join(sys.argv)[:300],
        "since": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _read_holder(fd: int) -> str:
    try:
        record = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        record = {}
    if not record:
        return "holder unknown"
    return f"pid {record.get('pid')} on {record.get('host')} since {record.get('since')}: {record.get('command')}"
