"""Train a model on a corpus snapshot: triggered by new token shards, or from the UI with a form.

Scheduled on the `token_shards` Asset, so each snapshot a corpus DAG publishes is trained on with the config
it was built with. Triggered by hand, the form (declared once, ``operators.training.TRAINING_FORM``) sets the
model preset, steps, nodes, processes per node, launcher (torchrun here, or a Kubeflow TrainJob or PyTorchJob
on Kubernetes), precision, parallelism and MLflow experiment; empty fields keep the config's values, and an
empty snapshot means the newest tokenized one.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from operators.assets import TOKEN_SHARDS, latest_token_shards_extra
from operators.defaults import DEFAULT_ARGS, check_run_conf
from operators.tasks import training_tasks
from operators.training import form_params, resolve_training_run


@dag(
    dag_id="pretrain",
    schedule=[TOKEN_SHARDS],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    render_template_as_native_obj=True,
    doc_md=__doc__,
    tags=["pretrain", "train"],
    params={name: Param(**arguments) for name, arguments in form_params().items()},
)
def pretrain():
    @task
    def training_run(params=None, triggering_asset_events=None) -> dict[str, str]:
        """Resolve and validate this run's config into one file; XCom: its path and the snapshot."""
        context = get_current_context()
        check_run_conf(context)
        return resolve_training_run(
            params, latest_token_shards_extra(triggering_asset_events), dag_run_id=context["run_id"]
        )

    training_tasks(training_run())


pretrain()
