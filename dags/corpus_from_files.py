"""A corpus from files you already have: ingest (Common Crawl WARC/WET, JSONL, Parquet, HF Arrow), then the corpus stages.

Triggered by hand (or `airflow dags trigger corpus_from_files --conf '{"snapshot": "cc1", "sources": [...]}'`):
`sources` names the files, folders, globs or URIs to read, and the other ingest settings (text, id, URL and
metadata columns, size cap) are `ingest.*` config keys. Left empty, `sources` re-reads the files the
snapshot's stored ingest names, so triggering a snapshot again reprocesses it with the current code and
config. The stages after the ingest come from the stage registry (`pipeline.stages`), as in `corpus_crawl`;
the last task announces the token shards, which schedules `pretrain` on them.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from operators.defaults import DEFAULT_ARGS, check_run_conf, run_params
from operators.tasks import corpus_stages, publish_token_shards, stage_task, stage_tasks
from pipeline.stages import stage


@dag(
    dag_id="corpus_from_files",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    render_template_as_native_obj=True,
    doc_md=__doc__,
    tags=["pretrain", "corpus", "ingest"],
    params={
        **run_params("ingest.id_column=doc_id"),
        "sources": Param(
            [],
            type=["null", "array"],
            items={"type": "string"},
            description="files, folders, globs or URIs to ingest; empty: re-read the snapshot's stored sources",
        ),
    },
)
def corpus_from_files():
    @task
    def run_overrides(params=None) -> list[str]:
        """The run's config overrides with its sources (ingest.sources), validated before any stage starts."""
        from operators.tasks import ingest_overrides

        check_run_conf(get_current_context())
        return ingest_overrides(params)

    overrides = run_overrides()
    ingest = stage_task(stage("ingest"), overrides=overrides)
    stages = stage_tasks(corpus_stages(reports=True), after=ingest, source="ingest", overrides=overrides)

    publish_token_shards(stages)  # announces the token shards, unless the quality gate holds them back


corpus_from_files()
