"""Backfills: re-run the stages after a snapshot's source for past snapshots with the current code and config.

A snapshot's source is its crawl or its ingest. Never re-crawls: a crawled snapshot is reprocessed from the
WARC its crawl stored. An ingested snapshot is ingested again from the files its manifest names (checked
against their sizes and checksums), then reprocessed. A run fails at once, naming the paths, when the snapshot
has neither. Each stage replaces its snapshot's output atomically, so re-running a date with unchanged code
and config rewrites identical bytes and a half-finished run is never visible.

Run it with `airflow backfill create --dag-id reprocess_corpus --from-date 2026-03-01 --to-date 2026-03-07
--max-active-runs 1`
or the UI's backfill form. It has a daily schedule only so that backfills can address dates (Airflow needs
one, and runs backfills only for unpaused DAGs); its scheduled runs skip themselves, since corpus_crawl
already processes each new day. Backfill with `--max-active-runs 1` so dates run one at a time, oldest first:
decontaminate checks a snapshot against the held-out documents of the snapshots before it, so those must be
finished when it runs (a backfill takes its own limit, not the DAG's).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from operators.defaults import DEFAULT_ARGS, check_run_conf, run_params, run_snapshot
from operators.tasks import corpus_stages, source_readers, stage_task, stage_tasks
from pipeline.config import load_config
from pipeline.core.storage import DatasetRef
from pipeline.stages import CORPUS_SOURCES, stage

STAGES = corpus_stages(reports=False)  # backfills re-make the data; the reports on it are corpus_crawl's
INGEST = stage("ingest")


@dag(
    dag_id="reprocess_corpus",
    schedule="@daily",
    start_date=pendulum.datetime(2020, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # manual runs one at a time; a backfill takes its own --max-active-runs (docs: 1)
    default_args=DEFAULT_ARGS,
    render_template_as_native_obj=True,
    doc_md=__doc__,
    tags=["pretrain", "corpus", "backfill"],
    params=run_params("clean.min_chars=300"),
)
def reprocess_corpus():
    @task.branch(retries=0)
    def stored_source(params=None, dag_run=None, ds=None, ti=None) -> list[str]:
        """The snapshot's stored source (XCom key ``source``): a crawl goes straight to clean, an ingest is
        re-read first. Skips scheduled runs; fails when the snapshot has no source, or two."""
        check_run_conf(get_current_context())
        snapshot = run_snapshot(params, ds)
        if dag_run.run_type == "scheduled":
            raise AirflowSkipException("reprocess_corpus acts on backfills and manual runs only")
        config = load_config(params["config_path"] or None, params["overrides"] or [])
        refs = [DatasetRef.of(config, name, snapshot) for name in CORPUS_SOURCES]
        stored = [ref for ref in refs if ref.is_complete()]
        if not stored:
            raise AirflowFailException(
                f"no stored crawl or ingest for snapshot {snapshot!r} at {refs[0].path} or {refs[1].path}; "
                "reprocess_corpus never re-crawls, so run corpus_crawl or corpus_from_files for it first"
            )
        if len(stored) > 1:
            raise AirflowFailException(
                f"snapshot {snapshot!r} has both a crawl and an ingest ({refs[0].path}, {refs[1].path}); "
                "reprocess it by hand: `pretrain clean --input-stage crawl|ingest`, then the later stages"
            )
        ti.xcom_push(key="source", value=stored[0].stage)
        first = source_readers(STAGES)
        return [INGEST.name, *first] if stored[0].stage == INGEST.name else first

    source = stored_source()
    ingest = stage_task(INGEST)  # no ingest.sources: re-reads the files the stored manifest names
    source >> ingest
    stage_tasks(
        STAGES,
        after=[source, ingest],
        source="{{ ti.xcom_pull(task_ids='stored_source', key='source') }}",
        source_readers_args={"trigger_rule": "none_failed_min_one_success"},  # ingest is skipped for a crawl
    )


reprocess_corpus()
