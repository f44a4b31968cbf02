"""A one-task DAG (the real crawl stage on the bundled sample site) that test_lineage_dag.py runs through
Airflow's ``dag.test()`` with the OpenLineage provider's file transport, in a process of its own: the provider
reads its transport once per process, so it is set here before Airflow loads it.

Usage: ``python lineage_probe_dag.py DATA_ROOT EVENTS_FILE``, from a copy of this file in the dags folder.
"""

from __future__ import annotations

import json
import os
import sys

from airflow.sdk import DAG

from operators.stage import PipelineStageOperator

with DAG(
    "lineage_probe",
    schedule=None,
    params={
        "config_path": "",
        "overrides": [
            f"project.data_root={os.environ.get('PROBE_DATA_ROOT', 'data')}",
            "logging.console=false",
            "tracking.stage_runs=false",
        ],
        "snapshot": "s1",
    },
) as dag:
    PipelineStageOperator(stage="crawl")


if __name__ == "__main__":
    os.environ["PROBE_DATA_ROOT"] = sys.argv[1]
    transport = {"type": "file", "log_file_path": sys.argv[2], "append": True}
    os.environ["AIRFLOW__OPENLINEAGE__TRANSPORT"] = json.dumps(transport)
    from airflow.dag_processing.dagbag import DagBag

    # dag.test() needs the DAG serialized from the dags folder, so it is read from there, not from __main__.
    probe = DagBag(os.path.abspath(__file__)).dags["lineage_probe"]
    print("STATE", probe.test().state)
