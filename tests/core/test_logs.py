import json
import logging

from pipeline.core.lineage import Lineage
from pipeline.core.logs import setup_logging


def test_ecs_json_lines_carry_run_fields(config):
    lineage = Lineage(dag_id="pretrain_pipeline", run_id="manual__2026", task_id="clean", try_number=3)
    log_file = setup_logging(config, "clean", rank=1, lineage=lineage)
    logging.getLogger("pipeline.test").warning("kept %d documents", 12)
    for handler in logging.getLogger().handlers:
        handler.flush()
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    record = next(line for line in lines if line["message"] == "kept 12 documents")
    assert record["log.level"] == "warning"
    assert record["ecs.version"]
    assert record["service"]["name"] == "pretrain-pipeline"
    assert record["event"]["dataset"] == "pretrain.clean"
    assert record["labels"] == {
        "component": "clean",
        "dag_id": "pretrain_pipeline",
        "run_id": "manual__2026",
        "task_id": "clean",
        "try_number": 3,
        "rank": 1,
    }
    assert log_file.parent.name == "logs"
    assert "pretrain_pipeline__manual__2026" in str(log_file)


def test_lineage_from_airflow_environment():
    env = {
        "AIRFLOW_CTX_DAG_ID": "corpus_crawl",
        "AIRFLOW_CTX_DAG_RUN_ID": "scheduled__2026-11-28T00:00:00+00:00",
        "AIRFLOW_CTX_TASK_ID": "clean",
        "AIRFLOW_CTX_TRY_NUMBER": "2",
    }
    lineage = Lineage.from_env(env)
    assert lineage.try_number == 2
    assert Lineage.from_env(lineage.to_env()) == lineage
    assert "/" not in lineage.run_folder_name and ":" not in lineage.run_folder_name
