"""How every command of the project ends: an expected failure as one clear line and exit status 2."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

from pipeline.core.config import ConfigError
from pipeline.core.locks import OutputBusyError
from pipeline.core.storage import MissingInputError, StageFailure


def run_cli(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Turn expected failures into one clear line and exit status 2 instead of a traceback."""
    try:
        code = main(argv)
        sys.stdout.flush()  # a reader that went away (`pretrain config | head`) shows here, not at exit
        return code
    except (ConfigError, MissingInputError, StageFailure, OutputBusyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # As a Unix tool does: stop quietly; what is still buffered goes nowhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
