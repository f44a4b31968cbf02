"""torchrun as the launcher runs it: ``python -m pipeline.train.agent <torchrun arguments>``.

The same agent (``torch.distributed.run.main``), except that when a signal stops it (SIGTERM from the
launcher, from its death signal, or from a rank whose failure no restart can fix) it says so in one line and
exits with 128 + the signal, where torchrun would end in a traceback of its own shutdown.
"""

from __future__ import annotations

import signal
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main

if __name__ == "__main__":
    try:
        main()
    except SignalException as stopped:
        print(f"torchrun: stopped by {signal.Signals(stopped.sigval).name}", file=sys.stderr, flush=True)
        sys.exit(128 + stopped.sigval)
