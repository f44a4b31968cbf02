"""Daily corpus refresh: crawl (one mapped task per shard, then the merge), then the corpus stages.

One snapshot per logical date (`ds`), or the `snapshot` given when triggered by hand. The last task emits
an event on the `token_shards` Asset naming the snapshot, which schedules the `pretrain` DAG on it.
Which stages run after the crawl, and in which order, comes from the stage registry (`pipeline.stages`).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, get_current_context, task

from operators import CrawlOperator
from operators.defaults import DEFAULT_ARGS, check_run_conf, run_params
from operators.tasks import corpus_stages, crawl_shard_ids, publish_token_shards, stage_tasks
from pipeline.config import load_config


@dag(
    dag_id="corpus_crawl",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    render_template_as_native_obj=True,
    doc_md=__doc__,
    tags=["pretrain", "corpus"],
    params=run_params("crawl.max_pages=500"),
)
def corpus_crawl():
    @task
    def crawl_shards(params=None) -> list[int]:
        """The crawl's shard ids (crawl.num_shards, split by registered domain): one crawl task each."""
        check_run_conf(get_current_context())
        return crawl_shard_ids(load_config(params["config_path"] or None, params["overrides"] or []))

    crawl_shard = CrawlOperator.partial(task_id="crawl_shard").expand(shard=crawl_shards())
    crawl = CrawlOperator(task_id="crawl", merge=True)
    crawl_shard >> crawl
    stages = stage_tasks(corpus_stages(reports=True), after=crawl)

    publish_token_shards(stages)  # announces the token shards, unless the quality gate holds them back


corpus_crawl()
