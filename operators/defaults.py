"""Task defaults every production DAG shares: retries with exponential backoff, and timeouts."""

from __future__ import annotations

from datetime import timedelta

DEFAULT_ARGS = {
    "owner": "pretrain",
    "retries": 2,
    "retry_delay": timedelta(minutes=1),
    "retry_exponential_backoff": 2.0,  # 1 min, 2 min, ... (a multiplier since Airflow 3.1; True means 1.0)
    "max_retry_delay": timedelta(minutes=30),
    "execution_timeout": timedelta(hours=4),
}

TRAINING_TIMEOUT = timedelta(hours=72)
