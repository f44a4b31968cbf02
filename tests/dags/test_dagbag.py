"""The DAG files parse, and each DAG has the shape, schedule, params and task defaults it promises."""

import copy
import itertools
from pathlib import Path

import pendulum
import pytest

DAGS_FOLDER = Path(__file__).resolve().parents[2] / "dags"
DAG_IDS = {"corpus_ingest", "pretrain", "reprocess_corpus", "pretrain_pipeline"}


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(str(DAGS_FOLDER))


def assert_chain(dag, order):
    for before, after in itertools.pairwise(order):
        assert before in dag.get_task(after).upstream_task_ids, f"{before} -> {after}"


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dags) == DAG_IDS


def test_every_task_retries_with_exponential_backoff_and_has_a_timeout(dagbag):
    for dag in dagbag.dags.values():
        for task in dag.tasks:
            where = f"{dag.dag_id}.{task.task_id}"
            assert task.execution_timeout is not None, where
            if task.task_id != "stored_crawl":  # a missing crawl does not appear by retrying
                assert task.retries >= 1 and task.retry_exponential_backoff >= 2, where


def test_form_fields_left_empty_are_accepted(dagbag):
    """The UI sends null for an empty field; optional fields must accept it or the form cannot be submitted."""
    for dag in dagbag.dags.values():
        for name in list(dag.params):
            if not dag.params.get_param(name).value:
                params = copy.deepcopy(dag.params)
                params[name] = None
                assert params.validate()[name] is None, f"{dag.dag_id}.{name}"


def test_corpus_ingest_maps_crawl_shards_then_runs_spark_stages_and_publishes_tokens(dagbag):
    from airflow.sdk.definitions.mappedoperator import MappedOperator

    from operators.assets import TOKEN_SHARDS
    from operators.corpus import CORPUS_STAGES

    dag = dagbag.dags["corpus_ingest"]
    assert dag.timetable.expression == "0 0 * * *" and not dag.catchup  # @daily: one snapshot a day
    assert_chain(dag, ["crawl_shards", "crawl", *CORPUS_STAGES, "publish_token_shards"])
    assert isinstance(dag.get_task("crawl"), MappedOperator)
    for stage in CORPUS_STAGES:
        assert type(dag.get_task(stage)).__name__ == "PipelineSparkSubmitOperator"
    assert dag.get_task("clean").input_stage == "crawl"
    assert dag.get_task("tokenize").input_stage == CORPUS_STAGES[-2]
    assert dag.get_task("publish_token_shards").outlets == [TOKEN_SHARDS]
    assert set(dag.params) == {"snapshot", "config_path", "overrides"}


def test_pretrain_is_scheduled_on_token_shards_with_a_typed_form(dagbag):
    from airflow.sdk.definitions.param import ParamValidationError

    from operators.assets import TOKEN_SHARDS
    from operators.defaults import TRAINING_TIMEOUT

    dag = dagbag.dags["pretrain"]
    assert list(dag.timetable.asset_condition.objects) == [TOKEN_SHARDS]
    assert_chain(dag, ["training_run", "train", "report"])
    train = dag.get_task("train")
    assert type(train).__name__ == "PyTorchJobOperator" and train.execution_timeout == TRAINING_TIMEOUT
    form = {
        "preset",
        "steps",
        "nodes",
        "processes_per_node",
        "launcher",
        "precision",
        "mlflow_experiment",
        "snapshot",
        "config_path",
        "overrides",
    }
    assert set(dag.params) == form
    assert dag.params.get_param("launcher").schema["enum"] == ["local", "kubernetes"]
    assert "tiny" in dag.params.get_param("preset").schema["enum"]
    dag.params.validate()  # the defaults are a valid form
    for name, value in [
        ("steps", 0),
        ("launcher", "slurm"),
        ("precision", "fp8"),
        ("nodes", "two"),
        ("preset", "huge"),
    ]:
        params = copy.deepcopy(dag.params)
        with pytest.raises(ParamValidationError):
            params[name] = value
    params = copy.deepcopy(dag.params)
    params.update({"steps": 5, "launcher": "kubernetes", "preset": "tiny", "nodes": 2, "precision": "bf16"})
    assert params.validate()["steps"] == 5


def test_reprocess_corpus_reads_stored_crawls_for_backfills(dagbag):
    from operators.corpus import CORPUS_STAGES

    dag = dagbag.dags["reprocess_corpus"]
    assert dag.timetable.expression == "0 0 * * *" and not dag.catchup  # backfills need a schedule
    assert dag.start_date <= pendulum.datetime(2021, 1, 1, tz="UTC")  # years of snapshots can be backfilled
    assert "crawl" not in dag.task_ids
    assert_chain(dag, ["stored_crawl", *CORPUS_STAGES])
    assert all(not task.outlets for task in dag.tasks)  # a backfill does not start trainings


def test_pretrain_pipeline_runs_the_same_stages_in_one_dag(dagbag):
    from operators.corpus import CORPUS_STAGES

    dag = dagbag.dags["pretrain_pipeline"]
    order = ["crawl", *CORPUS_STAGES, "train", "report"]
    assert sorted(dag.task_ids) == sorted(order)
    assert_chain(dag, order)
    assert set(dag.params) >= {"snapshot", "config_path", "overrides"}


def test_new_stages_slot_in_with_one_tuple_each():
    """What the coordinator's one-line changes produce: dedup between clean and tokenize, quality beside."""
    from airflow.sdk import DAG

    from operators.corpus import corpus_stage_tasks

    with DAG("slot_in", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")) as dag:
        corpus_stage_tasks(stages=("clean", "dedup", "tokenize"), reports=("quality",))
    assert_chain(dag, ["clean", "dedup", "tokenize"])
    assert [dag.get_task(t).input_stage for t in ("clean", "dedup", "tokenize")] == [
        "crawl",
        "clean",
        "dedup",
    ]
    quality = dag.get_task("quality")
    assert quality.upstream_task_ids == {"dedup"} and quality.extra_args == ["--input-stage", "dedup"]
    assert dag.get_task("tokenize").downstream_task_ids == set()
    assert type(quality).__name__ == "PipelineStageOperator"  # not a Spark stage: runs as `pretrain quality`
