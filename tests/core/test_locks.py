"""One writer per output: the lock is refused to a second process with the holder's name, is kept by the
children that inherit it, and is gone when the last holder exits, however it exits."""

import os
import signal
import subprocess
import sys

from pipeline.core.locks import OutputLock, held_lock_fds

TRY_LOCK = (
    "import sys\n"
    "from pathlib import Path\n"
    "from pipeline.core.locks import OutputBusyError, OutputLock\n"
    "try:\n"
    "    OutputLock(Path(sys.argv[1]), what='the test output').acquire()\n"
    "except OutputBusyError as exc:\n"
    "    print(exc)\n"
    "    raise SystemExit(3)\n"
    "print('acquired')\n"
)


def try_from_another_process(output):
    return subprocess.run([sys.executable, "-c", TRY_LOCK, str(output)], capture_output=True, text=True)


def test_a_second_process_is_refused_and_told_who_holds_it(tmp_path):
    output = tmp_path / "clean" / "s1"
    with OutputLock(output, what="clean s1"):
        result = try_from_another_process(output)
        assert result.returncode == 3, result.stderr
        assert f"pid {os.getpid()}" in result.stdout and "being written by another run" in result.stdout
    assert try_from_another_process(output).stdout.strip() == "acquired"


def test_a_child_that_inherits_the_lock_keeps_it_after_the_parent_lets_go(tmp_path):
    output = tmp_path / "crawl" / "s1"
    lock = OutputLock(output).acquire()
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        pass_fds=held_lock_fds(),
    )
    lock.release()
    assert held_lock_fds() == ()
    assert try_from_another_process(output).returncode == 3, "the child still writes: one writer"
    child.stdin.close()
    child.wait()
    assert try_from_another_process(output).stdout.strip() == "acquired"


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    output = tmp_path / "dedup" / "s1"
    holder = subprocess.Popen(
        [sys.executable, "-c", TRY_LOCK + "import sys; sys.stdin.read()\n", str(output)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "acquired"  # the holder's own signal
    assert try_from_another_process(output).returncode == 3
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert try_from_another_process(output).stdout.strip() == "acquired"


def test_the_same_process_may_take_a_lock_it_holds_and_the_outer_holder_keeps_it(tmp_path):
    output = tmp_path / "tokenize" / "s1"
    with OutputLock(output):
        with OutputLock(output):
            assert try_from_another_process(output).returncode == 3
        assert try_from_another_process(output).returncode == 3, "leaving the inner block keeps the lock"
    assert try_from_another_process(output).stdout.strip() == "acquired"
