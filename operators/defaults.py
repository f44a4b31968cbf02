"""What every DAG shares: task retries with exponential backoff and timeouts, and the run's config params."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import Param

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
