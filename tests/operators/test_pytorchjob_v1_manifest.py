"""The rendered PyTorchJob: its shape, and validation against the CRD schema and the core Kubernetes types."""

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from operators.kubeflow import __main__ as render_cli
from operators.kubeflow.api import job_state
from operators.kubeflow.job_parts import (
    CONFIG_ENV,
    InvalidManifestError,
    KubernetesJobSettings,
    crd_errors,
    job_name,
)
from operators.kubeflow.pytorchjob_v1 import CRD, VERSION, render_pytorch_job, validate_pytorch_job
from operators.kubeflow.trainjob import validate_train_job, validate_training_runtime
from pipeline.config import load_config
from pipeline.core.config import ConfigError
from pipeline.core.lineage import Lineage

K8S_DIR = Path(__file__).resolve().parents[2] / "docker" / "k8s"
LINEAGE = Lineage(
    dag_id="pretrain", run_id="manual__2026-11-29T10:00:00+00:00", task_id="train", try_number=2
)


def render(*overrides, settings=None):
    config = load_config(None, ["project.data_root=/mnt/pretrain", *overrides], environ={})
    job = render_pytorch_job(
        config, name="pretrain-train-abc", snapshot="2026-11-29", settings=settings, lineage=LINEAGE
    )
    return config, job


def container(job, replica="Master"):
    (only,) = job["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"]["containers"]
    return only


def env(job, replica="Master"):
    return {item["name"]: item["value"] for item in container(job, replica)["env"]}


def test_multi_node_job_has_master_workers_and_elastic_policy():
    config, job = render("train.nnodes=4", "train.nproc_per_node=8")
    spec = job["spec"]
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
    assert spec["pytorchReplicaSpecs"]["Master"]["replicas"] == 1
    assert spec["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    assert spec["nprocPerNode"] == "8"
    assert spec["elasticPolicy"] == {
        "rdzvBackend": "c10d",
        "minReplicas": 4,
        "maxReplicas": 4,
        "maxRestarts": 3,
    }
    assert spec["runPolicy"] == {
        "cleanPodPolicy": "Running",
        "backoffLimit": 3,
        "ttlSecondsAfterFinished": 86400,
    }
    for replica in ("Master", "Worker"):
        pod = spec["pytorchReplicaSpecs"][replica]["template"]["spec"]
        main = container(job, replica)
        assert main["name"] == "pytorch"
        assert main["resources"]["limits"]["nvidia.com/gpu"] == 8  # one GPU per process by default
        assert {"name": "data", "mountPath": "/mnt/pretrain"} in main["volumeMounts"]
        assert {"name": "data", "persistentVolumeClaim": {"claimName": "pretrain-data"}} in pod["volumes"]
        assert "--standalone" not in main["command"][2]  # the rendezvous comes from the elastic policy
        assert main["command"][-2:] == ["2026-11-29", "tokenize"]
        assert main["ports"] == [{"name": "pytorchjob-port", "containerPort": 23456, "protocol": "TCP"}]
        variables = env(job, replica)
        assert variables["NCCL_DEBUG"] == "WARN" and variables["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
        assert Lineage.from_env(variables) == LINEAGE  # manifests written in the pod name this task try
        # The config travels in the job; the pod trains with exactly the tree (and hash) the task resolved.
        assert load_config(None, [], environ={}).hash != config.hash
        assert yaml.safe_load(variables[CONFIG_ENV]) == config.to_dict()
    annotations = job["metadata"]["annotations"]
    assert annotations["pretrain.dev/run-id"] == LINEAGE.run_id
    assert annotations["pretrain.dev/try-number"] == "2"
    assert annotations["pretrain.dev/config-hash"] == config.hash


def test_single_node_job_is_one_master_without_rendezvous():
    _, job = render("train.nnodes=1", "train.nproc_per_node=2")
    assert set(job["spec"]["pytorchReplicaSpecs"]) == {"Master"}
    assert "elasticPolicy" not in job["spec"]
    assert "--standalone --nproc_per_node=2" in container(job)["command"][2]


def test_pipeline_job_carries_its_layout_and_world_size():
    # Two pods of one process each: the two pipeline stages on two nodes, as two torchrun agents run them.
    _, job = render(
        "train.nnodes=2", "train.nproc_per_node=1", "train.pp_degree=2", "train.pp_microbatches=8"
    )
    spec = job["spec"]
    assert spec["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1 and spec["nprocPerNode"] == "1"
    assert job["metadata"]["annotations"]["pretrain.dev/pipeline"] == (
        "pp=2 x dp=1, 1f1b, pp_microbatches=8, pp_virtual_stages=1"
    )
    carried = yaml.safe_load(env(job)[CONFIG_ENV])["train"]
    assert (carried["pp_degree"], carried["pp_microbatches"]) == (2, 8)
    validate_pytorch_job(job)  # raises unless the CRD schema and the core types accept it
    with pytest.raises(ConfigError, match=r"train\.pp_degree=2 does not divide the 3 ranks"):
        render("train.nnodes=3", "train.nproc_per_node=1", "train.pp_degree=2")


def test_settings_shape_the_job():
    settings = KubernetesJobSettings().merged(
        {
            "gpus_per_node": 0,
            "namespace": "ml",
            "image": "registry.example/pretrain:1.2",
            "min_nodes": 2,
            "max_nodes": 5,
            "clean_pod_policy": "All",
            "active_deadline_seconds": 3600,
            "node_selector": {"pool": "cpu"},
        }
    )
    _, job = render("train.nnodes=3", settings=settings)
    assert job["metadata"]["namespace"] == "ml"
    assert "nvidia.com/gpu" not in container(job)["resources"]["limits"]
    assert container(job)["image"] == "registry.example/pretrain:1.2"
    assert (
        job["spec"]["elasticPolicy"]["minReplicas"] == 2 and job["spec"]["elasticPolicy"]["maxReplicas"] == 5
    )
    assert job["spec"]["runPolicy"]["activeDeadlineSeconds"] == 3600
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["nodeSelector"] == {"pool": "cpu"}
    with pytest.raises(ValueError, match="unknown Kubernetes job setting"):
        KubernetesJobSettings().merged({"imagee": "x"})


def test_crd_schema_rejects_unknown_and_mistyped_fields():
    _, job = render("train.nnodes=2")
    assert crd_errors(job, CRD, VERSION) == []
    typo = copy.deepcopy(job)
    typo["spec"]["elasticPolicy"]["rdzvBackEnd"] = "c10d"
    assert any("rdzvBackEnd" in error for error in crd_errors(typo, CRD, VERSION))
    wrong_type = copy.deepcopy(job)
    wrong_type["spec"]["nprocPerNode"] = 8
    assert crd_errors(wrong_type, CRD, VERSION) == ["spec.nprocPerNode: 8 is not of type 'string'"]
    no_replicas = copy.deepcopy(job)
    del no_replicas["spec"]["pytorchReplicaSpecs"]
    assert crd_errors(no_replicas, CRD, VERSION) == ["spec: 'pytorchReplicaSpecs' is a required property"]


def test_core_types_and_controller_rules_are_enforced():
    _, job = render("train.nnodes=2")
    validate_pytorch_job(job)
    bad_pod = copy.deepcopy(job)
    container(bad_pod, "Worker")["ports"][0]["containerPort"] = "rendezvous"
    with pytest.raises(InvalidManifestError, match=r"Worker\.template\.spec\.containers\.0\.ports\.0"):
        validate_pytorch_job(bad_pod)
    two_masters = copy.deepcopy(job)
    two_masters["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    with pytest.raises(InvalidManifestError, match=r"Master\.replicas: must be 1"):
        validate_pytorch_job(two_masters)
    renamed = copy.deepcopy(job)
    container(renamed)["name"] = "trainer"
    with pytest.raises(InvalidManifestError, match="needs a container named 'pytorch'"):
        validate_pytorch_job(renamed)
    with pytest.raises(InvalidManifestError, match="DNS-1035"):
        render_pytorch_job(
            load_config(None, ["project.data_root=/mnt/p"], environ={}), name="Train_1", snapshot="s"
        )


def test_uri_data_root_is_refused():
    with pytest.raises(InvalidManifestError, match="must be a local path"):
        render("project.data_root=s3a://bucket/data")


def test_job_name_is_stable_across_tries_and_unique_per_task_instance():
    name = job_name("pretrain", "manual__2026-11-29T10:00:00+00:00", "train")
    assert name == job_name("pretrain", "manual__2026-11-29T10:00:00+00:00", "train")
    others = {
        job_name("pretrain", "manual__2026-11-30T10:00:00+00:00", "train"),
        job_name("pretrain", "manual__2026-11-29T10:00:00+00:00", "train", map_index=1),
        job_name("other_dag", "manual__2026-11-29T10:00:00+00:00", "train"),
    }
    assert name not in others and len(others) == 3
    long = job_name("d" * 250, "r" * 250, "Train.Step_" * 30)
    assert len(long) <= 52 and long.startswith("pretrain-train-step-")
    for candidate in (name, long, *others):
        validate_pytorch_job(
            render_pytorch_job(
                load_config(None, ["project.data_root=/m"], environ={}), name=candidate, snapshot="s"
            )
        )


def test_job_state_reads_conditions():
    def job(*conditions):
        return {
            "status": {"conditions": [{"type": t, "status": s, "message": t.lower()} for t, s in conditions]}
        }

    assert job_state(None) == ("Missing", "the PyTorchJob no longer exists")
    assert job_state({}) == ("Pending", "")
    assert job_state(job(("Created", "True"))) == ("Created", "created")
    assert job_state(job(("Created", "True"), ("Running", "True"))) == ("Running", "running")
    assert job_state(job(("Created", "True"), ("Running", "False"), ("Succeeded", "True")))[0] == "Succeeded"
    assert job_state(job(("Running", "False"), ("Failed", "True"), ("Restarting", "True")))[0] == "Failed"


def test_render_cli_prints_a_valid_job(capsys):
    assert (
        render_cli.main(
            [
                *("--snapshot", "s1", "--set", "project.data_root=/mnt/p", "--set", "train.nnodes=2"),
                *("--settings", '{"api": "pytorchjob-v1"}'),
            ]
        )
        == 0
    )
    job = yaml.safe_load(capsys.readouterr().out)
    validate_pytorch_job(job)
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1


def test_kubernetes_files_in_docker_k8s_are_valid():
    """Every manifest in docker/k8s: the Kubeflow kinds against their CRDs, the rest (the namespace, RBAC, the
    PVC, the Spark pod templates) against the core types, strictly (an unknown field fails)."""
    version = kubernetes_validate.latest_version()
    kinds = set()
    for path in sorted(K8S_DIR.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if not document:
                continue
            kinds.add(document["kind"])
            if document["kind"] == "PyTorchJob":
                validate_pytorch_job(document)
            elif document["kind"] == "TrainJob":
                validate_train_job(document)
            elif document["kind"] == "ClusterTrainingRuntime":
                validate_training_runtime(document)
            else:
                kubernetes_validate.validate(document, version, strict=True)
    assert {
        "PyTorchJob",
        "TrainJob",
        "ClusterTrainingRuntime",
        "PersistentVolumeClaim",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Namespace",
        "Pod",  # the Spark driver and executor pod templates
    } <= kinds
