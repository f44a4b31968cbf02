"""The walking pipeline in one DAG: crawl, the corpus stages, the training stages; one snapshot.

The demo: `make demo` runs it with `airflow dags test` on the bundled sample site, quality report included. It is built from the
same tasks as the production DAGs (`corpus_crawl`, then `pretrain` on its token shards), so the demo
and production run the same stages. Trigger it from the UI with a snapshot name, a config file and overrides.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag

from operators import CrawlOperator
from operators.defaults import DEFAULT_ARGS, run_params
from operators.tasks import corpus_stages, stage_tasks, training_stages


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
    # The corpus stages with their data-quality report (the page a newcomer should see first), then training
    # as train.launcher says (by default torchrun on this machine).
    stages = [*corpus_stages(reports=True), *training_stages()]
    stage_tasks(stages, after=crawl)


pretrain_pipeline()
