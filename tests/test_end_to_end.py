"""The whole pipeline through the production DAGs, with Airflow's own dag.test() on the bundled tiny site.

`corpus_crawl` crawls (one mapped task per crawl shard, then the merge), cleans, deduplicates, reports on
quality and tokenizes (Spark stages through spark-submit), and announces the token
shards on the `token_shards` Asset; `pretrain` then trains on that snapshot with the typed form's values
(torchrun, 2 processes) and records the run in MLflow.
"""

import pytest
from mlflow.tracking import MlflowClient

from pipeline.config import load_config
from pipeline.core.storage import DatasetRef
from tests.conftest import make_config


@pytest.mark.slow
def test_corpus_crawl_then_pretrain_end_to_end(airflow_db, tmp_path):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from tests.dags.test_dagbag import DAGS_FOLDER

    data_root = tmp_path / "data"
    overrides = [f"project.data_root={data_root}", "spark.shuffle_partitions=4", "train.checkpoint_every=8"]
    dags = DagBag(str(DAGS_FOLDER)).dags

    ingest = dags["corpus_crawl"].test(
        run_conf={"snapshot": "e2e", "config_path": "", "overrides": overrides}
    )
    assert ingest.state == "success"
    config = make_config(data_root, *overrides[1:])
    crawl, clean, dedup, tokenize = (
        DatasetRef.of(config, stage, "e2e").manifest() for stage in ("crawl", "clean", "dedup", "tokenize")
    )
    assert crawl.counters["fetched"] >= 15
    assert clean.rows["documents"] >= 10
    assert 0 < dedup.rows["documents"] <= clean.rows["documents"]
    # tokenize reads the deduplicated, classified and decontaminated documents
    assert [i["stage"] for i in tokenize.inputs] == ["decontaminate"]
    assert tokenize.counters["tokens"]["train"] > 1000
    assert crawl.extra["shards"] and crawl.inputs[0]["stage"] == "crawl-shards"  # mapped shards, then merge
    # Nothing configured: classify and decontaminate pass dedup's documents through, the same files.
    classify, decontaminate = (
        DatasetRef.of(config, s, "e2e").manifest() for s in ("classify", "decontaminate")
    )
    assert classify.rows["documents"] == decontaminate.rows["documents"] == dedup.rows["documents"]
    documents = {k: v.sha256 for k, v in dedup.files.items() if k.startswith("documents/")}
    assert {k: v.sha256 for k, v in decontaminate.files.items() if k.startswith("documents/")} == documents
    quality = DatasetRef.of(config, "quality", "e2e").manifest()
    assert quality.inputs[0]["digest"] == decontaminate.digest
    # Lineage reaches manifests written under spark-submit too.
    assert clean.lineage == {
        "dag_id": "corpus_crawl",
        "run_id": ingest.run_id,
        "task_id": "clean",
        "try_number": 1,
    }
    with create_session() as session:
        (event,) = session.scalars(
            select(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetModel.name == "token_shards")
        ).all()
        assert event.extra["snapshot"] == "e2e"
        assert event.extra["digest"] == tokenize.digest and event.extra["overrides"] == overrides

    form = {
        "snapshot": "e2e",
        "steps": 16,
        "processes_per_node": 2,
        "preset": "tiny",
        "precision": "fp32",
        "mlflow_experiment": "e2e-form",
        "overrides": overrides,
    }
    train_run = dags["pretrain"].test(run_conf=form)
    assert train_run.state == "success"
    train, report = (DatasetRef.of(config, stage, "e2e").manifest() for stage in ("train", "report"))
    assert train.extra["final_loss"] < train.extra["first_loss"] - 0.5
    assert train.rows["steps"] == 16 and train.extra["world_size"] == 2
    assert train.lineage["dag_id"] == "pretrain" and train.lineage["run_id"] == train_run.run_id
    (resolved,) = (data_root / "_runs").glob("pretrain__*/pretrain-config.yaml")
    assert load_config(resolved, environ={}).hash == train.config_hash  # the form's values, one config file

    client = MlflowClient(report.extra["tracking_uri"])
    mlflow_run = client.get_run(report.extra["mlflow_run_id"])
    assert client.get_experiment(mlflow_run.info.experiment_id).name == "e2e-form"
    assert mlflow_run.info.status == "FINISHED"
    assert mlflow_run.data.params["train.steps"] == "16"
    assert mlflow_run.data.tags["airflow.dag_id"] == "pretrain"
    assert mlflow_run.data.tags["airflow.run_id"] == train_run.run_id
    assert mlflow_run.data.tags["airflow.try_number"] == "1"
    assert mlflow_run.data.tags["config_hash"] == train.config_hash
    losses = client.get_metric_history(mlflow_run.info.run_id, "loss")
    assert [m.step for m in losses] == list(range(1, 17))
    artifacts = {a.path for a in client.list_artifacts(mlflow_run.info.run_id)}
    assert {"config.yaml", "plots", "manifests", "tokenizer"} <= artifacts
