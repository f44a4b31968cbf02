"""TrainOperator (train.launcher=kubernetes) with kubernetes api=trainer-v2 (the default): Kubeflow Trainer v2
TrainJobs, against a local server speaking the Kubernetes REST protocol.

PROTOCOL TESTS, NOT A CLUSTER TEST: no Kubernetes API server (nor Kubeflow Trainer, nor JobSet) can run on
these machines. The server in ``k8s_api_server.py`` answers the TrainJob and pod-log endpoints the way the
API server does (paths, status codes, Status bodies, bearer-token auth) and advances each TrainJob's status
one step per read the way the Trainer reports it (jobsStatus while it runs, then a Complete or Failed
condition copied from its JobSet); its node-0 pod carries the JobSet's labels. The operator, the trigger and
the `kubernetes` clients are the real ones, reading a real kubeconfig through the Airflow
`kubernetes_default` connection. No pod runs and nothing trains.
"""

import asyncio
import json

import pytest
import yaml
from airflow.sdk.exceptions import AirflowException

from operators.kubeflow.job_parts import InvalidManifestError, KubernetesJobSettings, job_name
from operators.kubeflow.trainjob import render_train_job
from operators.kubeflow.trigger import TrainJobTrigger
from operators.train_operator import TrainOperator
from pipeline.core.lineage import Lineage
from tests.conftest import make_config
from tests.operators.kubernetes_tasks import NAMESPACE, RUN_ID, TaskTry, run_trigger, start

NAME = job_name("pretrain", RUN_ID, "train")


def operator(tmp_path, settings=None, **kwargs):
    """A fresh operator, as each Airflow try builds one from the DAG in a new process."""
    return TrainOperator(
        task_id="train",
        snapshot="2026-11-29",
        config_path="",
        overrides=[
            f"project.data_root={tmp_path / 'data'}",
            "train.nnodes=2",
            "train.nproc_per_node=4",
            "train.launcher=kubernetes",
        ],
        kubernetes_settings={"namespace": NAMESPACE, "image": "pretrain-pipeline:test", **(settings or {})},
        poll_interval=0.01,
        **kwargs,
    )


def stored(server):
    (job,) = server.live().values()
    return job.body


def earlier_try(tmp_path, try_number=1):
    """The TrainJob an earlier try of this task instance created."""
    job = render_train_job(
        make_config(tmp_path / "data"),
        name=NAME,
        snapshot="2026-11-29",
        settings=KubernetesJobSettings(namespace=NAMESPACE),
        lineage=Lineage("pretrain", RUN_ID, "train", try_number),
    )
    return job


def test_trainjob_is_created_watched_logged_and_deleted(server, tmp_path, capsys):
    trigger = start(operator(tmp_path))
    assert (trigger.name, trigger.namespace) == (NAME, NAMESPACE)
    assert server.count("POST", "trainjobs") == 1 and server.count("POST", "pytorchjobs") == 0
    job = stored(server)
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and job["kind"] == "TrainJob"
    trainer = job["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"], trainer["image"]) == (
        2,
        4,
        "pretrain-pipeline:test",
    )
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 4
    assert job["metadata"]["annotations"]["pretrain.dev/try-number"] == "1"
    variables = {item["name"]: item["value"] for item in trainer["env"]}
    # The pods train the run named after the job (no train.run_id given), so a resubmitted job resumes it.
    assert yaml.safe_load(variables["PRETRAIN_CONFIG_YAML"])["train"]["run_id"] == NAME

    # The trigger is serialized to the database and rebuilt in the triggerer.
    classpath, kwargs = trigger.serialize()
    assert classpath == "operators.kubeflow.trigger.TrainJobTrigger"
    event = run_trigger(TrainJobTrigger(**kwargs))
    assert (event["state"], event["api"]) == ("Complete", "trainer-v2")
    assert event["message"] == "jobset completed successfully"
    assert event["run"] == NAME  # the run comes back in the event: dag.test() resumes with the event alone
    # The operator looked for an earlier try's job (404), then the trigger read Pending, Running, Complete.
    assert server.count("GET", f"trainjobs/{NAME}") == 4

    capsys.readouterr()
    path = operator(tmp_path).execute_complete({"ti": TaskTry()}, event)
    assert path == str(tmp_path / "data" / "sample" / "train" / "2026-11-29" / NAME)
    task_log = capsys.readouterr().out
    assert f"---- node-0 log of TrainJob {NAMESPACE}/{NAME} ----" in task_log
    assert "] rank0: step 2 loss 4.0 " in task_log  # one task-log line per log line
    # The node-0 pod was found by the JobSet's labels and its `node` container's log read (the server
    # answers 400 for another container).
    assert server.count("GET", f"/pods/{NAME}-node-0-0-x7k2p/log") == 1
    assert server.count("DELETE", "trainjobs") == 1 and server.live() == {}


def test_retry_reattaches_to_the_running_trainjob_by_its_name(server, tmp_path, capsys):
    first = start(operator(tmp_path), try_number=1)
    server.jobs[(NAMESPACE, first.name)].step = 1  # Running when the worker running try 1 dies

    second = start(operator(tmp_path), try_number=2)
    assert second.name == first.name == NAME
    assert server.count("POST", "trainjobs") == 1 and len(server.live()) == 1
    assert "reattaching to TrainJob ml/" in capsys.readouterr().out
    assert stored(server)["metadata"]["annotations"]["pretrain.dev/try-number"] == "1"
    assert run_trigger(second)["state"] == "Complete"


def test_a_try_racing_another_one_attaches_to_the_trainjob_it_created(server, tmp_path, capsys):
    server.seed(earlier_try(tmp_path))
    uid = stored(server)["metadata"]["uid"]
    server.hide_next_gets = 1  # the other try creates the job between this try's GET and its POST

    start(operator(tmp_path), try_number=2)
    assert server.count("POST", "trainjobs") == 1  # answered 409 AlreadyExists
    assert stored(server)["metadata"]["uid"] == uid
    assert f"TrainJob ml/{NAME} was created concurrently; attaching" in capsys.readouterr().out


def test_failed_trainjob_fails_the_task_with_the_jobsets_reason(server, tmp_path):
    server.trainjob_script = ["Created", "Running", "Failed"]
    event = run_trigger(start(operator(tmp_path)))
    assert event["state"] == "Failed"
    with pytest.raises(
        AirflowException,
        match=rf"TrainJob {NAMESPACE}/{NAME} ended Failed: jobset failed due to reaching max number of restarts",
    ):
        operator(tmp_path).execute_complete({"ti": TaskTry()}, event, run=NAME)
    assert server.count("DELETE") == 0 and len(server.live()) == 1  # kept for kubectl describe

    with pytest.raises(AirflowException, match="ended Failed"):
        operator(tmp_path, on_finish="delete").execute_complete({"ti": TaskTry()}, event, run=NAME)
    assert server.count("DELETE", "trainjobs") == 1


def test_retry_after_a_failed_trainjob_deletes_it_and_resubmits(server, tmp_path):
    server.seed(earlier_try(tmp_path), script=["Failed"])
    old_uid = stored(server)["metadata"]["uid"]

    trigger = start(operator(tmp_path), try_number=2)
    assert trigger.name == NAME
    assert server.count("DELETE", "trainjobs") == 1 and server.count("POST", "trainjobs") == 1
    resubmitted = stored(server)
    assert resubmitted["metadata"]["uid"] != old_uid
    assert resubmitted["metadata"]["annotations"]["pretrain.dev/try-number"] == "2"


def test_retry_after_a_complete_trainjob_finishes_without_resubmitting(server, tmp_path):
    server.seed(earlier_try(tmp_path), script=["Complete"], step=1)
    path = operator(tmp_path).execute({"ti": TaskTry(try_number=2)})  # nothing to wait for
    assert path.endswith(f"/train/2026-11-29/{NAME}")
    assert server.count("POST") == 0 and server.count("DELETE", "trainjobs") == 1


def test_a_suspended_trainjob_is_waited_for(server, tmp_path):
    server.trainjob_script = [
        "Created",
        "Suspended",
        "Suspended",
        "Running",
        "Complete",
    ]  # e.g. Kueue queued it
    assert run_trigger(start(operator(tmp_path)))["state"] == "Complete"


def test_killing_the_task_deletes_the_trainjob(server, tmp_path):
    op = operator(tmp_path)
    start(op)
    op.on_kill()  # the worker's SIGTERM handler, while the job runs
    assert server.count("DELETE", f"trainjobs/{NAME}") == 1

    trigger = start(operator(tmp_path), try_number=2)  # a new job for the next try
    assert server.count("POST", "trainjobs") == 2
    asyncio.run(trigger.on_kill())  # mark failed / clear while the task is deferred
    assert server.count("DELETE", f"trainjobs/{NAME}") == 2
    assert run_trigger(trigger)["state"] == "Missing"


def test_trigger_rides_out_transient_api_errors(server, tmp_path):
    trigger = start(operator(tmp_path))
    server.fail_next_gets = 3
    assert run_trigger(trigger)["state"] == "Complete"


def test_unsupported_settings_fail_before_any_api_call(server, tmp_path):
    with pytest.raises(
        InvalidManifestError, match="kubernetes setting max_nodes=4: Kubeflow Trainer v2 runs"
    ):
        operator(tmp_path, settings={"max_nodes": 4}).execute({"ti": TaskTry()})
    assert server.requests == []


def test_the_v1_api_is_still_one_setting_away(server, tmp_path):
    start(operator(tmp_path, settings={"api": "pytorchjob-v1"}))
    assert server.count("POST", "pytorchjobs") == 1 and server.count("POST", "trainjobs") == 0
    assert stored(server)["kind"] == "PyTorchJob"


@pytest.mark.slow
def test_pretrain_dag_with_the_trainjob_launcher(server, tmp_path, airflow_db, monkeypatch):
    """The `pretrain` DAG through Airflow's dag.test() with the default api: the form's nodes, processes and
    steps reach the TrainJob; the task defers, the trigger runs, execute_complete resumes. The stages after
    training are marked success instead of run, since no pod trained anything."""
    from airflow.dag_processing.dagbag import DagBag

    from tests.dags.test_dagbag import DAGS_FOLDER

    monkeypatch.setenv(
        "AIRFLOW_VAR_PRETRAIN_KUBERNETES", json.dumps({"namespace": NAMESPACE, "gpus_per_node": 1})
    )
    server.trainjob_script = ["Complete"]  # done by the trigger's first poll
    dag = DagBag(str(DAGS_FOLDER)).dags["pretrain"]
    run = dag.test(
        run_conf={
            "launcher": "kubernetes",
            "nodes": 3,
            "processes_per_node": 2,
            "steps": 7,
            "snapshot": "2026-11-29",
            "overrides": [f"project.data_root={tmp_path / 'data'}"],
        },
        mark_success_pattern="^(export|evaluate|report)$",
    )
    assert run.state == "success"
    # Resumed from the trigger's event in its first try (the run it trains comes back in the event; the try
    # used to fail on resume and pass only on its retry, a minute later).
    (train,) = [ti for ti in run.get_task_instances() if ti.task_id == "train"]
    assert train.try_number == 1
    assert server.count("POST", "trainjobs") == 1 and server.count("DELETE", "trainjobs") == 1
    (job,) = [stored.body for stored in server.jobs.values()]
    assert job["metadata"]["name"] == job_name("pretrain", run.run_id, "train")
    trainer = job["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (3, 2)
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 1
    variables = {item["name"]: item["value"] for item in trainer["env"]}
    config = yaml.safe_load(variables["PRETRAIN_CONFIG_YAML"])
    assert (config["train"]["steps"], config["train"]["nnodes"]) == (7, 3)
    assert variables["AIRFLOW_CTX_DAG_RUN_ID"] == run.run_id
