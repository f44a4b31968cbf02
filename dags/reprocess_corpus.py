"""Backfills: re-run the stages after the crawl for past snapshots with the current code and config.

Never re-crawls: each run reads the WARC that its date's crawl stored, and fails at once, naming the
path, when there is none. Each stage replaces its snapshot's output atomically, so re-running a date with
unchanged code and config rewrites identical bytes and a half-finished run is never visible.

Run it with `airflow backfill create --dag-id reprocess_corpus --from-date 2026-03-01 --to-date 2026-03-07`
or the UI's backfill form. It has a daily schedule only so that backfills can address dates (Airflow needs
one, and runs backfills only for unpaused DAGs); its scheduled runs skip themselves, since corpus_ingest
already processes each new day.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from operators.defaults import DEFAULT_ARGS, check_run_conf, run_params, run_snapshot
from operators.tasks import corpus_stages, stage_tasks
from pipeline.config import load_config
from pipeline.core.storage import DatasetRef


@dag(
    dag_id="reprocess_corpus",
    schedule="@daily",
    start_date=pendulum.datetime(2020, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=2,
    default_args=DEFAULT_ARGS,
    render_template_as_native_obj=True,
    doc_md=__doc__,
    tags=["pretrain", "corpus", "backfill"],
    params=run_params("clean.min_chars=300"),
)
def reprocess_corpus():
    @task(retries=0)
    def stored_crawl(params=None, dag_run=None, ds=None) -> str:
        """The stored crawl this run reprocesses; skips scheduled runs, fails when there is no crawl."""
        check_run_conf(get_current_context())
        snapshot = run_snapshot(params, ds)
        if dag_run.run_type == "scheduled":
            raise AirflowSkipException("reprocess_corpus acts on backfills and manual runs only")
        config = load_config(params["config_path"] or None, params["overrides"] or [])
        crawl = DatasetRef.of(config, "crawl", snapshot)
        if not crawl.is_complete():
            raise AirflowFailException(
                f"no stored crawl for snapshot {snapshot!r} at {crawl.path}; reprocess_corpus never "
                "re-crawls, so run corpus_ingest for that date first"
            )
        return str(crawl.path)

    # Backfills re-make the data; the reports on it are corpus_ingest's.
    stage_tasks(corpus_stages(reports=False), after=stored_crawl())


reprocess_corpus()
