"""Data ablations from a form: which corpus recipe gives the better model? (docs/ablations.md)

`prepare` runs the corpus stages once per variant (identical outputs shared), the shared tokenizer and the
held-out reference check; `train_variant` is mapped over variants x seeds, so a cluster's workers train them
side by side (each a torchrun launch, as `pretrain train`); `compare` writes the comparison (report.html,
comparison.json, MLflow parent run). A rerun skips finished stages and trainings.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from operators.ablate import compare_step, prepare_step, train_step
from operators.defaults import DEFAULT_ARGS, TRAINING_TIMEOUT, check_run_conf, run_params


@dag(
    dag_id="ablate",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    default_args=DEFAULT_ARGS,
    doc_md=__doc__,
    tags=["pretrain", "ablation"],
    params={
        **run_params("model.preset=tiny"),
        "name": Param("ablation", type="string", description="the ablation's name (its folder, MLflow run)"),
        "source_stage": Param(
            "ingest", type="string", enum=["ingest", "crawl"], description="what the source is"
        ),
        "mixture": Param(
            [],
            type=["null", "array"],
            items={"type": "object"},
            description="instead of the snapshot: [{corpus, snapshots, weight, name}...] as data.mixture "
            "declares one; every selected snapshot goes through each variant, trained with these weights",
        ),
        "variants": Param(
            {"none": "preset", "rules": "preset", "rules+dedup": "preset"},
            type="object",
            description="name -> 'preset' or a list of KEY=VALUE overrides for the corpus stages",
        ),
        "base": Param(
            None, type=["null", "string"], description="the variant compared with; empty: the first"
        ),
        "seeds": Param(
            [0, 1, 2],
            type="array",
            items={"type": "integer", "minimum": 0},
            minItems=2,
            description="training seeds, at least two: the verdict's test measures noise over them",
        ),
        "control": Param(
            True,
            type="boolean",
            description="an A/A control: the base again with another data order (this ablation's noise floor)",
        ),
        "proxy": Param(
            None,
            type=["null", "array"],
            items={"type": "string"},
            description="model.*/train.* KEY=VALUE of every training; empty: the calibrated default proxy",
        ),
        "tokens": Param(200_000, type="integer", minimum=1, description="the token budget of every training"),
        "eval_points": Param(4, type="integer", minimum=1, description="held-out evaluations per training"),
        "reference": Param(None, type=["null", "string"], description="held-out reference text (JSONL/.txt)"),
        "tokenizer": Param(None, type=["null", "string"], description="a stored tokenizer; empty: train one"),
        "tasks": Param(
            [],
            type=["null", "array"],
            items={"type": "string"},
            description="lm-eval multiple-choice tasks on the workers (data cached locally), scored too",
        ),
        "task_folder": Param(None, type=["null", "string"], description="a folder of your own task YAMLs"),
    },
)
def ablate():
    @task(execution_timeout=timedelta(hours=12))
    def prepare(params=None) -> list[dict]:
        check_run_conf(get_current_context())
        return prepare_step({**params, "source": params["snapshot"]})

    @task(execution_timeout=TRAINING_TIMEOUT, max_active_tis_per_dagrun=None)
    def train_variant(training: dict, params=None) -> dict:
        return train_step({**params, "source": params["snapshot"]}, training)

    @task
    def compare(results: list[dict], params=None) -> str:
        return compare_step({**params, "source": params["snapshot"]}, list(results))

    compare(train_variant.expand(training=prepare()))


ablate()
