"""What every DAG shares: task retries with exponential backoff and timeouts, and the run's config params."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from airflow.sdk import Param
from airflow.sdk.exceptions import AirflowFailException

from pipeline.core.config import unknown_key_message

DEFAULT_ARGS = {
    "owner": "pretrain",
    "retries": 2,
    "retry_delay": timedelta(minutes=1),
    "retry_exponential_backoff": 2.0,  # 1 min, 2 min, ... (a multiplier since Airflow 3.1; True means 1.0)
    "max_retry_delay": timedelta(minutes=30),
    "execution_timeout": timedelta(hours=4),
}

TRAINING_TIMEOUT = timedelta(hours=72)


def run_params(example_override: str) -> dict[str, Any]:
    """The params of a DAG run: its snapshot, config file and overrides (``example_override`` shows the form)."""
    return {
        "snapshot": Param(
            None, type=["null", "string"], description="snapshot name; empty means the logical date"
        ),
        "config_path": Param(
            None, type=["null", "string"], description="YAML config file; empty means built-in defaults"
        ),
        "overrides": Param(
            [],
            type=["null", "array"],
            items={"type": "string"},
            description=f"config overrides such as {example_override}",
        ),
    }


def run_snapshot(params: Mapping[str, Any], logical_ds: str | None) -> str:
    """The snapshot a DAG run works on: its ``snapshot`` param, else its logical date.

    Read from the params themselves, never through a template: DAGs render templates as native objects,
    which turns the snapshot "20261201" into an int, "1e3" into a float and "None" into None.
    """
    snapshot = params.get("snapshot") or logical_ds
    if not snapshot:
        raise AirflowFailException("this run has no logical date; give it a snapshot (the `snapshot` param)")
    return str(snapshot)


def check_run_conf(context: Mapping[str, Any]) -> None:
    """Fail the run at its first task when its conf holds a key the DAG has no param for.

    Airflow accepts any conf key, so `{"stpes": 10}` would train the default steps; the CLI rejects the same
    typo, with the same wording as here.
    """
    dag_run, dag = context.get("dag_run"), context.get("dag")
    conf = getattr(dag_run, "conf", None) or {}
    known = list(getattr(dag, "params", None) or context.get("params") or {})
    for key in sorted(set(conf) - set(known)):
        raise AirflowFailException(f"run conf: {unknown_key_message(key, known)}")
