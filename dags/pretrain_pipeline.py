"""The walking pipeline in one DAG: crawl, the corpus stages (operators.corpus), train, report; one snapshot.

The demo: `make demo` runs it with `airflow dags test` on the bundled sample site. It is built from the
same tasks as the production DAGs (`corpus_ingest`, then `pretrain` on its token shards), so the demo
and production run the same stages. Trigger it from the UI with a snapshot name, a config file and overrides.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag

from operators import CrawlOperator, PipelineStageOperator, PyTorchJobOperator
from operators.corpus import corpus_stage_tasks
from operators.defaults import DEFAULT_ARGS, run_params


@dag(
    dag_id="pretrain_pipeline",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    default_args={**DEFAULT_ARGS, "retries": 1},
    render_template_as_native_obj=True,
    doc_md=__doc__,
    tags=["pretrain", "demo"],
    params=run_params("train.steps=100"),
)
def pretrain_pipeline():
    crawl = CrawlOperator()  # every shard of the crawl in turn, then their merge
    stages = corpus_stage_tasks(first_input="crawl")
    train = PyTorchJobOperator(launcher="local", input_stage=stages[-1].task_id)
    report = PipelineStageOperator(stage="report")
    crawl >> stages[0]
    stages[-1] >> train >> report


pretrain_pipeline()
