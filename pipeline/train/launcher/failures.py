"""How a training ends when it does not finish: stopped (a signal; the same command resumes it) or failed.

A failure is *deterministic* when running the same code on the same files again cannot end otherwise: a
bad setting (``ConfigError``), a missing input, a checkpoint that does not fit, another run holding the
output, or an operating-system refusal such as a read-only or full checkpoint folder (``EACCES``,
``EROFS``, ``ENOSPC``...). torchrun restarts a failed worker group whatever the reason (its agent has no
notion of a failure a restart cannot fix), so a rank that meets one records it and stops its agent
instead of failing into a restart: the job fails once, and the launcher leads its error with the
rank's one-line reason. Other failures (a killed rank, a lost peer, an out-of-memory) are recorded too,
and torchrun's restarts deal with them.

Records are small JSON files, one per rank and attempt, in the folder the launcher names
(``PRETRAIN_TRAIN_FAILURES``); the traceback is in the record, not on the console.

No torch here: the launcher imports it before torchrun starts.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import traceback
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from pipeline.core.config import ConfigError
from pipeline.core.locks import OutputBusyError
from pipeline.core.proc import ChildFailedError
from pipeline.core.storage import MissingInputError, StageFailure

log = logging.getLogger(__name__)
EXIT_STOPPED = 128 + signal.SIGTERM  # the exit status of a run stopped by SIGTERM after its checkpoint
EXIT_NOT_RETRIED = 2  # a rank's deterministic failure; also what the CLI answers for one
ENV_FAILURES = "PRETRAIN_TRAIN_FAILURES"  # the folder ranks write their failure records into
TORCHRUN_WORKER = "TORCHELASTIC_RUN_ID"  # set by the torchrun agent for the workers it starts

NOT_RETRIED_TYPES = (ConfigError, MissingInputError, StageFailure, OutputBusyError)
# The system refused, and will refuse again: permissions, a read-only or full filesystem, a path in the way.
NOT_RETRIED_ERRNOS = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EEXIST,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.ENAMETOOLONG,
    }
)


class TrainingStopped(Exception):
    """A signal stopped the run after it saved a checkpoint at ``step`` (None: before its first one, or
    when no checkpoint is known). Run the same command again to continue."""

    def __init__(self, step: int | None, checkpoint: Path | None, signal_name: str = "SIGTERM") -> None:
        where = f"after step {step}; checkpoint {checkpoint}" if checkpoint else "before its first checkpoint"
        super().__init__(f"stopped by {signal_name} {where}; run the same command again to resume")
        self.step = step
        self.checkpoint = checkpoint


class TrainingFailed(StageFailure, ChildFailedError):
    """torchrun failed; the message is one line, the reason first. A StageFailure, so the CLI prints just
    that line, and a ChildFailedError, as it was before the launcher read the ranks' records."""

    def __init__(self, message: str, cmd: list[str], returncode: int, deterministic: bool) -> None:
        RuntimeError.__init__(self, message)
        self.cmd = list(cmd)
        self.returncode = returncode
        self.stopped_by = None
        self.deterministic = deterministic


def is_deterministic(exc: BaseException) -> bool:
    """Whether running again, unchanged, would fail the same way (see the module docstring)."""
    if isinstance(exc, NOT_RETRIED_TYPES) or getattr(exc, "not_retried", False):
        return True
    return isinstance(exc, OSError) and exc.errno in NOT_RETRIED_ERRNOS


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or "(no message)"
    return f"{type(exc).__name__}: {text}"


@dataclass(frozen=True)
class FailureRecord:
    rank: int
    attempt: int  # torchrun's restart count
    error: str  # "PermissionError: [Errno 13] Permission denied: '...'", one line
    deterministic: bool
    at: str
    traceback: str

    @property
    def reason(self) -> str:
        return f"rank {self.rank}: {self.error}"

    @classmethod
    def of(cls, exc: BaseException, rank: int) -> FailureRecord:
        return cls(
            rank=rank,
            attempt=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
            error=one_line(exc),
            deterministic=is_deterministic(exc),
            at=datetime.now(UTC).isoformat(timespec="microseconds"),
            traceback="".join(traceback.format_exception(exc)),
        )

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"failure-attempt{self.attempt}-rank{self.rank}.json"
        temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        temporary.write_text(json.dumps(asdict(self), indent=2) + "\n")
        temporary.replace(path)
        return path


def read_failures(folder: Path) -> list[FailureRecord]:
    """The records in ``folder``, earliest first; unreadable ones are skipped."""
    records = []
    for path in folder.glob("failure-*.json") if folder.is_dir() else ():
        try:
            records.append(FailureRecord(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(records, key=lambda record: record.at)


def rank_failed(exc: Exception, rank: int, stopping: bool = False) -> int:
    """A rank's answer to an exception out of training: record it, and for a deterministic one log its
    single line, stop the torchrun agent (so it restarts nothing) and return ``EXIT_NOT_RETRIED``.
    ``stopping``: the rank was told to stop (SIGTERM) and then failed, typically in a collective with a
    peer that already left; one line and ``EXIT_STOPPED``. Anything else is re-raised, for torchrun's
    restarts."""
    record = FailureRecord.of(exc, rank)
    where = ""
    if os.environ.get(ENV_FAILURES):
        try:
            where = f" (traceback in {record.write(Path(os.environ[ENV_FAILURES]))})"
        except OSError as write_error:
            log.warning("could not write the failure record: %s", write_error)
    if stopping and not record.deterministic:
        log.warning("%s, while stopping with the job%s", record.reason, where)
        return EXIT_STOPPED
    if not record.deterministic:
        raise exc
    log.error("%s: a restart cannot fix this, so the job stops here%s", record.reason, where)
    if not where:  # no launcher collects records (torchrun started by hand, a Kubernetes pod): log it
        log.error("%s", record.traceback.rstrip())
    if TORCHRUN_WORKER in os.environ:
        os.kill(os.getppid(), signal.SIGTERM)  # the agent stops every worker and exits, restarting none
    return EXIT_NOT_RETRIED


def failure_summary(failed: ChildFailedError, records: list[FailureRecord], resume: str) -> TrainingFailed:
    """What the launcher raises when torchrun failed: the root cause in one line, then what to do about it
    (``resume`` says where running again picks up)."""
    deterministic = [record for record in records if record.deterministic]
    if deterministic:
        message = (
            f"{deterministic[0].reason} (not retried: a restart cannot fix it); fix that, then run the same "
            f"command again: {resume}"
        )
    elif records:  # the first error of the last attempt: often a consequence (a peer that died first)
        last_attempt = max(record.attempt for record in records)
        first = next(record for record in records if record.attempt == last_attempt)
        message = (
            f"training failed after {last_attempt} restart(s) (torchrun exit status {failed.returncode}); "
            f"first error recorded: {first.reason}; run the same command again: {resume}"
        )
    else:
        message = (
            f"training failed (torchrun exit status {failed.returncode}, no rank recorded an error); "
            f"run the same command again: {resume}"
        )
    return TrainingFailed(message, failed.cmd, failed.returncode, deterministic=bool(deterministic))
