"""What the Kubernetes launcher's protocol tests share: the task identity, and running a deferral to its end."""

import asyncio
from dataclasses import dataclass

import pytest
from airflow.sdk.exceptions import TaskDeferred

NAMESPACE = "ml"
RUN_ID = "manual__2026-11-29T10:00:00+00:00"


@dataclass
class TaskTry:
    """The identity of one task try, as Airflow's task instance gives it to the operator."""

    dag_id: str = "pretrain"
    run_id: str = RUN_ID
    task_id: str = "train"
    try_number: int = 1
    map_index: int = -1


def run_trigger(trigger) -> dict:
    """The trigger's first event, as the triggerer would get it."""

    async def first_event():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(first_event())


def start(op, try_number=1):
    """Execute one try up to its deferral; returns the trigger it deferred to."""
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": TaskTry(try_number=try_number)})
    assert deferred.value.method_name == "execute_complete"
    # The run the operator decided travels in the trigger (its event hands it to execute_complete).
    assert not deferred.value.kwargs and deferred.value.trigger.serialize()[1]["run"]
    return deferred.value.trigger
