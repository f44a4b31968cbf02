"""The whole walking pipeline through Airflow's own dag.test(): crawl -> clean -> tokenize -> train -> report."""

import pytest
from mlflow.tracking import MlflowClient

from pipeline.core.storage import DatasetRef
from tests.conftest import make_config


@pytest.mark.slow
def test_pretrain_pipeline_dag_end_to_end(airflow_db, tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    from tests.dags.test_dagbag import DAGS_FOLDER

    data_root = tmp_path / "data"
    overrides = [f"project.data_root={data_root}", "train.steps=16", "train.checkpoint_every=8"]
    dag = DagBag(str(DAGS_FOLDER)).dags["pretrain_pipeline"]
    run = dag.test(run_conf={"snapshot": "e2e", "config_path": "", "overrides": overrides})
    assert run.state == "success"

    config = make_config(data_root, *overrides[1:])
    crawl, clean, tokenize, train, report = (
        DatasetRef.of(config, stage, "e2e").manifest()
        for stage in ("crawl", "clean", "tokenize", "train", "report")
    )
    assert crawl.counters["fetched"] >= 15
    assert clean.rows["documents"] >= 10
    assert tokenize.counters["tokens"]["train"] > 1000
    assert train.extra["final_loss"] < train.extra["first_loss"] - 0.5
    assert train.lineage["dag_id"] == "pretrain_pipeline" and train.lineage["run_id"] == run.run_id

    client = MlflowClient(report.extra["tracking_uri"])
    mlflow_run = client.get_run(report.extra["mlflow_run_id"])
    assert mlflow_run.info.status == "FINISHED"
    assert mlflow_run.data.params["train.steps"] == "16"
    assert mlflow_run.data.tags["airflow.dag_id"] == "pretrain_pipeline"
    assert mlflow_run.data.tags["config_hash"] == train.config_hash
    losses = client.get_metric_history(mlflow_run.info.run_id, "loss")
    assert [m.step for m in losses] == list(range(1, 17))
    artifacts = {a.path for a in client.list_artifacts(mlflow_run.info.run_id)}
    assert {"config.yaml", "plots", "manifests", "tokenizer"} <= artifacts
