"""Train a model on a corpus snapshot: triggered by new token shards, or from the UI with a form.

Scheduled on the `token_shards` Asset, so each snapshot `corpus_ingest` publishes is trained on with the
config it was built with. Triggered by hand, the form sets the model preset, steps, nodes, processes per
node, launcher (torchrun here, or a Kubeflow TrainJob or PyTorchJob on Kubernetes), precision and MLflow
experiment; empty fields keep the config's values, and an empty snapshot means the newest tokenized one.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from operators.assets import TOKEN_SHARDS, latest_token_shards_extra
from operators.defaults import DEFAULT_ARGS, TRAINING_TIMEOUT, check_run_conf
from operators.pytorch_job import LAUNCHERS
from operators.tasks import stage_tasks, training_stages
from operators.training import resolve_training_run
from pipeline.model import PRESETS


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
    params={
        "preset": Param(
            None,
            type=["null", "string"],
            enum=[None, *sorted(PRESETS)],
            title="Model preset",
            description="Named model size; empty keeps the config's model.preset.",
            section="Model",
        ),
        "precision": Param(
            None,
            type=["null", "string"],
            enum=[None, "fp32", "bf16", "fp16"],
            title="Precision",
            description="Training precision; empty keeps the config's train.precision.",
            section="Model",
        ),
        "steps": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            title="Training steps",
            description="Optimizer steps; empty keeps the config's train.steps.",
            section="Training",
        ),
        "launcher": Param(
            "local",
            type="string",
            enum=list(LAUNCHERS),
            title="Launcher",
            description="local: torchrun on the Airflow worker. kubernetes: a Kubeflow Trainer v2 TrainJob "
            "(or a v1 PyTorchJob, by the pretrain_kubernetes Variable's api).",
            section="Training",
        ),
        "nodes": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            title="Nodes",
            description="Machines (Kubernetes pods); empty keeps train.nnodes.",
            section="Training",
        ),
        "processes_per_node": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            title="Processes per node",
            description="torchrun processes per node, usually one per GPU; empty keeps train.nproc_per_node.",
            section="Training",
        ),
        "pipeline_stages": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            title="Pipeline stages",
            description="Ranks the model is cut into by layers (pp; the other ranks are data parallel); "
            "empty keeps train.pipeline_stages.",
            section="Parallelism",
        ),
        "microbatches": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            title="Micro-batches",
            description="Micro-batches per step through the pipeline; empty keeps train.microbatches.",
            section="Parallelism",
        ),
        "pipeline_schedule": Param(
            None,
            type=["null", "string"],
            enum=[None, "gpipe", "1f1b", "interleaved_1f1b"],
            title="Pipeline schedule",
            description="gpipe, 1f1b or interleaved_1f1b; empty keeps train.pipeline_schedule.",
            section="Parallelism",
        ),
        "stages_per_rank": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            title="Stages per rank",
            description="Virtual stages per rank (interleaved_1f1b needs 2 or more); empty keeps "
            "train.stages_per_rank.",
            section="Parallelism",
        ),
        "mlflow_experiment": Param(
            None,
            type=["null", "string"],
            title="MLflow experiment",
            description="Experiment to record the run in; empty keeps tracking.experiment (pretrain-<corpus>-<preset>).",
            section="Tracking",
        ),
        "snapshot": Param(
            None,
            type=["null", "string"],
            title="Snapshot",
            description="Token shards to train on; empty means the triggering event's, else the newest.",
            section="Data and config",
        ),
        "config_path": Param(
            None,
            type=["null", "string"],
            title="Config file",
            description="YAML config file; empty means the corpus's config, else built-in defaults.",
            section="Data and config",
        ),
        "overrides": Param(
            [],
            type=["null", "array"],
            items={"type": "string"},
            title="Config overrides",
            description="One key=value per line, e.g. train.lr=0.001.",
            section="Data and config",
        ),
    },
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

    run = training_run()
    stage_tasks(
        training_stages(),
        snapshot=run["snapshot"],
        config_path=run["config_path"],
        overrides=[],
        torchrun={"launcher": "{{ params.launcher }}", "execution_timeout": TRAINING_TIMEOUT},
    )


pretrain()
