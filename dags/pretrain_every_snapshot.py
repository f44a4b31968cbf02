"""Train on everything a corpus has: every complete snapshot of it, each time a new one is tokenized.

The scheduled variant of `pretrain`: on each `token_shards` event it trains one run on the mixture
``[{corpus: <the form's corpus, else the event's>, snapshots: all}]``, so the newest snapshot joins the ones
before it (a mixture filled in on the form replaces it). The run is filed under the event's snapshot. Created
paused: unpause it, or `pretrain` (one snapshot per event), or both. The form is `pretrain`'s, plus the corpus.
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from operators.assets import TOKEN_SHARDS, latest_token_shards_extra
from operators.defaults import DEFAULT_ARGS, check_run_conf
from operators.tasks import training_tasks
from operators.training import form_params, resolve_training_run

CORPUS_PARAM: dict[str, Any] = {
    "default": None,
    "type": ["null", "string"],
    "title": "Corpus",
    "description": "Corpus whose every complete snapshot to train on; empty means the triggering event's.",
    "section": "Data and config",
}


@dag(
    dag_id="pretrain_every_snapshot",
    schedule=[TOKEN_SHARDS],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    is_paused_upon_creation=True,
    default_args=DEFAULT_ARGS,
    render_template_as_native_obj=True,
    doc_md=__doc__,
    tags=["pretrain", "train", "mixture"],
    params={
        "corpus": Param(**CORPUS_PARAM),
        **{name: Param(**arguments) for name, arguments in form_params().items()},
    },
)
def pretrain_every_snapshot():
    @task
    def training_run(params=None, triggering_asset_events=None) -> dict[str, str]:
        """Resolve the run's config with the mixture of every snapshot; XCom: its path and the snapshot."""
        context = get_current_context()
        check_run_conf(context)
        return resolve_training_run(
            params,
            latest_token_shards_extra(triggering_asset_events),
            dag_run_id=context["run_id"],
            every_snapshot=True,
        )

    training_tasks(training_run())


pretrain_every_snapshot()
