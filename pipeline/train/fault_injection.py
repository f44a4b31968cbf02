"""Fault injection for chaos testing: deliver a real signal at an exact step of one rank.

``PRETRAIN_TRAIN_FAULT="<SIGNAL>@<step>[:rank=<r>][:to=self|launcher|pretrain][:at=step|checkpoint]"``, e.g.

- ``SIGKILL@7:rank=1`` kills worker rank 1 after its step 7 (torchrun then restarts the group);
- ``SIGTERM@5:rank=0:to=launcher`` sends SIGTERM to the torchrun agent, as a scheduler preempting the job
  would; the agent passes it to every worker;
- ``SIGKILL@3:to=pretrain`` kills `pretrain train` itself, the process above torchrun (its pid comes in
  ``PRETRAIN_TRAIN_LAUNCHER_PID``), as a user or a scheduler killing the command would;
- ``SIGKILL@4:rank=1:at=checkpoint`` kills worker rank 1 while it saves step 4's DCP checkpoint: after its
  shards are on disk, before the step is published (in the background writer of an asynchronous save).

It fires in the first attempt only (``TORCHELASTIC_RESTART_COUNT`` 0 or unset), so a restarted group runs
through. The rank's entrypoint (``pipeline.train.__main__``) installs it as a ``Trainer.after_step`` hook only
when the variable is set, so the training step itself knows nothing of it.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)
ENV_FAULT = "PRETRAIN_TRAIN_FAULT"
ENV_LAUNCHER_PID = "PRETRAIN_TRAIN_LAUNCHER_PID"  # set by `pretrain train` for its torchrun (to=pretrain)
_SPEC = re.compile(
    r"^(?P<signal>SIG[A-Z0-9]+)@(?P<step>\d+)(?::rank=(?P<rank>\d+))?(?::to=(?P<to>self|launcher|pretrain))?(?::at=(?P<at>step|checkpoint))?$"
)
_UPSTREAM = ("launcher", "pretrain")  # targets that pass a SIGTERM on to every worker


@dataclass(frozen=True)
class Fault:
    signal: signal.Signals
    step: int
    rank: int
    to: str
    at: str = "step"

    @classmethod
    def parse(cls, spec: str) -> Fault:
        match = _SPEC.match(spec.strip())
        if not match or not hasattr(signal, match["signal"]):
            raise ValueError(
                f"{ENV_FAULT}={spec!r}: expected "
                "<SIGNAL>@<step>[:rank=<r>][:to=self|launcher|pretrain][:at=step|checkpoint]"
            )
        return cls(
            signal=signal.Signals[match["signal"]],
            step=int(match["step"]),
            rank=int(match["rank"] or 0),
            to=match["to"] or "self",
            at=match["at"] or "step",
        )

    def after_step(self, trainer) -> None:
        """A ``Trainer.after_step`` hook: fire after this fault's step, and wait for a SIGTERM sent upstream to
        come back to this rank, so every rank stops after the same step."""
        maybe_inject(self, trainer.step, delivered=lambda: trainer.stopping)


def arm(trainer) -> None:
    """Install the fault ``PRETRAIN_TRAIN_FAULT`` names for this rank, if any, as a ``Trainer.after_step`` hook."""
    fault = fault_for(trainer.ctx.rank)
    if fault is None:
        return
    if fault.at == "step":
        trainer.after_step.append(fault.after_step)
        return
    hooks = getattr(trainer.checkpoint, "after_write", None)
    if hooks is None:
        raise ValueError(f"{ENV_FAULT}: at=checkpoint needs train.checkpoint_format=dcp")
    hooks.append(lambda step: maybe_inject(fault, step))


def fault_for(rank: int, environ: dict[str, str] | None = None) -> Fault | None:
    env = os.environ if environ is None else environ
    spec = env.get(ENV_FAULT)
    if not spec or int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0:
        return None
    fault = Fault.parse(spec)
    if fault.rank != rank:
        return None
    log.warning("fault injection armed: %s to %s after step %d", fault.signal.name, fault.to, fault.step)
    return fault


def maybe_inject(
    fault: Fault | None, step: int, delivered: Callable[[], bool] | None = None, wait_s: float = 60.0
) -> None:
    """Send the fault's signal after ``step``. Sent upstream (the torchrun agent or `pretrain train`), whose
    SIGTERM (or, killed, death signal) comes back to every worker, it waits until ``delivered()`` says this
    rank got it too, so the ranks agree to stop after this very step rather than whichever step the
    forwarded signal happens to reach."""
    if fault is None or step != fault.step:
        return
    targets = {
        "self": os.getpid,
        "launcher": os.getppid,
        "pretrain": lambda: int(os.environ[ENV_LAUNCHER_PID]),
    }
    target = targets[fault.to]()
    log.warning("fault injection: sending %s to pid %d after step %d", fault.signal.name, target, step)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.kill(target, fault.signal)
    if fault.to in _UPSTREAM and delivered is not None:
        deadline = time.monotonic() + wait_s
        while not delivered() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not delivered():
            log.warning(
                "fault injection: the launcher did not pass %s on within %.0f s", fault.signal.name, wait_s
            )
