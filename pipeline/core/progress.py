"""Progress a person reads: each step of a stage logged as it ends, with its seconds, kept for the manifest."""

from __future__ import annotations

import logging
import time

STEP_FIELD = "pipeline_step"  # the LogRecord attribute naming the step that just ended


class StepClock:
    """Seconds per step of one stage run, logged as each step ends (``dedup near_dedup.lsh (3.2s) ...``) and
    kept in ``seconds`` for the manifest. Each of its log records carries the step's name in ``STEP_FIELD``,
    so a listener (a benchmark timing CPU per step) can follow the steps without the stage knowing it."""

    def __init__(self, stage: str, logger: logging.Logger) -> None:
        self.stage = stage
        self.log = logger
        self.seconds: dict[str, float] = {}
        self._last = time.monotonic()

    def done(self, step: str, message: str = "", *args) -> None:
        now = time.monotonic()
        self.seconds[step] = round(now - self._last, 3)
        self._last = now
        self.log.info(
            f"{self.stage} %s (%.1fs) {message}".rstrip(),
            step,
            self.seconds[step],
            *args,
            extra={STEP_FIELD: step},
        )
