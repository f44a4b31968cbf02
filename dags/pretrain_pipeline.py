"""The walking pipeline: crawl -> clean -> tokenize -> train -> report, one snapshot per run.

Trigger it from the UI (optionally with a snapshot name, a config file and overrides), or run
`make demo`, which runs it with `airflow dags test` on the bundled sample site.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag

from operators import PipelineStageOperator, PyTorchJobOperator
from operators.defaults import DEFAULT_ARGS


@dag(
    dag_id="pretrain_pipeline",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    default_args={**DEFAULT_ARGS, "retries": 1},
    render_template_as_native_obj=True,
    tags=["pretrain", "demo"],
    params={
        "snapshot": Param("", type="string", description="snapshot name; empty means the logical date"),
        "config_path": Param(
            "", type="string", description="YAML config file; empty means built-in defaults"
        ),
        "overrides": Param([], type="array", description="config overrides such as train.steps=100"),
    },
)
def pretrain_pipeline():
    crawl = PipelineStageOperator(stage="crawl")
    clean = PipelineStageOperator(stage="clean")
    tokenize = PipelineStageOperator(stage="tokenize")
    train = PyTorchJobOperator(launcher="local")
    report = PipelineStageOperator(stage="report")
    crawl >> clean >> tokenize >> train >> report


pretrain_pipeline()
