"""Train a quality classifier, triggered by hand: the train_classifier stage, one task.

The snapshot names the model (`train_classifier/<snapshot>/model.bin`); the examples come from `classifier.*`
overrides, e.g. `classifier_training.positives=[{path: /data/reference.jsonl}]` and
`classifier_training.negatives=[{stage: dedup, snapshot: 2026-11-29}]`. The corpus DAGs then use it through
`classify.models=[{name: quality, trained: <snapshot>, top_fraction: 0.1}]`. See docs/filtering.md.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag

from operators.defaults import DEFAULT_ARGS, run_params
from operators.tasks import stage_task
from pipeline.stages import stage


@dag(
    dag_id="train_classifier",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    default_args=DEFAULT_ARGS,
    render_template_as_native_obj=True,
    doc_md=__doc__,
    tags=["pretrain", "corpus", "classifier"],
    params=run_params("classifier_training.positives=[{path: /data/reference.jsonl}]"),
)
def train_classifier():
    stage_task(stage("train_classifier"))


train_classifier()
