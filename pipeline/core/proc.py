"""Run a child program in its own process group, stream its output, and never leave orphans.

Orphans are ruled out from both ends: ``run_streaming`` kills the child's group when the caller fails (and
can pass SIGTERM and SIGINT on to it and wait), and a child can ask the kernel for a signal when its parent
dies (``die_with_parent``), so even a parent killed with SIGKILL takes its children along.
``python -m pipeline.core.proc <parent pid> <signal> <command...>`` runs a program that way
(``run_streaming(..., die_with_parent=SIGTERM)`` starts it so), for programs that are not ours.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

from pipeline.core.locks import child_lock_environment, held_lock_fds

_PR_SET_PDEATHSIG = 1


class ChildFailedError(RuntimeError):
    def __init__(self, cmd: Sequence[str], returncode: int, stopped_by: int | None = None) -> None:
        self.cmd = list(cmd)
        self.returncode = returncode
        self.stopped_by = stopped_by  # the signal run_streaming passed on to the child, if one did
        super().__init__(f"{os.path.basename(cmd[0])} exited with status {returncode}: {' '.join(cmd)}")


def die_with_parent(parent_pid: int, signum: int = signal.SIGKILL) -> None:
    """Linux: have the kernel send this process ``signum`` when ``parent_pid``, its parent, dies.

    ``parent_pid`` is what the parent said it was (or read at start): a parent that died before prctl took
    effect has already left this process to init, which the check afterwards catches. Elsewhere, a no-op.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signum))
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signum)


def kill_group(process: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the whole group (so torchrun's workers or Scrapy's children go too), then SIGKILL."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace_s)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        process.wait()


CHILD_LEVELS = {name: getattr(logging, name) for name in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")}


def log_child_line(logger: logging.Logger, line: str) -> None:
    """One child output line as one log line: at the child's level when the line starts with one
    (``WARNING scrapy.core.engine: ...``, as our children format their logs), else at INFO."""
    level, _, rest = line.partition(" ")
    if level in CHILD_LEVELS and rest:
        logger.log(CHILD_LEVELS[level], "%s", rest)
    else:
        logger.info("%s", line)


@contextlib.contextmanager
def _passed_on(process: subprocess.Popen, stopped: list[int]) -> Iterator[None]:
    """While the block runs, SIGTERM or SIGINT to this process goes to the child's group as SIGTERM (the
    child stops cleanly: torchrun's ranks checkpoint), a second one as SIGKILL; ``stopped`` records them.
    Only the main thread can install handlers; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def pass_on(signum, frame) -> None:
        stopped.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM if len(stopped) == 1 else signal.SIGKILL)

    previous = {signum: signal.signal(signum, pass_on) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _wait_interruptibly(process: subprocess.Popen) -> int:
    """Wait in short sleeps, not one waitpid: the kernel may hand this process's signal to another thread
    (the output reader), and Python runs the handler only when the main thread next runs bytecode."""
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return process.wait(timeout=60)


def run_streaming(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    on_line: Callable[[str], None] | None = None,
    logger: Any = None,  # a logging.Logger, or anything with its log() and info(): Airflow's task logger
    on_start: Callable[[subprocess.Popen], None] | None = None,
    check: bool = True,
    die_with_parent: int | None = None,
    forward_signals: bool = False,
) -> int:
    """Run cmd to completion, passing each output line to on_line (default: logger.info).

    Any exception in the caller's thread (KeyboardInterrupt, an Airflow task kill) kills the group.
    ``die_with_parent=signal.SIGTERM``: the kernel sends the child that signal should this process die
    (even by SIGKILL). ``forward_signals``: SIGTERM and SIGINT to this process stop the child instead
    (see ``_passed_on``), and the wait goes on until it exits; the ChildFailedError then says which
    signal (``stopped_by``). Leave it off where the caller has its own handlers (an Airflow task).
    """
    logger = logger or logging.getLogger(__name__)
    emit = on_line or (lambda line: log_child_line(logger, line))
    argv = list(cmd)
    if die_with_parent is not None:
        argv = [sys.executable, "-m", __name__, str(os.getpid()), str(int(die_with_parent)), *argv]
    process = subprocess.Popen(
        argv,
        # The child inherits the output locks this run holds, so they last as long as it writes.
        env=child_lock_environment(dict(env) if env is not None else None),
        pass_fds=held_lock_fds(),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        bufsize=1,
        start_new_session=True,
    )
    if on_start is not None:
        on_start(process)

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            emit(line.rstrip("\n"))

    reader = threading.Thread(target=pump, name="child-output", daemon=True)
    stopped: list[int] = []
    try:
        with _passed_on(process, stopped) if forward_signals else contextlib.nullcontext():
            reader.start()  # after the handlers: no line of the child's is seen before they are in place
            returncode = _wait_interruptibly(process) if forward_signals else process.wait()
    except BaseException:
        kill_group(process)
        raise
    finally:
        reader.join(timeout=5)
    if check and returncode != 0:
        raise ChildFailedError(cmd, returncode, stopped_by=stopped[0] if stopped else None)
    return returncode


def _exec_dying_with_parent(argv: list[str]) -> None:
    """``<parent pid> <signal> <command...>``: exec the command, which then gets the signal when the parent
    dies (the death signal survives exec)."""
    parent_pid, signum, *command = argv
    die_with_parent(int(parent_pid), int(signum))
    os.execvp(command[0], command)


def exit_now(code: int) -> NoReturn:
    """Exit with ``code`` as ``sys.exit`` would, less the interpreter's own teardown, for a process with
    torch, MLflow and SQLAlchemy loaded: freeing every module and object took it 1 to 2.5 s on 2 busy
    cores, and the train stage's ranks, torchrun and the launcher each wait for the one below them to end.

    What an exit does for the program still happens: the ``atexit`` handlers run (logging's flush and
    close of its files, MLflow's, ``weakref.finalize``'s, multiprocessing's), then stdout and stderr are
    flushed. While a thread that is not a daemon still runs, the ordinary exit waits for it instead.
    A file the program left open and unflushed is not flushed: close what you write.
    """
    main = threading.main_thread()
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not main):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader that went away, a stream closed already
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    _exec_dying_with_parent(sys.argv[1:])
