"""Render and validate a Kubeflow Trainer v2 ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``) for one training run.

The TrainJob references the ClusterTrainingRuntime ``resources/torch-distributed-runtime.yaml`` of this package (kubernetes
setting ``runtime_name``), which holds what the Trainer lets only a runtime say (the JobSet's failure policy,
the node Job's restart rules, the image pull policy). The job itself says what varies per run, in the two
places Trainer v2.2+ lets it: ``spec.trainer`` (image, command, environment, nodes, processes per node,
resources and GPUs) and ``spec.runtimePatches`` (what v1 set on the pod templates: the data/checkpoint
volume and /dev/shm, node selector, tolerations, service account, labels). Each pod runs the same
``torchrun -m pipeline.train`` as the v1 path and the local launcher, with the config in its environment;
torchrun takes the static rendezvous from the ``PET_*`` variables the Trainer's torch plugin injects.

What v2 cannot express (elastic node ranges, per-job restart and cleanup policies) is refused with a
message naming the setting, rather than dropped. Validation: the TrainJob CRD's schema (vendored, v2.3.0),
the Trainer webhook's rules we rely on, and the node pod the Trainer will build from the job as a core/v1
Pod (kubernetes-validate).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from typing import Any

from operators.kubeflow.api import TRAINER_V2
from operators.kubeflow.job_parts import (
    InvalidManifestError,
    KubernetesJobSettings,
    check_data_root,
    container_command,
    container_env,
    core_errors,
    crd_errors,
    data_volume_mounts,
    data_volumes,
    dns_label_errors,
    job_metadata,
    node_resources,
    pod_errors,
    resource_documents,
    scheduling,
)
from operators.kubeflow.pytorchjob_v1 import render_pytorch_job
from pipeline.config import PipelineConfig
from pipeline.core.lineage import Lineage
from pipeline.stages import stage as registered_stage

TRAINJOB_CRD = "trainer.kubeflow.org_trainjobs.yaml"  # files of resources/ (package data)
RUNTIME_CRD = "trainer.kubeflow.org_clustertrainingruntimes.yaml"
RUNTIME_FILE = "torch-distributed-runtime.yaml"
NODE_JOB = "node"  # the runtime's replicated job and container that the trainer fills in
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
PATCH_MANAGER = "pretrain.dev/airflow"
# The torch plugin sets these on the node container; the Trainer's webhook refuses a job that sets them.
TORCHRUN_RESERVED_ENV = (
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
)
ELASTIC_UNSUPPORTED = (
    "Kubeflow Trainer v2 runs a fixed number of nodes (v2.2 removed the torch ElasticPolicy)"
)
# Settings of the v1 path that a TrainJob has no field for, and what stands for them under trainer-v2.
RUNTIME_OWNED = {
    "max_restarts": "the runtime's JobSet failurePolicy.maxRestarts decides (whole-group restarts)",
    "restart_policy": "the runtime's node pods decide (restartPolicy Never: a failure restarts the group)",
    "backoff_limit": "the runtime's node Job backoffLimit decides",
    "image_pull_policy": "the runtime's node container imagePullPolicy decides",
    "rdzv_port": "the Trainer fixes the port (PET_MASTER_PORT 29500)",
    "clean_pod_policy": "there is none: the pods stay until the TrainJob is deleted (on_finish)",
    "ttl_seconds_after_finished": "there is none: the operator deletes finished TrainJobs (on_finish)",
}


def unsupported_settings(config: PipelineConfig, settings: KubernetesJobSettings) -> list[str]:
    """What this run asks for that a TrainJob cannot express, one message per setting."""
    nodes = config.train.nnodes
    problems = []
    if config.train.min_nnodes is not None and config.train.min_nnodes != nodes:
        problems.append(
            f"train.min_nnodes={config.train.min_nnodes}: {ELASTIC_UNSUPPORTED}; leave it unset "
            "(kubernetes api=pytorchjob-v1 takes an elastic range from the settings min_nodes/max_nodes)"
        )
    for key in ("min_nodes", "max_nodes"):
        value = getattr(settings, key)
        if value is not None and value != nodes:
            problems.append(
                f"kubernetes setting {key}={value}: {ELASTIC_UNSUPPORTED}; leave it unset "
                f"(train.nnodes={nodes} nodes run) or set kubernetes api=pytorchjob-v1"
            )
    defaults = KubernetesJobSettings()
    for key, decided_by in RUNTIME_OWNED.items():
        value = getattr(settings, key)
        if value != getattr(defaults, key):
            problems.append(
                f"kubernetes setting {key}={value!r}: a TrainJob has no field for it; under api=trainer-v2 "
                f"{decided_by}. Leave it at its default, change the ClusterTrainingRuntime "
                f"{settings.runtime_name!r}, or set kubernetes api=pytorchjob-v1"
            )
    reserved = sorted(set(settings.env) & set(TORCHRUN_RESERVED_ENV))
    if reserved:
        problems.append(
            f"kubernetes setting env sets {reserved}: the Trainer sets these for torchrun and refuses a job that does"
        )
    return problems


def render_train_job(
    config: PipelineConfig,
    *,
    name: str,
    snapshot: str,
    input_stage: str | None = None,
    settings: KubernetesJobSettings | None = None,
    lineage: Lineage | None = None,
) -> dict[str, Any]:
    """The TrainJob for `train.nnodes` nodes x `train.nproc_per_node` processes on one snapshot."""
    input_stage = input_stage or registered_stage("train").reads[0]
    settings = settings or KubernetesJobSettings()
    lineage = lineage or Lineage()
    check_data_root(config)
    problems = unsupported_settings(config, settings)
    if problems:
        raise InvalidManifestError(
            f"TrainJob {name!r} cannot express these settings:\n  " + "\n  ".join(problems)
        )
    train = config.train
    labels, annotations = job_metadata(config, snapshot, lineage)
    pod_patch = {
        "volumes": data_volumes(settings),
        "containers": [{"name": NODE_JOB, "volumeMounts": data_volume_mounts(config)}],
        **scheduling(settings),
    }
    spec: dict[str, Any] = {
        "runtimeRef": {
            "name": settings.runtime_name,
            "apiGroup": TRAINER_V2.group,
            "kind": "ClusterTrainingRuntime",
        },
        "trainer": {
            "image": settings.image,
            "command": container_command(snapshot, input_stage, train.nproc_per_node, train.nnodes),
            "env": container_env(config, settings, name=name, lineage=lineage),
            "numNodes": train.nnodes,
            "numProcPerNode": train.nproc_per_node,
            "resourcesPerNode": node_resources(settings, train.nproc_per_node),
        },
        "runtimePatches": [
            {
                "manager": PATCH_MANAGER,
                "trainingRuntimeSpec": {
                    "template": {
                        "metadata": {"labels": dict(labels)},
                        "spec": {
                            "replicatedJobs": [
                                {
                                    "name": NODE_JOB,
                                    "template": {
                                        "metadata": {"labels": dict(labels)},
                                        "spec": {
                                            "template": {
                                                "metadata": {"labels": dict(labels)},
                                                "spec": pod_patch,
                                            }
                                        },
                                    },
                                }
                            ]
                        },
                    }
                },
            }
        ],
    }
    if settings.active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = settings.active_deadline_seconds
    job = {
        "apiVersion": TRAINER_V2.api_version,
        "kind": TRAINER_V2.kind,
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    }
    validate_train_job(job)
    return job


def render_job(
    config: PipelineConfig,
    *,
    name: str,
    snapshot: str,
    input_stage: str | None = None,
    settings: KubernetesJobSettings | None = None,
    lineage: Lineage | None = None,
) -> dict[str, Any]:
    """The job the kubernetes setting ``api`` asks for: a TrainJob (trainer-v2) or a PyTorchJob (pytorchjob-v1)."""
    settings = settings or KubernetesJobSettings()
    render = render_train_job if settings.api == TRAINER_V2.name else render_pytorch_job
    return render(
        config, name=name, snapshot=snapshot, input_stage=input_stage, settings=settings, lineage=lineage
    )


# --- the runtime ------------------------------------------------------------------------------------


@functools.cache
def shipped_runtime() -> dict[str, Any]:
    """The ClusterTrainingRuntime this package ships (``resources/torch-distributed-runtime.yaml``)."""
    (runtime,) = resource_documents(RUNTIME_FILE)
    return runtime


def _node_job(runtime: Mapping[str, Any]) -> dict[str, Any] | None:
    jobs = runtime.get("spec", {}).get("template", {}).get("spec", {}).get("replicatedJobs") or []
    trainers = [
        job
        for job in jobs
        if (job.get("template", {}).get("metadata", {}).get("labels") or {}).get(ANCESTOR_LABEL) == "trainer"
    ]
    return trainers[0] if len(trainers) == 1 else None


def runtime_errors(runtime: Mapping[str, Any]) -> list[str]:
    """A ClusterTrainingRuntime against its CRD schema, each replicated job as a batch/v1 Job, and the shape
    the torch plugin and our TrainJobs need (one trainer job named `node` with a container `node`)."""
    errors = crd_errors(runtime, RUNTIME_CRD, TRAINER_V2.version)
    spec = runtime.get("spec", {})
    if "torch" not in (spec.get("mlPolicy") or {}):
        errors.append("spec.mlPolicy.torch: required (the torch plugin injects torchrun's PET_* environment)")
    jobs = spec.get("template", {}).get("spec", {}).get("replicatedJobs") or []
    for index, job in enumerate(jobs):
        errors += core_errors(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {
                    "name": f"{runtime.get('metadata', {}).get('name', 'runtime')}-{job.get('name')}"
                },
                "spec": job.get("template", {}).get("spec", {}),
            },
            where=f"spec.template.spec.replicatedJobs.{index}.template",
        )
    node = _node_job(runtime)
    if node is None or node.get("name") != NODE_JOB:
        errors.append(
            f"spec.template.spec.replicatedJobs: needs exactly one job labelled {ANCESTOR_LABEL}=trainer, "
            f"named {NODE_JOB!r}"
        )
    else:
        containers = (
            node["template"].get("spec", {}).get("template", {}).get("spec", {}).get("containers") or []
        )
        if NODE_JOB not in [c.get("name") for c in containers]:
            errors.append(
                f"spec.template.spec.replicatedJobs.{NODE_JOB}: needs a container named {NODE_JOB!r}"
            )
    return errors


def validate_training_runtime(runtime: Mapping[str, Any]) -> None:
    errors = runtime_errors(runtime)
    if errors:
        raise InvalidManifestError(
            f"ClusterTrainingRuntime {runtime.get('metadata', {}).get('name')!r} is invalid:\n  "
            + "\n  ".join(errors)
        )


# --- the job ----------------------------------------------------------------------------------------


def node_pod(job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The node pod spec the Trainer builds from the runtime's node template, the job's trainer and its patch
    (merging lists by name, as the Trainer's server-side apply does)."""
    runtime = runtime if runtime is not None else shipped_runtime()
    node = _node_job(runtime) or {}
    pod = copy.deepcopy(node.get("template", {}).get("spec", {}).get("template", {}).get("spec", {}))
    spec = job.get("spec", {})
    trainer = spec.get("trainer") or {}
    containers = pod.setdefault("containers", [{"name": NODE_JOB}])
    (main,) = [c for c in containers if c.get("name") == NODE_JOB] or [containers[0]]
    for key, field in (
        ("image", "image"),
        ("command", "command"),
        ("args", "args"),
        ("resources", "resourcesPerNode"),
    ):
        if field in trainer:
            main[key] = copy.deepcopy(trainer[field])
    main["env"] = _by_name(main.get("env"), trainer.get("env"))
    for patch in spec.get("runtimePatches") or []:
        jobs = (
            patch.get("trainingRuntimeSpec", {}).get("template", {}).get("spec", {}).get("replicatedJobs")
            or []
        )
        for job_patch in jobs:
            if job_patch.get("name") != node.get("name"):
                continue
            pod_patch = job_patch.get("template", {}).get("spec", {}).get("template", {}).get("spec", {})
            for key, value in pod_patch.items():
                if key == "containers":
                    for container_patch in value:
                        target = [c for c in containers if c.get("name") == container_patch.get("name")]
                        for name, patched in container_patch.items():
                            if target and name != "name":
                                target[0][name] = (
                                    _by_name(target[0].get(name), patched)
                                    if isinstance(patched, list)
                                    else copy.deepcopy(patched)
                                )
                elif key == "volumes":
                    pod[key] = _by_name(pod.get(key), value)
                else:
                    pod[key] = copy.deepcopy(value)
    return pod


def _by_name(base: list[dict[str, Any]] | None, patch: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    merged = {item["name"]: copy.deepcopy(item) for item in base or []}
    merged.update({item["name"]: copy.deepcopy(item) for item in patch or []})
    return list(merged.values())


def controller_errors(job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[str]:
    """The rules of the Trainer's TrainJob webhook that our jobs depend on."""
    runtime = runtime if runtime is not None else shipped_runtime()
    errors = dns_label_errors(job.get("metadata", {}).get("name", ""))
    spec = job.get("spec", {})
    trainer = spec.get("trainer") or {}
    if not trainer.get("image"):
        errors.append("spec.trainer.image: required")
    if isinstance(trainer.get("numNodes"), int) and trainer["numNodes"] < 1:
        errors.append("spec.trainer.numNodes: must be at least 1")
    reserved = sorted({e.get("name") for e in trainer.get("env") or []} & set(TORCHRUN_RESERVED_ENV))
    if reserved:
        errors.append(f"spec.trainer.env: must not have reserved envs, invalid envs configured: {reserved}")
    node = _node_job(runtime) or {}
    for index, patch in enumerate(spec.get("runtimePatches") or []):
        jobs = (
            patch.get("trainingRuntimeSpec", {}).get("template", {}).get("spec", {}).get("replicatedJobs")
            or []
        )
        for job_patch in jobs:
            if job_patch.get("name") != node.get("name"):
                errors.append(
                    f"spec.runtimePatches.{index}: replicated job {job_patch.get('name')!r} is not in the runtime"
                )
            pod_patch = job_patch.get("template", {}).get("spec", {}).get("template", {}).get("spec", {})
            for container in pod_patch.get("containers") or []:
                if container.get("name") == NODE_JOB and container.get("env"):
                    errors.append(
                        f"spec.runtimePatches.{index}: env of container {NODE_JOB!r} can only be set in spec.trainer.env"
                    )
    return errors


def validate_train_job(job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> None:
    """Raise InvalidManifestError listing every problem; silent when the TrainJob is valid."""
    name = job.get("metadata", {}).get("name", "trainjob")
    errors = controller_errors(job, runtime) + crd_errors(job, TRAINJOB_CRD, TRAINER_V2.version)
    if not errors:  # the merge reads what the schema checked
        errors += pod_errors(
            node_pod(job, runtime),
            name=f"{name}-node-0-0",
            where="<node pod from spec.trainer + runtimePatches>",
        )
    if errors:
        raise InvalidManifestError(f"TrainJob {name!r} is invalid:\n  " + "\n  ".join(errors))
