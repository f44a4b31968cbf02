"""The DAGs under a real Airflow: api-server, scheduler, dag-processor and triggerer on 127.0.0.1 (SQLite).

One Airflow serves the whole module. Runs are started the way users start them: `pretrain` through the REST
API with form values, and by an event on its Asset; `reprocess_corpus` with `airflow backfill create`. A
train task is killed by marking it failed through the REST API, as a user does in the UI. The quality gate
holds a snapshot's token shards back in a `corpus_from_files` run.
"""

import json
import shutil
import urllib.request

import psutil
import pytest

from operators.tasks import corpus_stages
from operators.training import CONFIG_FILE
from pipeline.config import load_config
from pipeline.core.manifest import MANIFEST_NAME, Manifest, write_published
from pipeline.core.storage import DatasetRef
from tests.conftest import make_config
from tests.dags.airflow_server import LocalAirflow

# A backfill test took ~15 min at load 5-9 on 2 cores (pytest-timeout's 900 s ended it): limits are sized
# for a machine three times slower than an idle one, and the waits below are guards against a hang
# (each polls the state it waits for), not speed checks.
HANG_S = 2400
pytestmark = [pytest.mark.slow, pytest.mark.timeout(HANG_S + 300)]
DATES = ("2026-03-01", "2026-03-02")


@pytest.fixture(scope="module")
def airflow(tmp_path_factory, spark_connect):
    """The stage tasks attach to the session's warm Spark Connect server, as a deployment's workers do with
    ``PRETRAIN__SPARK__REMOTE`` (docs/airflow.md): a task then starts no Spark of its own."""
    home = tmp_path_factory.mktemp("airflow-server")
    data_root = home / "data"
    env = {
        "PRETRAIN__PROJECT__DATA_ROOT": str(data_root),
        "PRETRAIN__SPARK__REMOTE": spark_connect.url,
        "PRETRAIN__SPARK__SHUFFLE_PARTITIONS": "4",
        "PRETRAIN__LOGGING__CONSOLE": "true",
    }
    server = LocalAirflow(home, env, data_root=data_root)
    try:
        server.start()
        server.wait_for_dags("pretrain", "reprocess_corpus")
        yield server
    except BaseException:
        for component in ("api-server", "scheduler", "dag-processor", "triggerer"):
            print(f"---- {component} ----\n{server.log_tail(component)}")
        raise
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def cancel_what_the_test_started(request):
    """After each test, passed or failed: its backfills cancelled, its unfinished DAG runs failed and their
    tasks stopped, so that one slow test cannot fail the next."""
    yield
    if "airflow" in request.fixturenames:
        request.getfixturevalue("airflow").cancel_everything()


def publish_copy(config, snapshot, stage, root, new_snapshot):
    """Place a stage output from the session's sample corpus under another data root and snapshot."""
    target = root / config.project.corpus / stage / new_snapshot
    shutil.copytree(DatasetRef.of(config, stage, snapshot).path, target)
    manifest = Manifest.read(target / MANIFEST_NAME)
    manifest.snapshot, manifest.path = new_snapshot, str(target)
    write_published(target, manifest)


def config_of(airflow):
    return make_config(airflow.data_root, "spark.shuffle_partitions=4")


def run_path(run_id: str) -> str:
    return urllib.request.quote(run_id)


def test_every_component_listens_on_loopback_only_and_sqlite_runs_in_wal_mode(airflow):
    """`make airflow` used to open the scheduler's and triggerer's log servers on 0.0.0.0 (8793, 8794)."""
    import sqlite3

    listening = []
    for process in airflow.processes.values():
        for member in [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]:
            try:
                connections = member.net_connections(kind="inet")
                name = member.name()
            except psutil.NoSuchProcess:
                continue  # a short-lived child that ended after it was listed listens on nothing
            for connection in connections:
                if connection.status == psutil.CONN_LISTEN:
                    listening.append((name, connection.laddr.ip, connection.laddr.port))
    assert any(port == airflow.port for _, _, port in listening), listening
    assert all(ip in ("127.0.0.1", "::1") for _, ip, _ in listening), listening
    with sqlite3.connect(airflow.home / "airflow.db") as database:
        assert database.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_trigger_pretrain_through_the_rest_api_with_a_form(airflow, sample_corpus):
    corpus_config, snapshot = sample_corpus
    publish_copy(corpus_config, snapshot, "tokenize", airflow.data_root, "rest")
    airflow.unpause("pretrain")

    status, answer = airflow.request_error(
        "POST", "/api/v2/dags/pretrain/dagRuns", {"logical_date": None, "conf": {"launcher": "slurm"}}
    )
    assert status == 400 and "launcher" in answer["detail"]  # the form's schema is enforced by the API

    form = {
        "snapshot": "rest",
        "steps": 6,
        "processes_per_node": 1,
        "preset": "tiny",
        "precision": "fp32",
        "mlflow_experiment": "rest-form",
        "launcher": "local",
    }
    run_id = airflow.trigger("pretrain", form)
    assert airflow.wait_for_run("pretrain", run_id) == "success", airflow.task_instances("pretrain", run_id)

    # XCom holds a path and ids, never data.
    xcom = airflow.request(
        "GET",
        f"/api/v2/dags/pretrain/dagRuns/{run_path(run_id)}/taskInstances/training_run/xcomEntries/return_value",
    )
    resolved = xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
    assert set(resolved) == {"snapshot", "config_path"} and resolved["snapshot"] == "rest"
    assert resolved["config_path"].endswith(CONFIG_FILE)
    trained_with = load_config(resolved["config_path"], environ={})
    assert (trained_with.train.steps, trained_with.train.nproc_per_node) == (6, 1)
    assert trained_with.tracking.experiment == "rest-form" and trained_with.model.preset == "tiny"

    config = config_of(airflow)
    train = DatasetRef.of(config, "train", "rest").manifest()
    assert train.config_hash == trained_with.hash  # the form reached training
    assert train.rows["steps"] == 6 and train.extra["world_size"] == 1
    assert train.lineage == {"dag_id": "pretrain", "run_id": run_id, "task_id": "train", "try_number": 1}
    report = DatasetRef.of(config, "report", "rest").manifest()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(report.extra["tracking_uri"])
    mlflow_run = client.get_run(report.extra["mlflow_run_id"])
    assert client.get_experiment(mlflow_run.info.experiment_id).name == "rest-form"
    assert mlflow_run.data.tags["airflow.run_id"] == run_id


def test_a_misspelt_conf_key_fails_the_run_at_its_first_task(airflow):
    """`{"conf": {"stpes": 10}}` used to be accepted and train the default 40 steps."""
    airflow.unpause("pretrain")
    run_id = airflow.trigger("pretrain", {"snapshot": "typo", "stpes": 10})
    assert airflow.wait_for_run("pretrain", run_id) == "failed"
    tasks = airflow.task_instances("pretrain", run_id)
    assert tasks["training_run"]["state"] == "failed" and tasks["training_run"]["try_number"] == 1
    assert tasks["train"]["state"] == "upstream_failed"


def test_an_event_on_the_token_shards_asset_schedules_pretrain(airflow, sample_corpus):
    corpus_config, snapshot = sample_corpus
    publish_copy(corpus_config, snapshot, "tokenize", airflow.data_root, "asset")
    airflow.unpause("pretrain")
    (asset,) = airflow.request("GET", "/api/v2/assets?name_pattern=token_shards")["assets"]
    extra = {"snapshot": "asset", "overrides": ["train.steps=3", "train.nproc_per_node=1"], "config_path": ""}
    airflow.request("POST", "/api/v2/assets/events", {"asset_id": asset["id"], "extra": extra})

    def asset_triggered_run():
        runs = airflow.request("GET", "/api/v2/dags/pretrain/dagRuns?run_type=asset_triggered")["dag_runs"]
        return runs[0]["dag_run_id"] if runs else None

    run_id = airflow.wait(asset_triggered_run, "the scheduler to start pretrain for the asset event", HANG_S)

    # The event's snapshot and overrides reached the training; export, evaluate and report after it are the
    # REST form test's (the teardown stops them here).
    def trained():
        state = airflow.task_instances("pretrain", run_id).get("train", {}).get("state")
        return state if state in ("success", "failed", "upstream_failed") else None

    assert airflow.wait(trained, "the asset-triggered run's train task", HANG_S, every_s=2.0) == "success", (
        airflow.task_instances("pretrain", run_id)
    )
    train = DatasetRef.of(config_of(airflow), "train", "asset").manifest()
    assert train.rows["steps"] == 3 and train.lineage["run_id"] == run_id


def run_publish_after_a_real_quality_task(airflow, snapshot, overrides):
    """A `corpus_from_files` run in which Airflow really runs run_overrides, quality (spark-submit) and
    publish_token_shards; the data stages before them are marked success through the REST API, as a user
    does in the UI, their outputs already published under ``snapshot`` (tokenize's path given as its XCom)."""
    dag_id = "corpus_from_files"
    airflow.pause(dag_id)  # so that the run waits, queued, until the stages before the report are marked
    run_id = airflow.trigger(dag_id, {"snapshot": snapshot, "overrides": overrides})
    marked = ("ingest", "clean", "dedup", "classify", "decontaminate", "tokenize")
    airflow.wait(
        lambda: set(marked) <= set(airflow.task_instances(dag_id, run_id)), "the run's task instances"
    )
    base = f"/api/v2/dags/{dag_id}/dagRuns/{run_path(run_id)}/taskInstances"
    for task_id in marked:
        airflow.request("PATCH", f"{base}/{task_id}", {"new_state": "success"})
    tokens = DatasetRef.of(config_of(airflow), "tokenize", snapshot).path
    airflow.request("POST", f"{base}/tokenize/xcomEntries", {"key": "return_value", "value": str(tokens)})
    airflow.unpause(dag_id)
    assert airflow.wait_for_run(dag_id, run_id) == "success", airflow.task_instances(dag_id, run_id)
    airflow.pause(dag_id)
    return run_id


def token_shards_events(airflow, run_id):
    (asset,) = airflow.request("GET", "/api/v2/assets?name_pattern=token_shards")["assets"]
    query = f"asset_id={asset['id']}&source_dag_id=corpus_from_files&source_run_id={run_path(run_id)}"
    return airflow.request("GET", f"/api/v2/assets/events?{query}")["asset_events"]


def test_a_snapshot_failing_the_gate_announces_no_token_shards_and_the_log_names_the_threshold(
    airflow, sample_corpus
):
    """The quality gate end to end in Airflow: the quality task (mode fail, a threshold the sample cannot meet)
    records a failed verdict, publish_token_shards is skipped naming the threshold, and no event reaches the
    token_shards Asset; with the threshold met, the same run emits one event."""
    from pipeline.classify import job as classify_job
    from pipeline.decontaminate import job as decontaminate_job
    from pipeline.dedup import job as dedup_job

    corpus_config, snapshot = sample_corpus
    config = config_of(airflow)
    airflow.wait_for_dags("corpus_from_files")
    airflow.pause("pretrain")  # a paused DAG queues no asset-triggered run: the passing event trains nothing
    clean = DatasetRef.of(corpus_config, "clean", snapshot)
    dedup_job.run(config, [clean], DatasetRef.of(config, "dedup", "gate-fail"))
    # As in a default run: no classifier, and decontaminate's held-out set is the validation documents of the
    # tokenize outputs already in this data root (earlier tests publish some), so it may drop a few. Quality
    # reads decontaminate's output.
    ref = lambda stage: DatasetRef.of(config, stage, "gate-fail")  # noqa: E731
    classify_job.run(config, [ref("dedup")], ref("classify"))
    decontaminate_job.run(config, [ref("classify")], ref("decontaminate"))
    publish_copy(config, "gate-fail", "decontaminate", airflow.data_root, "gate-pass")
    for name in ("gate-fail", "gate-pass"):
        publish_copy(corpus_config, snapshot, "tokenize", airflow.data_root, name)

    failing = run_publish_after_a_real_quality_task(
        airflow, "gate-fail", ["quality.gate.mode=fail", "quality.gate.min_documents=1000000000"]
    )
    tasks = airflow.task_instances("corpus_from_files", failing)
    assert tasks["quality"]["state"] == "success" and tasks["publish_token_shards"]["state"] == "skipped"
    kept = DatasetRef.of(config, "decontaminate", "gate-fail").manifest().rows["documents"]
    threshold = f"documents {kept} < quality.gate.min_documents 1000000000"
    verdict = DatasetRef.of(config, "quality", "gate-fail").manifest().extra["gate"]
    assert verdict == {"mode": "fail", "passed": False, "failures": [threshold]}
    quality_log = airflow.task_log("corpus_from_files", failing, "quality")
    assert f"attached to the Spark Connect server {airflow.env['PRETRAIN__SPARK__REMOTE']}" in quality_log
    log = airflow.task_log("corpus_from_files", failing, "publish_token_shards")
    assert "quality gate failed for snapshot 'gate-fail'" in log and threshold in log, log[-3000:]
    assert token_shards_events(airflow, failing) == []

    passing = run_publish_after_a_real_quality_task(airflow, "gate-pass", ["quality.gate.mode=fail"])
    tasks = airflow.task_instances("corpus_from_files", passing)
    assert tasks["publish_token_shards"]["state"] == "success"
    assert DatasetRef.of(config, "quality", "gate-pass").manifest().extra["gate"]["passed"]
    (event,) = token_shards_events(airflow, passing)
    tokens = DatasetRef.of(config, "tokenize", "gate-pass")
    assert event["extra"]["snapshot"] == "gate-pass" and event["extra"]["digest"] == tokens.manifest().digest


def test_backfill_reprocesses_a_crawled_and_an_ingested_date_and_a_rerun_changes_nothing(
    airflow, sample_corpus, tmp_path
):
    """Two dates backfilled one at a time: one from its stored crawl, one ingested again from the files its
    ingest manifest names. The later date's decontaminate reads the earlier date's held-out documents. Then
    the ingested date is backfilled again and writes the same bytes (its decontaminate once read whatever
    other snapshots existed by then, and changed)."""
    from pipeline.ingest import job as ingest_job
    from tests.ingest.sources import write_all

    corpus_config, snapshot = sample_corpus
    config = config_of(airflow)
    crawled, ingested = DATES
    publish_copy(corpus_config, snapshot, "crawl", airflow.data_root, crawled)
    write_all(tmp_path / "sources")
    with_sources = make_config(
        airflow.data_root, "spark.shuffle_partitions=4", f"ingest.sources=[{tmp_path / 'sources'}]"
    )
    ingested_before = ingest_job.run(with_sources, [], DatasetRef.of(with_sources, "ingest", ingested))
    airflow.unpause("reprocess_corpus")  # Airflow runs backfills only for unpaused DAGs

    def backfill(first_date, *extra):
        created = airflow.create_backfill(
            "reprocess_corpus", first_date, DATES[1], "--max-active-runs", "1", *extra
        )
        airflow.wait(
            lambda: airflow.request("GET", f"/api/v2/backfills/{created}")["completed_at"],
            "the backfill to complete",
            HANG_S,
            every_s=2.0,
        )
        runs = airflow.request("GET", "/api/v2/dags/reprocess_corpus/dagRuns?run_type=backfill")["dag_runs"]
        return {run["logical_date"][:10]: run for run in runs}

    runs = backfill(crawled)
    assert sorted(runs) == list(DATES)
    assert {date: run["state"] for date, run in runs.items()} == dict.fromkeys(DATES, "success"), {
        date: airflow.task_instances("reprocess_corpus", run["dag_run_id"]) for date, run in runs.items()
    }
    first = {}
    for date in DATES:
        for stage in [entry.name for entry in corpus_stages(reports=False)]:
            manifest = DatasetRef.of(config, stage, date).manifest()
            assert manifest.snapshot == date
            assert manifest.lineage["dag_id"] == "reprocess_corpus"
            assert manifest.lineage["run_id"] == runs[date]["dag_run_id"]
            first[date, stage] = manifest
    assert first[crawled, "clean"].inputs[0]["stage"] == "crawl"
    assert first[ingested, "clean"].inputs[0]["stage"] == "ingest"
    assert not DatasetRef.of(config, "ingest", crawled).is_complete()  # a crawled date is never ingested
    ingested_after = DatasetRef.of(config, "ingest", ingested).manifest()
    assert (
        ingested_after.extra["replayed"]
        and ingested_after.extra["sources"] == ingested_before.extra["sources"]
    )
    assert ingested_after.lineage["dag_id"] == "reprocess_corpus"
    assert ingested_after.digest == ingested_before.digest  # the same documents from the same files
    assert first[crawled, "dedup"].lineage["task_id"] == "dedup"
    heldout = {date: first[date, "decontaminate"].extra["decontaminate"]["sets"]["heldout"] for date in DATES}
    assert "validation_snapshots" not in heldout[crawled]  # nothing before it
    assert heldout[ingested]["validation_snapshots"] == [crawled]

    rerun = backfill(ingested, "--reprocess-behavior", "completed")
    assert {date: run["state"] for date, run in rerun.items()} == dict.fromkeys(DATES, "success")
    first[ingested, "ingest"] = ingested_after
    for (date, stage), before in first.items():
        if date != ingested:
            continue
        after = DatasetRef.of(config, stage, date).manifest()
        assert after.created_at > before.created_at or after.lineage != before.lineage  # really re-run
        assert after.digest == before.digest and after.files == before.files  # same bytes, nothing duplicated
        stage_folder = airflow.data_root / config.project.corpus / stage
        leftovers = [p.name for p in stage_folder.glob(".*") if not p.name.startswith(".lock-")]
        assert leftovers == []  # no staging or retired folder left behind (the lock files stay, unlocked)


def torchrun_processes(marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if marker in cmdline and "pipeline.train" in cmdline:
            try:
                if process.status() != psutil.STATUS_ZOMBIE:
                    found.append(process)
            except psutil.NoSuchProcess:
                pass
    return found


def test_marking_a_running_train_task_failed_kills_every_torchrun_process(airflow, sample_corpus):
    corpus_config, snapshot = sample_corpus
    publish_copy(corpus_config, snapshot, "tokenize", airflow.data_root, "kill")
    airflow.unpause("pretrain")
    run_id = airflow.trigger("pretrain", {"snapshot": "kill", "steps": 1_000_000, "processes_per_node": 2})
    marker = "--snapshot kill"  # in the agent's and the ranks' argv
    started = airflow.wait(
        lambda: len(torchrun_processes(marker)) >= 3 and torchrun_processes(marker), "torchrun"
    )

    airflow.request(
        "PATCH",
        f"/api/v2/dags/pretrain/dagRuns/{run_path(run_id)}/taskInstances/train",
        {"new_state": "failed"},
    )
    airflow.wait(lambda: not torchrun_processes(marker), "the killed task's torchrun processes to exit", 300)
    assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in started)
    assert airflow.wait_for_run("pretrain", run_id) == "failed"
    assert not DatasetRef.of(config_of(airflow), "train", "kill").is_complete()


def test_a_backfill_left_unfinished_is_cancelled_so_the_next_one_can_start(airflow):
    """A test whose backfill was still running when it ended (pytest-timeout) made the next test's
    `backfill create` fail with AlreadyRunningBackfill; the teardown now cancels it."""
    date = "2026-04-01"
    airflow.pause("reprocess_corpus")  # Airflow runs no task of a paused DAG: the backfill stays unfinished

    def create():
        return airflow.airflow(
            "backfill", "create", "--dag-id", "reprocess_corpus", "--from-date", date, "--to-date", date,
            check=False,
        )  # fmt: skip

    assert create().returncode == 0
    blocked = create()
    assert blocked.returncode != 0 and "AlreadyRunningBackfill" in blocked.stderr + blocked.stdout
    airflow.cancel_everything()
    backfills = airflow.request("GET", "/api/v2/backfills?dag_id=reprocess_corpus")["backfills"]
    assert all(backfill["completed_at"] for backfill in backfills)
    assert create().returncode == 0, "the next backfill starts"
