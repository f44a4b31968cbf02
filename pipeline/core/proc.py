"""Run a child program in its own process group, stream its output, and never leave orphans."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence

from pipeline.core.locks import child_lock_environment, held_lock_fds


class ChildFailedError(RuntimeError):
    def __init__(self, cmd: Sequence[str], returncode: int) -> None:
        self.cmd = list(cmd)
        self.returncode = returncode
        super().__init__(f"{os.path.basename(cmd[0])} exited with status {returncode}: {' '.join(cmd)}")


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


def run_streaming(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    on_line: Callable[[str], None] | None = None,
    logger: logging.Logger | None = None,
    on_start: Callable[[subprocess.Popen], None] | None = None,
    check: bool = True,
) -> int:
    """Run cmd to completion, passing each output line to on_line (default: logger.info).

    Any exception in the caller's thread (KeyboardInterrupt, an Airflow task kill) kills the group.
    """
    logger = logger or logging.getLogger(__name__)
    emit = on_line or (lambda line: log_child_line(logger, line))
    process = subprocess.Popen(
        list(cmd),
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
    reader.start()
    try:
        returncode = process.wait()
    except BaseException:
        kill_group(process)
        raise
    finally:
        reader.join(timeout=5)
    if check and returncode != 0:
        raise ChildFailedError(cmd, returncode)
    return returncode
