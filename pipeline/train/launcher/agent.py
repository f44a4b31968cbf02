"""torchrun as the launcher runs it: ``python -m pipeline.train.launcher.agent <torchrun arguments>``.

The same agent (``torch.distributed.run.main``), except that

- when a signal stops it (SIGTERM from the launcher, from its death signal, or from a rank whose failure no
  restart can fix) it says so in one line and exits with 128 + the signal, where torchrun would end in a
  traceback of its own shutdown;
- only the first signal stops it. torchrun raises on every one, so a second (every rank failing alike, or
  the launcher and a rank at once) landed inside the shutdown the first had begun: in its log call, a
  traceback; in its wait for the workers, no SIGKILL for those that outlive the grace period (orphans).
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

from torch.distributed.elastic.multiprocessing import api as multiprocessing_api
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main

from pipeline.core.proc import exit_now

_raise_on_signal = multiprocessing_api._terminate_process_handler
_stopping = False


def _stop_once(signum: int, frame: FrameType | None) -> None:
    global _stopping
    if _stopping:
        return  # the shutdown under way stops every worker already
    _stopping = True
    _raise_on_signal(signum, frame)


if __name__ == "__main__":
    # Looked up when the worker processes start, which is when torchrun installs its handler.
    multiprocessing_api._terminate_process_handler = _stop_once
    try:
        main()
    except SignalException as stopped:
        print(f"torchrun: stopped by {signal.Signals(stopped.sigval).name}", file=sys.stderr, flush=True)
        sys.exit(128 + stopped.sigval)
    exit_now(0)  # the workers succeeded; the interpreter's teardown would hold the launcher up ~0.8 s
