"""A DAG run through Airflow with the OpenLineage provider's file transport: one START and one COMPLETE per
task, whose datasets are the manifests'. The real crawl stage runs as the task's child process, which sends
nothing of its own under Airflow although a client is configured; about 30 s, most of it Airflow's start-up."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.manifest import Manifest

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_dag_run_sends_one_start_and_one_complete_per_task(tmp_path, airflow_db):
    dags = tmp_path / "dags"
    dags.mkdir()
    probe = shutil.copy(Path(__file__).with_name("lineage_probe_dag.py"), dags / "lineage_probe_dag.py")
    root, events_file = tmp_path / "data", tmp_path / "events.jsonl"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OPENLINEAGE", "AIRFLOW__OPENLINEAGE", "AIRFLOW_CTX_"))
    }
    # A client configured for the command line too: the stage's child process must still send nothing.
    (tmp_path / "openlineage.yml").write_text(
        json.dumps({"transport": {"type": "file", "log_file_path": str(events_file), "append": True}})
    )
    env.update(
        AIRFLOW__CORE__DAGS_FOLDER=str(dags),
        PYTHONPATH=str(PROJECT_ROOT),
        OPENLINEAGE_CONFIG=str(tmp_path / "openlineage.yml"),
    )
    process = subprocess.Popen(
        [sys.executable, probe, str(root), str(events_file)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 0 and "STATE success" in output, output[-3000:]

    events = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]
    by_task = [(e["eventType"], e["job"]["name"]) for e in events if e["job"]["name"] != "lineage_probe"]
    assert by_task == [("START", "lineage_probe.crawl"), ("COMPLETE", "lineage_probe.crawl")]
    start, complete = (e for e in events if e["job"]["name"] == "lineage_probe.crawl")
    assert start["run"]["runId"] == complete["run"]["runId"]

    manifest = Manifest.read(root / "sample" / "crawl" / "s1" / "manifest.json")
    expected = ("file", str((root / "sample" / "crawl").absolute()))
    for event in (start, complete):
        assert [(d["namespace"], d["name"]) for d in event["outputs"]] == [expected]
        assert event["inputs"] == []  # crawl reads no stage
    (output,) = complete["outputs"]
    assert output["facets"]["version"]["datasetVersion"] == manifest.digest
    assert output["facets"]["pretrain_snapshot"]["rows"] == manifest.rows
    statistics = output["outputFacets"]["outputStatistics"]
    assert (statistics["size"], statistics["fileCount"]) == (manifest.bytes, len(manifest.files))
    assert complete["run"]["facets"]["pretrain_run"]["config_hash"] == manifest.config_hash
    assert complete["run"]["facets"]["pretrain_run"]["airflow"]["dag_id"] == "lineage_probe"
