"""`pretrain demo`'s terminal output: one line per task as it ends, read from Airflow's own `dags test` output
and the stage's manifest, while Airflow's logging goes to a file.

The whole demo takes minutes, so the suite does not run it: the line reader runs on the pinned Airflow's
real `airflow dags test` output for a two-task DAG (one task fails), whose tasks are named after stages whose
outputs are published for real, so each line's counts can be checked against the manifest.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from pipeline import demo
from pipeline.core.proc import run_streaming
from pipeline.core.storage import DatasetRef, StageOutput
from tests.conftest import make_config
from tests.quality.test_card import SNAPSHOT, publish_chain

TWO_TASKS = """
import pendulum
from airflow.sdk import dag, task


@dag(dag_id="demo_lines", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False,
     default_args={"retries": 0})
def demo_lines():
    @task(task_id="clean")
    def clean():
        return 1

    @task(task_id="dedup")
    def dedup(value):
        raise RuntimeError("planted failure")

    dedup(clean())


demo_lines()
"""


def test_kept_reads_rows_drops_and_tokens_from_the_manifest(tmp_path):
    config = make_config(tmp_path / "data")
    clean = publish_chain(config, through="clean")["clean"].manifest()
    line = demo.kept(clean)
    assert f"{clean.rows['documents']} documents" in line and f"{clean.rows['excluded']} excluded" in line
    total = sum(clean.counters["dropped"].values())
    assert f"dropped {total} (language.not_kept 7, c4.min_num_sentences 5, fineweb.empty 3)" in line


def test_a_report_line_names_its_page_and_an_old_output_is_not_taken_for_this_runs(tmp_path):
    config = make_config(tmp_path / "data")
    since = time.time() - 1
    ref = DatasetRef.of(config, "quality", SNAPSHOT)
    with StageOutput(ref, config, []) as out:
        (out.path / "report.html").write_text("<html></html>")
        out.commit(rows={"sample": 12}, counters={})
    done = demo.TaskFinished("quality", "success", 3.25)
    line = demo.task_line(config, SNAPSHOT, done, since)
    assert line.split()[:3] == ["quality", "3.2", "s"]
    assert line.endswith(f"12 sample; {ref.path / 'report.html'}")
    assert "no new output" in demo.task_line(config, SNAPSHOT, done, time.time() + 60)
    missing = demo.task_line(config, "another", done, since)
    assert "no new output" in missing


@pytest.mark.slow
def test_one_line_per_task_from_airflows_own_dag_test_output(airflow_db, tmp_path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "demo_lines.py").write_text(TWO_TASKS)
    env = demo.airflow_environment(airflow_db)
    env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags)
    config = make_config(tmp_path / "data")
    since = time.time() - 1
    clean = publish_chain(config, through="clean")["clean"]
    printed: list[str] = []
    raw: list[str] = []
    progress = demo.TaskProgress(lambda done: printed.append(demo.task_line(config, SNAPSHOT, done, since)))

    def on_line(line: str) -> None:
        raw.append(line)
        progress.feed(line)

    run_streaming(
        [demo.airflow_executable(), "dags", "test", "demo_lines", "--conf", json.dumps({})],
        env=env,
        on_line=on_line,
        check=False,
    )
    finished = [(done.task, done.state) for done in progress.finished]
    assert finished == [("clean", "success"), ("dedup", "failed")], "\n".join(raw[-40:])
    assert all(d.seconds >= 0 for d in progress.finished)
    assert len(printed) == 2
    assert re.match(r"^\s+clean\s+\d+\.\d s\s+", printed[0])
    assert demo.kept(clean.manifest()) in printed[0]
    assert re.match(r"^\s+dedup\s+\d+\.\d s\s+FAILED \(see the Airflow log\)$", printed[1])


def test_a_report_manifest_with_only_a_final_loss_gets_its_line(tmp_path):
    """The report stage records the final loss without the first one (the demo's first full run crashed here)."""
    config = make_config(tmp_path / "data")
    ref = DatasetRef.of(config, "dedup", SNAPSHOT)
    with StageOutput(ref, config, []) as out:
        out.commit(rows={}, counters={}, extra={"final_loss": 4.73})
    assert demo.kept(ref.manifest()) == "loss 4.730"


def test_a_summary_that_fails_is_reported_and_the_reader_goes_on(capsys):
    def broken(done):
        raise KeyError("first_loss")

    progress = demo.TaskProgress(broken)
    for line in (
        "2026-12-05T11:36:34.786893Z [info ] [DAG TEST] starting task_id=train map_index=-1 [x]",
        "2026-12-05T11:36:40.0Z [info ] Task instance state updated [x] new_state=success rows_affected=1",
        "2026-12-05T11:36:44.786893Z [info ] [DAG TEST] end task task_id=train map_index=-1 [x]",
        "2026-12-05T11:36:44.8Z [info ] [DAG TEST] starting task_id=export map_index=-1 [x]",
        "2026-12-05T11:36:45.8Z [info ] [DAG TEST] end task task_id=export map_index=-1 [x]",
    ):
        progress.feed(line)
    assert [(d.task, d.state, d.seconds) for d in progress.finished] == [
        ("train", "success", 10.0),
        ("export", "unknown", 1.0),
    ]
    assert "train: success (KeyError" in capsys.readouterr().out
