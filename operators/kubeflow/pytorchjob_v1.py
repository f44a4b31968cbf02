"""Render and validate a legacy Kubeflow ``kubeflow.org/v1`` PyTorchJob for one training run (the pod parts and
settings it shares with the TrainJob renderer are in ``operators.kubeflow.job_parts``).

The job runs the same entrypoint as the local launcher (`torchrun -m pipeline.train`) in the pipeline image.
The resolved config travels inside the manifest (an environment variable the container writes to a file), so
the job is self-describing: `kubectl get pytorchjob -o yaml` shows exactly what was trained. Data and
checkpoints live on a shared PersistentVolumeClaim mounted at ``project.data_root``, so Airflow workers that
mount the same volume at the same path read the results (the report task) without copying.

Validation has two parts: each replica's pod spec against the core Kubernetes OpenAPI schema
(kubernetes-validate), and the whole object against the PyTorchJob CRD's OpenAPI schema kept in
``resources/`` of this package, plus the rules the training-operator's admission webhook enforces.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from operators.kubeflow.api import PYTORCHJOB_V1
from operators.kubeflow.job_parts import (
    InvalidManifestError,
    KubernetesJobSettings,
    check_data_root,
    container_command,
    container_env,
    container_security_context,
    crd_errors,
    data_volume_mounts,
    data_volumes,
    dns_label_errors,
    job_metadata,
    node_resources,
    pod_errors,
    pod_security_context,
    scheduling,
)
from pipeline.config import PipelineConfig
from pipeline.core.lineage import Lineage
from pipeline.stages import stage as registered_stage

GROUP = PYTORCHJOB_V1.group
VERSION = PYTORCHJOB_V1.version
PLURAL = PYTORCHJOB_V1.plural
KIND = PYTORCHJOB_V1.kind
CONTAINER_NAME = PYTORCHJOB_V1.container
PORT_NAME = "pytorchjob-port"  # the training-operator finds the rendezvous port by this name
CRD = "kubeflow.org_pytorchjobs.yaml"

RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
CLEAN_POD_POLICIES = ("None", "Running", "All")


def _pod_template(
    config: PipelineConfig,
    settings: KubernetesJobSettings,
    *,
    name: str,
    snapshot: str,
    input_stage: str,
    lineage: Lineage,
    labels: dict[str, str],
) -> dict[str, Any]:
    nproc = config.train.nproc_per_node
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": CONTAINER_NAME,
                "image": settings.image,
                "imagePullPolicy": settings.image_pull_policy,
                "command": container_command(snapshot, input_stage, nproc, config.train.nnodes),
                "env": container_env(config, settings, name=name, lineage=lineage),
                "ports": [{"name": PORT_NAME, "containerPort": settings.rdzv_port, "protocol": "TCP"}],
                "resources": node_resources(settings, nproc),
                "securityContext": container_security_context(),
                "volumeMounts": data_volume_mounts(config),
            }
        ],
        "securityContext": pod_security_context(),
        "volumes": data_volumes(settings),
        **scheduling(settings),
    }
    return {"metadata": {"labels": dict(labels)}, "spec": spec}


def render_pytorch_job(
    config: PipelineConfig,
    *,
    name: str,
    snapshot: str,
    input_stage: str | None = None,
    settings: KubernetesJobSettings | None = None,
    lineage: Lineage | None = None,
) -> dict[str, Any]:
    """The PyTorchJob for `train.nnodes` nodes x `train.nproc_per_node` processes on one snapshot.

    One node: a single Master replica. More: one Master plus nodes-1 Workers under an elastic policy
    (c10d rendezvous, min/max nodes, maxRestarts), so a lost node restarts the group rather than the job.
    """
    input_stage = input_stage or registered_stage("train").reads[0]
    settings = settings or KubernetesJobSettings()
    lineage = lineage or Lineage()
    check_data_root(config)
    nodes = config.train.nnodes
    labels, annotations = job_metadata(config, snapshot, lineage)
    template = _pod_template(
        config,
        settings,
        name=name,
        snapshot=snapshot,
        input_stage=input_stage,
        lineage=lineage,
        labels=labels,
    )
    replica = {"restartPolicy": settings.restart_policy, "template": template}
    replicas: dict[str, Any] = {"Master": {"replicas": 1, **copy.deepcopy(replica)}}
    spec: dict[str, Any] = {"nprocPerNode": str(config.train.nproc_per_node)}
    if nodes > 1:
        replicas["Worker"] = {"replicas": nodes - 1, **copy.deepcopy(replica)}
        spec["elasticPolicy"] = {
            "rdzvBackend": "c10d",
            "minReplicas": settings.min_nodes or nodes,
            "maxReplicas": settings.max_nodes or nodes,
            "maxRestarts": settings.max_restarts,
        }
    spec["pytorchReplicaSpecs"] = replicas
    run_policy: dict[str, Any] = {
        "cleanPodPolicy": settings.clean_pod_policy,
        "backoffLimit": settings.backoff_limit,
    }
    if settings.ttl_seconds_after_finished is not None:
        run_policy["ttlSecondsAfterFinished"] = settings.ttl_seconds_after_finished
    if settings.active_deadline_seconds is not None:
        run_policy["activeDeadlineSeconds"] = settings.active_deadline_seconds
    spec["runPolicy"] = run_policy
    job = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    }
    validate_pytorch_job(job)
    return job


def core_type_errors(job: Mapping[str, Any], kubernetes_version: str | None = None) -> list[str]:
    """Validate each replica's pod template as a core/v1 Pod with kubernetes-validate (strict)."""
    errors = []
    for replica_type, replica in (job.get("spec", {}).get("pytorchReplicaSpecs") or {}).items():
        template = replica.get("template") or {}
        errors += pod_errors(
            template.get("spec", {}),
            name=f"{job['metadata']['name']}-{replica_type.lower()}-0",
            where=f"spec.pytorchReplicaSpecs.{replica_type}.template",
            metadata=template.get("metadata"),
            kubernetes_version=kubernetes_version,
        )
    return errors


def controller_errors(job: Mapping[str, Any]) -> list[str]:
    """The checks of the training-operator's validating webhook and of our own settings."""
    errors = dns_label_errors(job.get("metadata", {}).get("name", ""))
    spec = job.get("spec", {})
    replicas = spec.get("pytorchReplicaSpecs") or {}
    for replica_type, replica in replicas.items():
        where = f"spec.pytorchReplicaSpecs.{replica_type}"
        if replica_type not in ("Master", "Worker"):
            errors.append(f"{where}: replica type must be Master or Worker")
        count = replica.get("replicas", 1)
        if replica_type == "Master" and count != 1:
            errors.append(f"{where}.replicas: must be 1")
        if replica_type == "Worker" and count < 1:
            errors.append(f"{where}.replicas: must be at least 1")
        if replica.get("restartPolicy", "Never") not in RESTART_POLICIES:
            errors.append(f"{where}.restartPolicy: must be one of {RESTART_POLICIES}")
        containers = replica.get("template", {}).get("spec", {}).get("containers") or []
        named = [c for c in containers if c.get("name") == CONTAINER_NAME]
        if not named:
            errors.append(f"{where}: needs a container named {CONTAINER_NAME!r}")
        elif not named[0].get("image"):
            errors.append(f"{where}.template.spec.containers.{CONTAINER_NAME}.image: required")
    elastic = spec.get("elasticPolicy")
    if elastic is not None:
        if "Worker" not in replicas:
            errors.append("spec.pytorchReplicaSpecs.Worker: must be configured if elastic policy is used")
        low, high = elastic.get("minReplicas"), elastic.get("maxReplicas")
        if low is not None and high is not None and low > high:
            errors.append("spec.elasticPolicy: minReplicas must not exceed maxReplicas")
    clean = spec.get("runPolicy", {}).get("cleanPodPolicy")
    if clean is not None and clean not in CLEAN_POD_POLICIES:
        errors.append(f"spec.runPolicy.cleanPodPolicy: must be one of {CLEAN_POD_POLICIES}")
    return errors


def validate_pytorch_job(job: Mapping[str, Any]) -> None:
    """Raise InvalidManifestError listing every problem; silent when the job is valid."""
    errors = controller_errors(job) + crd_errors(job, CRD, VERSION) + core_type_errors(job)
    if errors:
        raise InvalidManifestError(
            f"PyTorchJob {job.get('metadata', {}).get('name')!r} is invalid:\n  " + "\n  ".join(errors)
        )
