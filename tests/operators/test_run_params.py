"""A DAG run's params reach the stages as they were typed: snapshot names stay strings under native
rendering, and a misspelt conf key fails the run's first task instead of being ignored."""

from types import SimpleNamespace

import pendulum
import pytest
from airflow.sdk import DAG, Param
from airflow.sdk.exceptions import AirflowFailException

from operators.defaults import check_run_conf, run_params, run_snapshot
from operators.stage import PipelineStageOperator


def native_dag_with_a_stage_task():
    params = {**run_params("train.steps=3"), "steps": Param(None, type=["null", "integer"])}
    with DAG(
        "native",
        schedule=None,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        render_template_as_native_obj=True,  # as every DAG of ours renders
        params=params,
    ) as dag:
        task = PipelineStageOperator(stage="clean")
    return dag, task


def context_for(dag, conf):
    params = {"snapshot": None, "config_path": None, "overrides": [], "steps": None, **conf}
    return {"params": params, "ds": "2026-12-01", "dag": dag, "dag_run": SimpleNamespace(conf=conf)}


@pytest.mark.parametrize("snapshot", ["20261201", "1e3", "None", "007", "2026-12-01"])
def test_a_numeric_looking_snapshot_reaches_the_stage_as_the_same_string(snapshot):
    dag, task = native_dag_with_a_stage_task()
    context = context_for(dag, {"snapshot": snapshot})
    task.render_template_fields(context)
    task.pre_execute(context)
    assert task.snapshot == snapshot
    assert task.cli_arguments()[:2] == ["--snapshot", snapshot]


def test_without_a_snapshot_param_the_logical_date_is_the_snapshot():
    dag, task = native_dag_with_a_stage_task()
    context = context_for(dag, {})
    task.render_template_fields(context)
    task.pre_execute(context)
    assert task.snapshot == "2026-12-01"
    with pytest.raises(AirflowFailException, match="no logical date"):
        run_snapshot({"snapshot": None}, None)


def test_a_misspelt_conf_key_fails_the_task_with_the_clis_wording():
    dag, task = native_dag_with_a_stage_task()
    context = context_for(dag, {"stpes": 10})
    with pytest.raises(AirflowFailException, match=r"unknown key 'stpes'; did you mean 'steps'\?"):
        task.pre_execute(context)
    check_run_conf(context_for(dag, {"steps": 10, "snapshot": "s"}))  # known keys pass
