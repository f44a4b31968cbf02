"""pipeline.core.proc: a child started with die_with_parent outlives no parent, however it dies, and
forward_signals turns SIGTERM/SIGINT into a clean stop of the child (a second one kills it)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from tests.train.support import kill_tree

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    def on_term(signum, frame):
        if sys.argv[1] == "stop":
            print("child stops on SIGTERM", flush=True)
            sys.exit(143)
        print("child ignores SIGTERM", flush=True)
    signal.signal(signal.SIGTERM, on_term)
    print(f"ready {os.getpid()}", flush=True)
    while True:
        signal.pause()
    """
)


def parent(mode: str, **options: object) -> subprocess.Popen:
    """A parent process running CHILD through run_streaming with ``options``; it reports how that ended."""
    script = textwrap.dedent(
        f"""
        import sys
        from pipeline.core.proc import ChildFailedError, run_streaming
        try:
            run_streaming([sys.executable, "-c", {CHILD!r}, {mode!r}],
                          on_line=lambda line: print(line, flush=True), **{options!r})
        except ChildFailedError as failed:
            print(f"stopped_by={{failed.stopped_by}} returncode={{failed.returncode}}", flush=True)
        """
    )
    return subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True
    )


def read_until(process: subprocess.Popen, prefix: str) -> str:
    for line in process.stdout:
        if line.startswith(prefix):
            return line.strip()
    pytest.fail(f"the process ended before printing {prefix!r}")


@pytest.fixture
def guarded():
    """Every process a test starts, killed with its tree at the end whatever happened; a hung read ends
    when pytest-timeout fires."""
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        kill_tree(process)
        process.wait()


def test_a_child_dies_with_its_parent_even_when_the_parent_is_killed(guarded):
    guarded.append(process := parent("stop", die_with_parent=int(signal.SIGTERM)))
    child = psutil.Process(int(read_until(process, "ready").split()[1]))
    os.kill(process.pid, signal.SIGKILL)  # no handler, no cleanup: only the kernel can tell the child
    process.wait()
    _, alive = psutil.wait_procs([child], timeout=60)  # a guard against a hang; it goes at once
    assert alive == [], "the child outlived its killed parent"


@pytest.mark.parametrize("first", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_sigint_stops_the_child_cleanly_and_the_parent_waits_for_it(guarded, first):
    guarded.append(process := parent("stop", forward_signals=True))
    read_until(process, "ready")
    os.kill(process.pid, first)
    assert read_until(process, "child") == "child stops on SIGTERM"
    assert read_until(process, "stopped_by") == f"stopped_by={int(first)} returncode=143"
    assert process.wait() == 0


def test_a_second_signal_kills_a_child_that_does_not_stop(guarded):
    guarded.append(process := parent("ignore", forward_signals=True))
    read_until(process, "ready")
    os.kill(process.pid, signal.SIGTERM)
    assert read_until(process, "child") == "child ignores SIGTERM"
    os.kill(process.pid, signal.SIGTERM)
    assert read_until(process, "stopped_by") == f"stopped_by={int(signal.SIGTERM)} returncode=-9"


def signal_thread(pid: int, thread_id: int, signum: int) -> None:
    """tgkill: a signal to one thread of ``pid``, as the kernel may pick any thread for a process's signal."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.tgkill(pid, thread_id, int(signum)) != 0:
        raise OSError(ctypes.get_errno(), "tgkill failed")


def test_a_signal_that_lands_on_the_output_thread_still_reaches_the_child(guarded):
    """The kernel hands a process's signal to any thread that does not block it; Python runs the handler in
    the main thread only once that thread runs bytecode. A main thread asleep in waitpid never did."""
    guarded.append(process := parent("ignore", forward_signals=True))
    read_until(process, "ready")
    (reader,) = [thread.id for thread in psutil.Process(process.pid).threads() if thread.id != process.pid]
    signal_thread(process.pid, reader, signal.SIGTERM)
    assert read_until(process, "child") == "child ignores SIGTERM"
    signal_thread(process.pid, reader, signal.SIGTERM)
    assert read_until(process, "stopped_by") == f"stopped_by={int(signal.SIGTERM)} returncode=-9"


EXITING = textwrap.dedent(
    """
    import atexit, os, sys, threading, weakref
    from pipeline.core.proc import exit_now

    class Teardown:
        def __del__(self):
            os.write(1, b"torn down\\n")  # the interpreter's teardown frees the module's objects

    class Held:
        pass

    kept, held = Teardown(), Held()
    atexit.register(print, "atexit ran")
    weakref.finalize(held, print, "finalizer ran")  # run at exit, held alive till then
    print("buffered, not flushed")  # a pipe: block-buffered
    go = threading.Event()
    if sys.argv[1] == "thread":
        def late():
            go.wait()  # alive when exit_now looks; released only if exit_now returns by raising SystemExit
            print("thread finished")
        threading.Thread(target=late).start()
    try:
        exit_now(3)
    finally:
        go.set()
    """
)


@pytest.mark.parametrize("mode", ["alone", "thread"])
def test_exit_now_runs_exit_handlers_and_flushes_but_skips_the_teardown(mode):
    done = subprocess.run([sys.executable, "-c", EXITING, mode], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    lines = done.stdout.splitlines()
    assert {"buffered, not flushed", "atexit ran", "finalizer ran"} <= set(lines)
    if mode == "thread":  # a thread not a daemon still running: the ordinary exit, which waits for it
        assert "thread finished" in lines
    else:
        assert "torn down" not in lines


def test_an_ordinary_exit_tears_down_where_exit_now_would_not():
    """The check above means something: the same script ending in sys.exit does print "torn down"."""
    script = EXITING.replace("exit_now(3)", "sys.exit(3)")
    done = subprocess.run([sys.executable, "-c", script, "alone"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert "torn down" in done.stdout.splitlines()
