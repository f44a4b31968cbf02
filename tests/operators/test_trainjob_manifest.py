"""The rendered Kubeflow Trainer v2 TrainJob and the shipped ClusterTrainingRuntime: their shape, what v2 cannot
express, and validation against the vendored v2.3.0 CRD schemas and the core Kubernetes types."""

import copy
import os
from pathlib import Path

import pytest
import yaml

from operators.kubeflow import __main__ as render_cli
from operators.kubeflow.api import TRAINER_V2, job_state
from operators.kubeflow.job_parts import (
    CONFIG_ENV,
    InvalidManifestError,
    KubernetesJobSettings,
    container_security_context,
    crd_errors,
    pod_security_context,
)
from operators.kubeflow.pytorchjob_v1 import render_pytorch_job
from operators.kubeflow.trainjob import (
    RUNTIME_CRD,
    TRAINJOB_CRD,
    node_pod,
    render_train_job,
    runtime_errors,
    shipped_runtime,
    validate_train_job,
    validate_training_runtime,
)
from pipeline.config import load_config
from pipeline.core.lineage import Lineage

K8S_DIR = Path(__file__).resolve().parents[2] / "docker" / "k8s"
LINEAGE = Lineage(
    dag_id="pretrain", run_id="manual__2026-11-29T10:00:00+00:00", task_id="train", try_number=2
)


def render(*overrides, settings=None):
    config = load_config(None, ["project.data_root=/mnt/pretrain", *overrides], environ={})
    job = render_train_job(
        config, name="pretrain-train-abc", snapshot="2026-11-29", settings=settings, lineage=LINEAGE
    )
    return config, job


def env(job):
    return {item["name"]: item["value"] for item in job["spec"]["trainer"]["env"]}


def pod_patch(job):
    (patch,) = job["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node"
    return node["template"]["spec"]["template"]


def test_two_node_job_sets_nodes_processes_gpus_volumes_and_nccl():
    config, job = render("train.nnodes=2", "train.nproc_per_node=8")
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and job["kind"] == "TrainJob"
    spec = job["spec"]
    assert spec["runtimeRef"] == {
        "name": "pretrain-torch-distributed",
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
    }
    trainer = spec["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 8)
    assert trainer["image"] == "pretrain-pipeline:latest"
    assert trainer["resourcesPerNode"] == {
        "requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": 8},  # one GPU per process by default
        "limits": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": 8},
    }
    # torchrun meets the other node in the static rendezvous of the PET_* variables the Trainer injects.
    script = trainer["command"][2]
    assert "--standalone" not in script and "--nproc_per_node=8 -m pipeline.train" in script
    assert trainer["command"][-2:] == ["2026-11-29", "tokenize"]
    variables = env(job)
    assert variables["NCCL_DEBUG"] == "WARN" and variables["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert variables["NCCL_SOCKET_IFNAME"] == "eth0"
    assert not any(name.startswith("PET_") for name in variables)  # the Trainer's, refused if set
    assert Lineage.from_env(variables) == LINEAGE
    assert yaml.safe_load(variables[CONFIG_ENV]) == config.to_dict()
    # What v1 set on the pod templates comes through the runtime patch: the shared volume and /dev/shm.
    template = pod_patch(job)
    assert template["metadata"]["labels"]["pretrain.dev/snapshot"] == "2026-11-29"
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "pretrain-data"}} in template["spec"][
        "volumes"
    ]
    assert template["spec"]["containers"] == [
        {
            "name": "node",
            "volumeMounts": [
                {"name": "data", "mountPath": "/mnt/pretrain"},
                {"name": "dshm", "mountPath": "/dev/shm"},
            ],
        }
    ]
    assert job["metadata"]["annotations"]["pretrain.dev/try-number"] == "2"
    assert job["metadata"]["annotations"]["pretrain.dev/config-hash"] == config.hash
    assert "activeDeadlineSeconds" not in spec
    # The pod the Trainer builds from runtime + job: the shipped runtime's container, filled in.
    pod = node_pod(job)
    (main,) = pod["containers"]
    assert main["image"] == "pretrain-pipeline:latest" and main["imagePullPolicy"] == "IfNotPresent"
    assert main["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert {v["name"] for v in pod["volumes"]} == {"data", "dshm"} and pod["restartPolicy"] == "Never"
    validate_train_job(job)


def test_one_node_job_runs_standalone():
    _, job = render("train.nnodes=1", "train.nproc_per_node=2")
    assert job["spec"]["trainer"]["numNodes"] == 1
    assert "--standalone --nproc_per_node=2" in job["spec"]["trainer"]["command"][2]
    validate_train_job(job)


def test_the_same_pod_parts_as_the_v1_job():
    config = load_config(None, ["project.data_root=/mnt/p", "train.nnodes=2"], environ={})
    v1 = render_pytorch_job(config, name="pretrain-train-abc", snapshot="s", lineage=LINEAGE)
    v2 = render_train_job(config, name="pretrain-train-abc", snapshot="s", lineage=LINEAGE)
    (master,) = v1["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    trainer = v2["spec"]["trainer"]
    assert (trainer["command"], trainer["env"], trainer["resourcesPerNode"]) == (
        master["command"],
        master["env"],
        master["resources"],
    )
    assert (
        node_pod(v2)["volumes"] == v1["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["volumes"]
    )
    assert v1["metadata"]["labels"] == v2["metadata"]["labels"]


def test_settings_shape_the_job():
    settings = KubernetesJobSettings().merged(
        {
            "gpus_per_node": 0,
            "namespace": "ml",
            "image": "registry.example/pretrain:1.2",
            "runtime_name": "site-torch",
            "active_deadline_seconds": 3600,
            "node_selector": {"pool": "cpu"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "train", "effect": "NoSchedule"}
            ],
            "service_account_name": "trainer",
            "pvc_name": "corpus",
            "env": {"NCCL_DEBUG": "INFO", "NCCL_IB_DISABLE": "1"},
            "min_nodes": 3,  # the requested count: no range, so nothing elastic to refuse
            "max_nodes": 3,
        }
    )
    _, job = render("train.nnodes=3", settings=settings)
    spec = job["spec"]
    assert job["metadata"]["namespace"] == "ml" and spec["runtimeRef"]["name"] == "site-torch"
    assert spec["trainer"]["image"] == "registry.example/pretrain:1.2"
    assert "nvidia.com/gpu" not in spec["trainer"]["resourcesPerNode"]["limits"]
    assert spec["activeDeadlineSeconds"] == 3600
    patched = pod_patch(job)["spec"]
    assert patched["nodeSelector"] == {"pool": "cpu"} and patched["serviceAccountName"] == "trainer"
    assert patched["tolerations"][0]["key"] == "dedicated"
    assert patched["volumes"][0]["persistentVolumeClaim"] == {"claimName": "corpus"}
    assert env(job)["NCCL_DEBUG"] == "INFO" and env(job)["NCCL_IB_DISABLE"] == "1"


def test_pipeline_job_carries_its_layout():
    _, job = render(
        "train.nnodes=2", "train.nproc_per_node=1", "train.pp_degree=2", "train.pp_microbatches=8"
    )
    assert (job["spec"]["trainer"]["numNodes"], job["spec"]["trainer"]["numProcPerNode"]) == (2, 1)
    assert job["metadata"]["annotations"]["pretrain.dev/pipeline"] == (
        "pp=2 x dp=1, 1f1b, pp_microbatches=8, pp_virtual_stages=1"
    )
    carried = yaml.safe_load(env(job)[CONFIG_ENV])["train"]
    assert (carried["pp_degree"], carried["pp_microbatches"]) == (2, 8)


def test_hsdp_job_carries_its_mesh():
    _, job = render(
        "train.nnodes=2", "train.nproc_per_node=4", "train.data_parallel=fsdp", "train.dp_replicate=2"
    )
    assert job["metadata"]["annotations"]["pretrain.dev/hsdp"] == "dp_replicate=2 x dp_shard=4"
    assert yaml.safe_load(env(job)[CONFIG_ENV])["train"]["dp_replicate"] == 2
    _, plain = render("train.nnodes=2", "train.nproc_per_node=4", "train.data_parallel=fsdp")
    assert "pretrain.dev/hsdp" not in plain["metadata"]["annotations"]


def test_what_a_trainjob_cannot_express_fails_naming_each_setting():
    settings = KubernetesJobSettings().merged(
        {"min_nodes": 1, "max_nodes": 4, "restart_policy": "Never", "ttl_seconds_after_finished": 60}
    )
    with pytest.raises(InvalidManifestError) as refused:
        render("train.nnodes=2", "train.min_nnodes=1", settings=settings)
    message = str(refused.value)
    assert "TrainJob 'pretrain-train-abc' cannot express these settings" in message
    assert "train.min_nnodes=1: Kubeflow Trainer v2 runs a fixed number of nodes" in message
    assert "kubernetes setting min_nodes=1: Kubeflow Trainer v2 runs a fixed number of nodes" in message
    assert "kubernetes setting max_nodes=4" in message
    assert "kubernetes setting restart_policy='Never': a TrainJob has no field for it" in message
    assert "ttl_seconds_after_finished=60" in message and "the operator deletes finished TrainJobs" in message
    assert message.count("api=pytorchjob-v1") == 5  # each names the way out
    for key, value in (("max_restarts", 5), ("rdzv_port", 29400), ("image_pull_policy", "Always")):
        with pytest.raises(
            InvalidManifestError, match=rf"{key}=.*ClusterTrainingRuntime 'pretrain-torch-distributed'"
        ):
            render(settings=KubernetesJobSettings().merged({key: value}))
    with pytest.raises(InvalidManifestError, match=r"env sets \['PET_MASTER_PORT'\]"):
        render(settings=KubernetesJobSettings().merged({"env": {"PET_MASTER_PORT": "1234"}}))
    with pytest.raises(InvalidManifestError, match="must be a local path"):
        render("project.data_root=s3a://bucket/data")


def test_api_setting_names_its_choices():
    assert KubernetesJobSettings().api == "trainer-v2"
    with pytest.raises(ValueError, match=r"api='trainer-v3' is not one of \['pytorchjob-v1', 'trainer-v2'\]"):
        KubernetesJobSettings().merged({"api": "trainer-v3"})


def test_trainjob_crd_schema_rejects_unknown_and_mistyped_fields():
    _, job = render("train.nnodes=2")
    assert crd_errors(job, TRAINJOB_CRD, "v1alpha1") == []
    typo = copy.deepcopy(job)
    typo["spec"]["trainer"]["numProcsPerNode"] = 8
    assert crd_errors(typo, TRAINJOB_CRD, "v1alpha1") == [
        "spec.trainer: Additional properties are not allowed ('numProcsPerNode' was unexpected)"
    ]
    as_string = copy.deepcopy(job)
    as_string["spec"]["trainer"]["numProcPerNode"] = "auto"  # an int32 since v2.2, no longer int-or-string
    assert crd_errors(as_string, TRAINJOB_CRD, "v1alpha1") == [
        "spec.trainer.numProcPerNode: 'auto' is not of type 'integer'"
    ]
    v21 = copy.deepcopy(job)
    v21["spec"]["podTemplateOverrides"] = []  # replaced by runtimePatches in v2.2
    assert any("podTemplateOverrides" in error for error in crd_errors(v21, TRAINJOB_CRD, "v1alpha1"))
    resources_in_patch = copy.deepcopy(job)
    pod_patch(resources_in_patch)["spec"]["containers"][0]["resources"] = {}  # only trainer.resourcesPerNode
    assert any(
        "'resources' was unexpected" in e for e in crd_errors(resources_in_patch, TRAINJOB_CRD, "v1alpha1")
    )
    no_manager = copy.deepcopy(job)
    del no_manager["spec"]["runtimePatches"][0]["manager"]
    assert crd_errors(no_manager, TRAINJOB_CRD, "v1alpha1") == [
        "spec.runtimePatches.0: 'manager' is a required property"
    ]
    no_runtime = copy.deepcopy(job)
    del no_runtime["spec"]["runtimeRef"]
    assert crd_errors(no_runtime, TRAINJOB_CRD, "v1alpha1") == ["spec: 'runtimeRef' is a required property"]


def test_core_types_and_webhook_rules_are_enforced():
    _, job = render("train.nnodes=2")
    bad_env = copy.deepcopy(job)
    bad_env["spec"]["trainer"]["env"].append({"name": "X", "valu": "1"})
    with pytest.raises(
        InvalidManifestError, match=r"node pod.*containers\.0\.env\.\d+: Additional properties"
    ):
        validate_train_job(bad_env)
    bad_volume = copy.deepcopy(job)
    pod_patch(bad_volume)["spec"]["volumes"][0]["persistentVolumeClaim"] = {"claim": "x"}
    with pytest.raises(InvalidManifestError, match=r"node pod.*volumes\.0"):
        validate_train_job(bad_volume)
    reserved = copy.deepcopy(job)
    reserved["spec"]["trainer"]["env"].append({"name": "PET_NNODES", "value": "2"})
    with pytest.raises(InvalidManifestError, match=r"must not have reserved envs.*PET_NNODES"):
        validate_train_job(reserved)
    env_in_patch = copy.deepcopy(job)
    pod_patch(env_in_patch)["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}]
    with pytest.raises(InvalidManifestError, match=r"can only be set in spec\.trainer\.env"):
        validate_train_job(env_in_patch)
    wrong_job = copy.deepcopy(job)
    job_patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][
        0
    ]
    wrong_job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"] = [
        {**job_patch, "name": "trainer"}
    ]
    with pytest.raises(InvalidManifestError, match="replicated job 'trainer' is not in the runtime"):
        validate_train_job(wrong_job)
    with pytest.raises(InvalidManifestError, match="DNS-1035"):
        render_train_job(
            load_config(None, ["project.data_root=/m"], environ={}), name="Train_1", snapshot="s"
        )


def test_shipped_runtime_is_valid_and_matches_the_defaults():
    runtime = shipped_runtime()
    validate_training_runtime(runtime)
    assert runtime["metadata"]["name"] == KubernetesJobSettings().runtime_name
    spec = runtime["spec"]
    assert spec["mlPolicy"]["torch"] == {}
    # The runtime holds the v1 settings a TrainJob cannot set; their defaults must mean the same there.
    defaults = KubernetesJobSettings()
    assert spec["template"]["spec"]["failurePolicy"]["maxRestarts"] == defaults.max_restarts
    pod = spec["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["imagePullPolicy"] == defaults.image_pull_policy
    # The same hardening as the v1 pod templates, declared once in operators/kubeflow/pytorchjob_v1.py.
    assert pod["securityContext"] == pod_security_context()
    assert pod["containers"][0]["securityContext"] == container_security_context()


def test_runtime_crd_schema_is_v2_2_or_later():
    runtime = shipped_runtime()
    removed = copy.deepcopy(runtime)
    removed["spec"]["mlPolicy"]["torch"] = {"numProcPerNode": "auto", "elasticPolicy": {"maxNodes": 4}}
    errors = crd_errors(removed, RUNTIME_CRD, "v1alpha1")
    assert len(errors) == 1 and "'elasticPolicy', 'numProcPerNode' were unexpected" in errors[0]
    bad_pod = copy.deepcopy(runtime)
    node = bad_pod["spec"]["template"]["spec"]["replicatedJobs"][0]
    node["template"]["spec"]["template"]["spec"]["containers"][0]["ports"] = [{"containerPort": "rendezvous"}]
    (error,) = runtime_errors(bad_pod)  # the replicated job as a batch/v1 Job, with kubernetes-validate
    assert error.startswith(
        "spec.template.spec.replicatedJobs.0.template.spec.template.spec.containers.0.ports.0"
    )
    renamed = copy.deepcopy(runtime)
    renamed["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"
    ][0]["name"] = "trainer"
    assert runtime_errors(renamed) == [
        "spec.template.spec.replicatedJobs.node: needs a container named 'node'"
    ]


def test_job_state_reads_trainjob_conditions():
    def job(conditions=(), active=None):
        status = {"conditions": [{"type": t, "status": s, "message": m} for t, s, m in conditions]}
        if active is not None:
            status["jobsStatus"] = [{"name": "node", "active": active}]
        return {"status": status}

    assert job_state(None, TRAINER_V2) == ("Missing", "the TrainJob no longer exists")
    assert job_state({}, TRAINER_V2) == ("Pending", "")
    assert job_state(job(active=0), TRAINER_V2) == ("Pending", "")
    assert job_state(job(active=1), TRAINER_V2) == ("Running", "")
    assert job_state(job([("Suspended", "True", "queued")]), TRAINER_V2) == ("Suspended", "queued")
    assert job_state(job([("Suspended", "False", "resumed")], active=1), TRAINER_V2) == ("Running", "")
    assert job_state(job([("Complete", "True", "jobset completed successfully")]), TRAINER_V2) == (
        "Complete",
        "jobset completed successfully",
    )
    assert job_state(job([("Failed", "True", "DeadlineExceeded")], active=1), TRAINER_V2)[0] == "Failed"


def _comparable(document):
    """A job without the embedded config and its hash, which change whenever a config key is added."""
    document = copy.deepcopy(document)
    document["metadata"]["annotations"].pop("pretrain.dev/config-hash")
    if document["kind"] == "TrainJob":
        containers = [document["spec"]["trainer"]]  # its env is the node container's
    else:
        containers = [
            container
            for replica in document["spec"]["pytorchReplicaSpecs"].values()
            for container in replica["template"]["spec"]["containers"]
        ]
    for container in containers:
        container["env"] = [item for item in container["env"] if item["name"] != CONFIG_ENV]
    return document


EXAMPLE_ARGS = [
    *("--snapshot", "2026-11-29", "--set", "project.data_root=/mnt/pretrain", "--set", "train.nnodes=2"),
    *("--set", "train.nproc_per_node=8", "--set", "model.preset=base", "--set", "train.precision=bf16"),
]


@pytest.mark.parametrize(
    ("example", "settings"),
    [("trainjob-example.yaml", "{}"), ("pytorchjob-example.yaml", '{"api": "pytorchjob-v1"}')],
)
def test_checked_in_examples_are_the_rendering(example, settings, capsys, monkeypatch):
    """The examples are the CLI's output for the command in their header (the embedded config aside)."""
    for key in [key for key in os.environ if key.startswith("AIRFLOW_CTX_")]:
        monkeypatch.delenv(
            key
        )  # the CLI records the lineage in the environment; dag.test() leaves one behind
    assert render_cli.main([*EXAMPLE_ARGS, "--settings", settings]) == 0
    rendered = yaml.safe_load(capsys.readouterr().out)
    checked_in = yaml.safe_load((K8S_DIR / example).read_text())
    assert _comparable(checked_in) == _comparable(rendered)


def test_render_cli_prints_a_trainjob_by_default(capsys):
    assert render_cli.main(["--snapshot", "s1", "--set", "project.data_root=/mnt/p"]) == 0
    job = yaml.safe_load(capsys.readouterr().out)
    assert job["kind"] == "TrainJob"
    validate_train_job(job)
