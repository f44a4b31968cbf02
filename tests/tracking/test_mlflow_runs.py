"""Per-stage MLflow runs through the real ``stage_main`` and a real MLflow SQLite store.

The stages here are small functions that publish a real StageOutput, so each test runs in seconds;
the real stages and a real ``mlflow server`` are exercised in test_mlflow_server.py.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlflow.tracking import MlflowClient

from pipeline.config import load_config
from pipeline.core.manifest import Manifest
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.entrypoint import stage_main
from pipeline.stages import stage as registered_stage
from pipeline.tracking import mlflow_runs
from pipeline.tracking.mlflow_runs import (
    ENV_RUN_ID,
    PARENT_TAG,
    TrackingError,
    experiment_name,
    manifest_metrics,
    registered_model_name,
    tracking_uri,
)


def publish(rows: int, seed: int):
    """A stage body: writes random bytes and counts, like a data stage."""

    def run(config, inputs, output):
        rng = random.Random(seed)
        with StageOutput(output, config, inputs) as out:
            (out.path / "part-0.bin").write_bytes(rng.randbytes(rng.randint(1, 4096)))
            return out.commit(
                rows={"documents": rows},
                counters={"kept": rows, "dropped": {"too_short": seed % 7, "lang": seed % 3}, "note": "x"},
            )

    return run


def fail(config, inputs, output):
    raise RuntimeError("stage broke")


def airflow_env(monkeypatch, dag_id, run_id, task_id, try_number=1):
    monkeypatch.setenv("AIRFLOW_CTX_DAG_ID", dag_id)
    monkeypatch.setenv("AIRFLOW_CTX_DAG_RUN_ID", run_id)
    monkeypatch.setenv("AIRFLOW_CTX_TASK_ID", task_id)
    monkeypatch.setenv("AIRFLOW_CTX_TRY_NUMBER", str(try_number))


@pytest.fixture
def root(tmp_path, monkeypatch):
    # Airflow's dag.test() (the end-to-end test) leaves AIRFLOW_CTX_* in this process's environment.
    for name in (
        "MLFLOW_TRACKING_URI",
        ENV_RUN_ID,
        *(f"AIRFLOW_CTX_{k}" for k in ("DAG_ID", "DAG_RUN_ID", "TASK_ID", "TRY_NUMBER")),
    ):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "data"


@pytest.fixture
def argv(root, mlflow_store, experiment):
    """CLI arguments for a stage on this test's data root, recording into the shared store."""

    def build(snapshot, *extra):
        settings_ = [
            f"project.data_root={root}",
            "logging.console=false",
            f"tracking.mlflow_tracking_uri={mlflow_store}",
            f"tracking.experiment={experiment}",
        ]
        return ["--snapshot", snapshot, *[arg for item in settings_ for arg in ("--set", item)], *extra]

    return build


def experiment_runs(store, experiment):
    client = MlflowClient(store)
    return client, client.get_experiment_by_name(experiment)


def runs_by_stage(client, experiment_id):
    runs = client.search_runs([experiment_id], max_results=1000)
    return {
        (run.data.tags.get("pretrain.stage"), run.data.tags.get("airflow.run_id")): run
        for run in runs
        if run.data.tags.get("pretrain.kind") == "stage"
    }


def test_stage_runs_nest_under_their_dag_run_and_log_manifests_as_datasets(
    root, argv, mlflow_store, experiment, monkeypatch
):
    run_a = "manual__2026-11-28T00:00:00+00:00"
    run_b = "scheduled__2026-11-29T00:00:00+00:00"
    airflow_env(monkeypatch, "pretrain_pipeline", run_a, "crawl")
    assert stage_main(argv("s1"), stage="crawl", description="", run=publish(5, 11)) == 0
    airflow_env(monkeypatch, "pretrain_pipeline", run_a, "clean", try_number=2)
    assert stage_main(argv("s1"), stage="clean", description="", run=publish(3, 12)) == 0
    airflow_env(monkeypatch, "pretrain_pipeline", run_b, "crawl")
    assert stage_main(argv("s2"), stage="crawl", description="", run=publish(4, 13)) == 0

    config = load_config(None, argv("s1")[3::2], environ={})
    client, found = experiment_runs(mlflow_store, experiment)
    stages = runs_by_stage(client, found.experiment_id)
    assert set(stages) == {("crawl", run_a), ("clean", run_a), ("crawl", run_b)}
    parents = {
        run.data.tags["airflow.run_id"]: run
        for run in client.search_runs([found.experiment_id])
        if run.data.tags.get("pretrain.kind") == "dag_run"
    }
    assert set(parents) == {run_a, run_b}
    for (_, dag_run), run in stages.items():
        assert run.data.tags[PARENT_TAG] == parents[dag_run].info.run_id
        assert run.info.status == "FINISHED"
        assert run.data.tags["airflow.dag_id"] == "pretrain_pipeline"
        assert run.data.tags["config_hash"] == config.hash
        assert run.data.tags["git_commit"]
    beta = stages[("clean", run_a)]
    assert beta.data.tags["airflow.try_number"] == "2" and beta.data.tags["airflow.task_id"] == "clean"
    assert beta.info.run_name == "clean s1 (try 2)"

    # Params: the whole flattened config, JSON for non-strings.
    expected = {k: v if isinstance(v, str) else json.dumps(v) for k, v in config.flat().items()}
    assert beta.data.params == expected

    # Datasets: alpha's output is beta's input, with the manifest digest; counts became metrics.
    alpha_manifest = DatasetRef.of(config, "crawl", "s1").manifest()
    beta_manifest = DatasetRef.of(config, "clean", "s1").manifest()
    by_context = {
        (d.tags[0].value if d.tags[0].key == "mlflow.data.context" else d.tags[1].value): d.dataset
        for d in beta.inputs.dataset_inputs
    }
    assert by_context["input"].digest == alpha_manifest.digest
    assert by_context["input"].name == "sample/crawl/s1"
    assert json.loads(by_context["input"].source)["uri"] == alpha_manifest.path
    assert json.loads(by_context["input"].profile)["rows"] == {"documents": 5}
    assert by_context["output"].digest == beta_manifest.digest
    alpha_inputs = stages[("crawl", run_a)].inputs.dataset_inputs
    assert [d.dataset.digest for d in alpha_inputs] == [alpha_manifest.digest]
    assert beta.data.metrics["rows.documents"] == 3
    assert beta.data.metrics["counters.dropped.too_short"] == 12 % 7
    assert beta.data.tags["pretrain.output_digest"] == beta_manifest.digest
    assert [a.path for a in client.list_artifacts(beta.info.run_id, "manifests/clean")] == [
        "manifests/clean/manifest.json"
    ]
    assert "config.yaml" in {a.path for a in client.list_artifacts(beta.info.run_id)}
    assert parents[run_a].info.status == "FINISHED"


def test_outside_airflow_stages_of_a_snapshot_share_a_parent(argv, mlflow_store, experiment):
    stage_main(argv("hand"), stage="crawl", description="", run=publish(2, 1))
    stage_main(argv("hand"), stage="clean", description="", run=publish(2, 2))
    client, found = experiment_runs(mlflow_store, experiment)
    runs = client.search_runs([found.experiment_id])
    parents = [r for r in runs if r.data.tags.get("pretrain.kind") == "snapshot"]
    children = [r for r in runs if r.data.tags.get("pretrain.kind") == "stage"]
    assert len(parents) == 1 and parents[0].data.tags["pretrain.snapshot"] == "hand"
    assert len(children) == 2 and {c.data.tags[PARENT_TAG] for c in children} == {parents[0].info.run_id}
    assert not any(key.startswith("airflow.") for c in children for key in c.data.tags)


def publish_report(config, inputs, output):
    """A report-like stage body: a page, plots and figures in ``extra["metrics"]``."""
    with StageOutput(output, config, inputs) as out:
        (out.path / "report.html").write_text("<html></html>")
        (out.path / "metrics.json").write_text("{}")
        (out.path / "plots").mkdir()
        (out.path / "plots" / "trend.png").write_bytes(b"png")
        (out.path / "not-an-artifact.bin").write_bytes(b"x")
        return out.commit(
            rows={"documents": 2}, extra={"metrics": {"self_bleu": 12.5, "languages": {"en": 2}}}
        )


def test_a_stage_run_keeps_the_registry_artifacts_and_the_reported_metrics(argv, mlflow_store, experiment):
    for stage in ("crawl", "clean", "dedup", "classify", "decontaminate"):
        stage_main(argv("art"), stage=stage, description="", run=publish(2, 1))
    stage_main(argv("art"), stage="quality", description="", run=publish_report)
    client, found = experiment_runs(mlflow_store, experiment)
    (run,) = [r for (stage, _), r in runs_by_stage(client, found.experiment_id).items() if stage == "quality"]
    top = {a.path for a in client.list_artifacts(run.info.run_id, "quality")}
    assert top == {"quality/report.html", "quality/metrics.json", "quality/plots"}
    assert [a.path for a in client.list_artifacts(run.info.run_id, "quality/plots")] == [
        "quality/plots/trend.png"
    ]
    assert run.data.metrics["metrics.self_bleu"] == 12.5
    assert run.data.metrics["metrics.languages.en"] == 2


def test_a_failing_stage_is_reraised_and_its_run_marked_failed(argv, mlflow_store, experiment, monkeypatch):
    airflow_env(monkeypatch, "pretrain_pipeline", "r1", "crawl")
    with pytest.raises(RuntimeError, match="stage broke"):
        stage_main(argv("s1"), stage="crawl", description="", run=fail)
    client, found = experiment_runs(mlflow_store, experiment)
    (run,) = runs_by_stage(client, found.experiment_id).values()
    assert run.info.status == "FAILED"
    parent = client.get_run(run.data.tags[PARENT_TAG])
    assert parent.info.status == "FAILED"


@pytest.fixture
def unreachable_server(monkeypatch):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    return f"http://127.0.0.1:{port}"


def test_tracking_failure_warns_and_the_stage_still_publishes(root, argv, unreachable_server, caplog, capsys):
    with caplog.at_level(logging.ERROR, logger="pipeline.tracking.mlflow_runs"):
        code = stage_main(
            argv("s1", "--set", f"tracking.mlflow_tracking_uri={unreachable_server}"),
            stage="crawl",
            description="",
            run=publish(2, 3),
        )
    assert code == 0
    config = load_config(None, [f"project.data_root={root}"], environ={})
    assert DatasetRef.of(config, "crawl", "s1").is_complete()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("MLflow tracking of stage 'crawl'" in m and "tracking.required=true" in m for m in errors)
    assert "MLflow tracking of stage 'crawl'" in capsys.readouterr().err


def test_required_tracking_fails_the_stage_before_it_runs(argv, unreachable_server):
    ran = []
    with pytest.raises(TrackingError, match=r"tracking\.required=true"):
        stage_main(
            argv(
                "s1",
                "--set",
                f"tracking.mlflow_tracking_uri={unreachable_server}",
                "--set",
                "tracking.required=true",
            ),
            stage="crawl",
            description="",
            run=lambda *args: ran.append(args),
        )
    assert ran == []


def test_stage_runs_can_be_switched_off(argv, mlflow_store, experiment):
    stage_main(
        argv("s1", "--set", "tracking.stage_runs=false"),
        stage="crawl",
        description="",
        run=publish(1, 1),
    )
    assert MlflowClient(mlflow_store).get_experiment_by_name(experiment) is None


def test_the_stage_run_id_is_handed_to_child_processes_only_while_the_stage_runs(root, argv, mlflow_store):
    """Training's ranks log into the launcher's run, so a torchrun stage starts its run before its work."""
    config = load_config(None, argv("s1")[3::2], environ={})
    assert registered_stage("train").runner == "torchrun"
    with mlflow_runs.track_stage(config, "train", "s1", [], background=False):
        handed = os.environ.get(ENV_RUN_ID)
    run_record = MlflowClient(mlflow_store).get_run(handed)
    assert run_record.data.tags["pretrain.stage"] == "train"
    assert ENV_RUN_ID not in os.environ


def test_a_stage_works_while_its_run_starts_and_its_manifest_still_names_the_run(
    root, argv, mlflow_store, monkeypatch
):
    """Importing MLflow and opening its store take seconds, as long as a small stage's whole work: the run
    starts beside the work (issue 44). The start here waits for the work to begin, so a start that ran
    before the work would time out and leave the manifest without a run."""
    work_began = threading.Event()
    start = mlflow_runs.TrackedRun.start_stage_run.__func__

    def start_once_the_work_began(cls, *args, **kwargs):
        if not work_began.wait(timeout=300):
            raise AssertionError("the run's start was waited for before the stage's work began")
        return start(cls, *args, **kwargs)

    monkeypatch.setattr(mlflow_runs.TrackedRun, "start_stage_run", classmethod(start_once_the_work_began))

    def run(config, inputs, output):
        work_began.set()
        assert ENV_RUN_ID not in os.environ  # not started yet: nothing may read it before it settles
        return publish(2, 3)(config, inputs, output)

    assert stage_main(argv("s4"), stage="crawl", description="", run=run) == 0
    config = load_config(None, [f"project.data_root={root}"], environ={})
    tracking = DatasetRef.of(config, "crawl", "s4").manifest().tracking
    assert set(tracking) == {"mlflow_run_id"}
    run_record = MlflowClient(mlflow_store).get_run(tracking["mlflow_run_id"])
    assert run_record.data.tags["pretrain.stage"] == "crawl" and run_record.info.status == "FINISHED"
    assert run_record.data.metrics["rows.documents"] == 2
    assert ENV_RUN_ID not in os.environ


def test_concurrent_stages_of_one_dag_run_converge_on_one_parent(argv):
    config = load_config(None, argv("s")[3::2], environ={})
    lineage = mlflow_runs.Lineage("dag", "run-1", "mapped_task", 1)
    started, errors, barrier = [], [], threading.Barrier(4)

    def stage(index):
        try:
            barrier.wait(timeout=120)
            run = mlflow_runs.TrackedRun.start_stage_run(config, f"crawl{index}", "s", lineage=lineage)
            started.append(run)
            barrier.wait(timeout=120)  # all have picked a parent before any finishes
            run.finish()
        except Exception as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=stage, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    client = started[0].client
    key = mlflow_runs.parent_spec(config, "s", lineage)[0]
    (parent,) = mlflow_runs.search_runs(client, started[0].experiment_id, {mlflow_runs.TAG_PARENT_KEY: key})
    children = mlflow_runs.search_runs(client, started[0].experiment_id, {PARENT_TAG: parent.info.run_id})
    assert sorted(c.data.tags["pretrain.stage"] for c in children) == [f"crawl{i}" for i in range(4)]


def test_default_store_experiment_and_model_names(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = load_config(None, [f"project.data_root={tmp_path}"], environ={})
    assert tracking_uri(config) == f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    assert tracking_uri(config) == "http://mlflow.example:5000"
    configured = load_config(None, ["tracking.mlflow_tracking_uri=http://other:5000"], environ={})
    assert tracking_uri(configured) == "http://other:5000"
    assert experiment_name(config) == "pretrain-sample-tiny"
    base = load_config(None, ["project.corpus=web", "model.preset=base"], environ={})
    assert experiment_name(base) == "pretrain-web-base" and registered_model_name(base) == "pretrain-web-base"
    assert registered_model_name(load_config(None, ["tracking.register_model=false"], environ={})) is None
    assert (
        registered_model_name(load_config(None, ["tracking.registered_model=gpt-web"], environ={}))
        == "gpt-web"
    )


counter_trees = st.recursive(
    st.one_of(
        st.integers(-(10**9), 10**9), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=3)
    ),
    lambda children: st.dictionaries(st.text("abc_ ü", min_size=1, max_size=4), children, max_size=3),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.dictionaries(st.sampled_from(["documents", "excluded", "train"]), st.integers(0, 10**6)),
    counters=st.dictionaries(st.text("xyz.", min_size=1, max_size=3), counter_trees, max_size=4),
    reported=st.dictionaries(st.text("mn", min_size=1, max_size=3), counter_trees, max_size=3),
)
def test_manifest_metrics_flatten_every_number_and_nothing_else(rows, counters, reported):
    extra = {"metrics": reported, "gate": {"passed": 1}}  # only extra["metrics"] is read
    manifest = Manifest("s", "c", "snap", "/p", "h", "v", rows=rows, counters=counters, extra=extra)
    expected = {"bytes": 0.0, "duration_s": 0.0}

    def reference(prefix, value):  # written from the spec: numbers (not bools) at any depth, dotted keys
        if isinstance(value, dict):
            for key in value:
                reference(prefix + "." + key, value[key])
        elif type(value) in (int, float):
            safe = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "_.-/ :") else "_" for ch in prefix)
            expected[safe] = float(value)

    reference("rows", rows)
    reference("counters", counters)
    reference("metrics", reported)
    assert manifest_metrics(manifest) == expected


FIRST_RUN = """
import sys
from pipeline.config import load_config
from pipeline.tracking.mlflow_runs import TrackedRun
config = load_config(None, [f"project.data_root={sys.argv[1]}", "logging.console=false"], environ={})
run = TrackedRun.start_stage_run(config, "train", "s1")
run.finish()
print(run.run_id)
"""


@pytest.mark.slow
def test_first_runs_started_at_once_on_a_new_store_all_get_their_run(tmp_path):
    """Two trainings of one snapshot started at once on a new data root: the second lost its MLflow run
    (`Online migration expected to match one row`, SQLite store). The store is now created under a lock."""
    import subprocess
    import sys

    root = tmp_path / "data"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("MLFLOW_", "PRETRAIN_"))}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", FIRST_RUN, str(root)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(4)
    ]
    outcomes = [process.communicate(timeout=600) for process in processes]
    for process, (_, err) in zip(processes, outcomes, strict=True):
        assert process.returncode == 0, err[-3000:]
    assert len({out.strip() for out, _ in outcomes}) == 4


def test_a_tracking_failure_is_recorded_in_the_published_manifest(root, argv, unreachable_server):
    """It was logged at ERROR while the stage carried on; nothing in the stage's result said so."""
    code = stage_main(
        argv("s1", "--set", f"tracking.mlflow_tracking_uri={unreachable_server}"),
        stage="crawl",
        description="",
        run=publish(2, 3),
    )
    assert code == 0
    config = load_config(None, [f"project.data_root={root}"], environ={})
    tracking = DatasetRef.of(config, "crawl", "s1").manifest().tracking
    assert tracking["error"].startswith("failed while starting the run: ") and "mlflow_run_id" not in tracking
    assert "PRETRAIN_MLFLOW_ERROR" not in os.environ  # the stage is over


def test_a_tracked_stage_names_its_mlflow_run_in_the_manifest(root, argv, mlflow_store, experiment):
    stage_main(argv("s2"), stage="crawl", description="", run=publish(2, 3))
    config = load_config(None, [f"project.data_root={root}"], environ={})
    tracking = DatasetRef.of(config, "crawl", "s2").manifest().tracking
    assert set(tracking) == {"mlflow_run_id"} and len(tracking["mlflow_run_id"]) == 32
