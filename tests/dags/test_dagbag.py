import itertools
from pathlib import Path

import pytest

DAGS_FOLDER = Path(__file__).resolve().parents[2] / "dags"


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(str(DAGS_FOLDER))


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert "pretrain_pipeline" in dagbag.dags


def test_pretrain_pipeline_structure(dagbag):
    dag = dagbag.dags["pretrain_pipeline"]
    order = ["crawl", "clean", "tokenize", "train", "report"]
    assert sorted(dag.task_ids) == sorted(order)
    for upstream, downstream in itertools.pairwise(order):
        assert dag.get_task(downstream).upstream_task_ids == {upstream}
    assert set(dag.params) >= {"snapshot", "config_path", "overrides"}
    for task in dag.tasks:
        assert task.retries >= 1 and task.execution_timeout is not None
