"""How a training ends when it does not finish: stopped (a signal; the same command resumes it) or failed.

No torch here: the launcher imports it before torchrun starts.
"""

from __future__ import annotations

import signal
from pathlib import Path

EXIT_STOPPED = 128 + signal.SIGTERM  # the exit status of a run stopped by SIGTERM after its checkpoint


class TrainingStopped(Exception):
    """A signal stopped the run after it saved a checkpoint at ``step`` (None: before its first one, or
    when no checkpoint is known). Run the same command again to continue."""

    def __init__(self, step: int | None, checkpoint: Path | None, signal_name: str = "SIGTERM") -> None:
        where = f"after step {step}; checkpoint {checkpoint}" if checkpoint else "before its first checkpoint"
        super().__init__(f"stopped by {signal_name} {where}; run the same command again to resume")
        self.step = step
        self.checkpoint = checkpoint
