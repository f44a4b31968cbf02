"""TrainOperator (train.launcher=kubernetes) against a local server speaking the Kubernetes REST protocol.

PROTOCOL TESTS, NOT A CLUSTER TEST: no Kubernetes API server can run on these machines. The server in
``k8s_api_server.py`` answers the PyTorchJob and pod-log endpoints the way the API server does (status
codes, Status bodies, bearer-token auth) and advances each job's conditions one step per read, as the
training-operator would. The operator, the trigger and the `kubernetes` clients are the real ones, reading
a real kubeconfig through the Airflow `kubernetes_default` connection. No pod runs and nothing trains.
"""

import asyncio
import json

import pytest
import yaml
from airflow.sdk.exceptions import AirflowException

from operators.kubeflow.job_parts import job_name
from operators.kubeflow.pytorchjob_v1 import render_pytorch_job
from operators.kubeflow.trigger import PyTorchJobTrigger
from operators.train_operator import TrainOperator
from pipeline.core.lineage import Lineage
from tests.conftest import make_config
from tests.operators.kubernetes_tasks import NAMESPACE, RUN_ID, TaskTry, run_trigger, start


def operator(tmp_path, **kwargs):
    """A fresh operator, as each Airflow try builds one from the DAG in a new process."""
    op = TrainOperator(
        task_id="train",
        snapshot="2026-11-29",
        config_path="",
        overrides=[
            f"project.data_root={tmp_path / 'data'}",
            "train.nnodes=2",
            "train.nproc_per_node=4",
            "train.launcher=kubernetes",
        ],
        kubernetes_settings={
            "namespace": NAMESPACE,
            "image": "pretrain-pipeline:test",
            "api": "pytorchjob-v1",
        },
        poll_interval=0.01,
        **kwargs,
    )
    return op


def stored(server):
    (job,) = server.live().values()
    return job.body


def test_job_is_created_watched_logged_and_deleted(server, tmp_path, capsys):
    op = operator(tmp_path)
    trigger = start(op)
    name = job_name("pretrain", RUN_ID, "train")
    assert (trigger.name, trigger.namespace) == (name, NAMESPACE)
    job = stored(server)
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    assert job["metadata"]["annotations"]["pretrain.dev/try-number"] == "1"
    assert server.count("POST") == 1

    # The trigger is serialized to the database and rebuilt in the triggerer.
    classpath, kwargs = trigger.serialize()
    assert classpath == "operators.kubeflow.trigger.PyTorchJobTrigger"
    event = run_trigger(PyTorchJobTrigger(**kwargs))
    assert event["state"] == "Succeeded"

    capsys.readouterr()
    path = operator(tmp_path).execute_complete(
        {"ti": TaskTry()}, event, run=job_name("pretrain", RUN_ID, "train")
    )
    # The pods train the run named after the job (no train.run_id given), so a resubmitted job resumes it.
    assert path == str(tmp_path / "data" / "sample" / "train" / "2026-11-29" / name)
    master = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    variables = {item["name"]: item["value"] for item in master["env"]}
    assert yaml.safe_load(variables["PRETRAIN_CONFIG_YAML"])["train"]["run_id"] == name
    task_log = capsys.readouterr().out
    assert "] rank0: step 2 loss 4.0 " in task_log  # the master pod's log, one task-log line per line
    assert server.count("GET", "/log") == 1
    assert server.count("DELETE") == 1 and server.live() == {}


def test_retry_reattaches_to_the_running_job_instead_of_creating_a_second(server, tmp_path, capsys):
    first = start(operator(tmp_path), try_number=1)
    run_trigger_steps = server.jobs[(NAMESPACE, first.name)]
    run_trigger_steps.step = 1  # the job is Running when the worker running try 1 dies

    second = start(operator(tmp_path), try_number=2)
    assert second.name == first.name
    assert server.count("POST") == 1 and len(server.live()) == 1
    assert "reattaching to PyTorchJob" in capsys.readouterr().out
    assert stored(server)["metadata"]["annotations"]["pretrain.dev/try-number"] == "1"
    assert run_trigger(second)["state"] == "Succeeded"


def test_a_try_racing_another_one_attaches_to_the_job_it_created(server, tmp_path, capsys):
    config = make_config(tmp_path / "data")
    body = render_pytorch_job(config, name=job_name("pretrain", RUN_ID, "train"), snapshot="2026-11-29")
    body["metadata"]["namespace"] = NAMESPACE
    server.seed(body)
    uid = stored(server)["metadata"]["uid"]
    server.hide_next_gets = 1  # the other try creates the job between this try's GET and its POST

    trigger = start(operator(tmp_path), try_number=2)
    assert server.count("POST") == 1  # answered 409 AlreadyExists
    assert stored(server)["metadata"]["uid"] == uid and trigger.name == body["metadata"]["name"]
    assert "was created concurrently; attaching" in capsys.readouterr().out


def test_retry_after_a_failed_job_deletes_it_and_resubmits(server, tmp_path):
    config = make_config(tmp_path / "data")
    name = job_name("pretrain", RUN_ID, "train")
    old = render_pytorch_job(
        config, name=name, snapshot="2026-11-29", lineage=Lineage("pretrain", RUN_ID, "train", 1)
    )
    old["metadata"]["namespace"] = NAMESPACE
    server.seed(old, script=["Failed"])
    old_uid = stored(server)["metadata"]["uid"]

    trigger = start(operator(tmp_path), try_number=2)
    assert trigger.name == name
    assert server.count("DELETE") == 1 and server.count("POST") == 1
    resubmitted = stored(server)
    assert resubmitted["metadata"]["uid"] != old_uid
    assert resubmitted["metadata"]["annotations"]["pretrain.dev/try-number"] == "2"


def test_retry_after_a_succeeded_job_completes_without_resubmitting(server, tmp_path):
    config = make_config(tmp_path / "data")
    body = render_pytorch_job(config, name=job_name("pretrain", RUN_ID, "train"), snapshot="2026-11-29")
    body["metadata"]["namespace"] = NAMESPACE
    server.seed(body, script=["Succeeded"], step=1)

    path = operator(tmp_path).execute({"ti": TaskTry(try_number=2)})  # no TaskDeferred: nothing to wait for
    assert path.endswith(f"/train/2026-11-29/{body['metadata']['name']}")
    assert server.count("POST") == 0 and server.count("DELETE") == 1


def test_failed_job_fails_the_task_and_is_kept_for_inspection(server, tmp_path):
    server.script = ["Created", "Running", "Failed"]
    event = run_trigger(start(operator(tmp_path)))
    assert event["state"] == "Failed"
    with pytest.raises(AirflowException, match=r"ended Failed: PyTorchJob .* is failed"):
        operator(tmp_path).execute_complete(
            {"ti": TaskTry()}, event, run=job_name("pretrain", RUN_ID, "train")
        )
    assert server.count("DELETE") == 0 and len(server.live()) == 1

    with pytest.raises(AirflowException, match="ended Failed"):
        operator(tmp_path, on_finish="delete").execute_complete(
            {"ti": TaskTry()}, event, run=job_name("pretrain", RUN_ID, "train")
        )
    assert server.count("DELETE") == 1


def test_killing_the_task_deletes_the_job(server, tmp_path):
    op = operator(tmp_path)
    start(op)
    op.on_kill()  # the worker's SIGTERM handler, while the job runs
    assert server.count("DELETE") == 1

    trigger = start(operator(tmp_path), try_number=2)  # a new job for the next try
    assert server.count("POST") == 2
    asyncio.run(trigger.on_kill())  # mark failed / clear while the task is deferred
    assert server.count("DELETE") == 2
    assert run_trigger(trigger)["state"] == "Missing"


def test_trigger_rides_out_transient_api_errors_but_not_an_outage(server, tmp_path):
    trigger = start(operator(tmp_path))
    server.fail_next_gets = 3
    assert run_trigger(trigger)["state"] == "Succeeded"
    server.fail_next_gets = 100
    event = run_trigger(trigger)
    assert event["state"] == "Error" and "500" in event["message"]


def test_wrong_credentials_are_refused(server, tmp_path, monkeypatch):
    kubeconfig = server.kubeconfig(tmp_path / "bad.yaml")
    kubeconfig.write_text(kubeconfig.read_text().replace("protocol-test-token", "stolen"))
    monkeypatch.setenv(
        "AIRFLOW_CONN_KUBERNETES_DEFAULT",
        json.dumps({"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}),
    )
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as refused:
        operator(tmp_path).execute({"ti": TaskTry()})
    assert refused.value.status == 401 and server.live() == {}


@pytest.mark.slow
def test_pretrain_dag_with_the_kubernetes_launcher(server, tmp_path, airflow_db, monkeypatch):
    """The `pretrain` DAG through Airflow's dag.test(): the form's launcher, nodes, processes and steps reach
    the PyTorchJob; the task defers, the trigger runs, execute_complete resumes. The stages after training are
    marked success instead of run, since no pod trained anything."""
    from airflow.dag_processing.dagbag import DagBag

    from tests.dags.test_dagbag import DAGS_FOLDER

    monkeypatch.setenv(
        "AIRFLOW_VAR_PRETRAIN_KUBERNETES",
        json.dumps({"namespace": NAMESPACE, "gpus_per_node": 1, "api": "pytorchjob-v1"}),
    )
    server.script = ["Succeeded"]  # the job is done by the trigger's first poll
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
    assert server.count("POST") == 1 and server.count("DELETE") == 1 and server.count("GET", "/log") == 1
    (job,) = [stored.body for stored in server.jobs.values()]
    assert job["metadata"]["name"] == job_name("pretrain", run.run_id, "train")
    assert (
        job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2 and job["spec"]["nprocPerNode"] == "2"
    )
    master = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    variables = {item["name"]: item["value"] for item in master["env"]}
    config = yaml.safe_load(variables["PRETRAIN_CONFIG_YAML"])
    assert (config["train"]["steps"], config["train"]["nnodes"], config["train"]["nproc_per_node"]) == (
        7,
        3,
        2,
    )
    assert variables["AIRFLOW_CTX_DAG_RUN_ID"] == run.run_id
    assert master["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {ti.task_id: ti.state for ti in run.get_task_instances()} == {
        "training_run": "success",
        "train": "success",
        "export": "success",
        "evaluate": "success",
        "report": "success",
    }
