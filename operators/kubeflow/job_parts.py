"""What every Kubeflow training job we render shares, whichever API renders it: the cluster settings, the pod
(command, environment, resources, security, volumes, scheduling, labels), and validation against vendored CRD
schemas and the core Kubernetes types.

The renderers are named by the API they render: ``operators.kubeflow.trainjob`` (Kubeflow Trainer v2
``TrainJob``, the default) and ``operators.kubeflow.pytorchjob_v1`` (the legacy ``kubeflow.org/v1``
PyTorchJob). The CRD schemas and the shipped ClusterTrainingRuntime are package data (``resources/``, read with
``importlib.resources``), so an installed wheel renders jobs wherever it runs; ``docker/k8s/`` links to them
for ``kubectl apply``.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from typing import Any

import yaml

from operators.kubeflow.api import DEFAULT_API, job_api
from pipeline.config import PipelineConfig
from pipeline.core.lineage import Lineage

CONFIG_ENV = "PRETRAIN_CONFIG_YAML"
CONFIG_FILE_IN_POD = "/tmp/pretrain-config.yaml"

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")


class InvalidManifestError(ValueError):
    """The rendered job would be rejected by the API server or the Kubeflow controller, or cannot express
    the settings asked for."""


@dataclass(frozen=True)
class KubernetesJobSettings:
    """Where and how the job runs on the cluster. Defaults suit one GPU per process on NVIDIA nodes."""

    api: str = DEFAULT_API
    """trainer-v2: a Kubeflow Trainer v2 TrainJob; pytorchjob-v1: a legacy training-operator PyTorchJob."""
    runtime_name: str = "pretrain-torch-distributed"
    """trainer-v2: the ClusterTrainingRuntime the TrainJob references (resources/torch-distributed-runtime.yaml)."""
    image: str = "pretrain-pipeline:latest"
    image_pull_policy: str = "IfNotPresent"
    namespace: str = "pretrain"  # docker/k8s/namespace.yaml: the jobs, the Spark pods and the data volume
    pvc_name: str = "pretrain-data"
    gpus_per_node: int | None = None
    """nvidia.com/gpu per pod; None means one per process (train.nproc_per_node), 0 a CPU-only job."""
    cpu: str = "8"
    memory: str = "32Gi"
    shm_size: str = "8Gi"
    min_nodes: int | None = None
    """Elastic lower bound on nodes (Master included); None means the requested node count."""
    max_nodes: int | None = None
    max_restarts: int = 3
    restart_policy: str = "OnFailure"
    clean_pod_policy: str = "Running"
    backoff_limit: int = 3
    ttl_seconds_after_finished: int | None = 86_400
    active_deadline_seconds: int | None = None
    rdzv_port: int = 23456
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    service_account_name: str | None = None
    env: dict[str, str] = field(
        default_factory=lambda: {
            "NCCL_DEBUG": "WARN",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
            "NCCL_SOCKET_IFNAME": "eth0",
        }
    )
    """Extra container environment; the defaults are the NCCL settings."""

    def __post_init__(self) -> None:
        job_api(self.api)  # an unknown api fails here, naming the setting

    def merged(self, values: Mapping[str, Any] | None) -> KubernetesJobSettings:
        """A copy with some settings replaced (from operator kwargs or an Airflow Variable); unknown keys fail."""
        values = dict(values or {})
        known = {f.name for f in fields(self)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown Kubernetes job setting(s) {unknown}; known: {sorted(known)}")
        return replace(self, **values)


def job_name(dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
    """A DNS-1035 name that is the same for every try of one task instance, so a retry finds its job.

    At most 52 characters, leaving room for the pod names the operator derives (`<job>-worker-<i>`).
    """
    digest = hashlib.sha256(f"{dag_id}\0{run_id}\0{task_id}\0{map_index}".encode()).hexdigest()[:12]
    stem = re.sub(r"[^a-z0-9]+", "-", task_id.lower()).strip("-")[:28].strip("-") or "job"
    return f"pretrain-{stem}-{digest}"


def label_value(value: Any) -> str:
    """Kubernetes label values: at most 63 characters of [A-Za-z0-9_.-], alphanumeric at both ends."""
    return _LABEL_VALUE.sub("_", str(value))[:63].strip("_.-")


def container_command(snapshot: str, input_stage: str, nproc_per_node: int, nodes: int) -> list[str]:
    # torchrun takes the rendezvous from the PET_* environment the Kubeflow controller sets (v1: PET_NNODES,
    # PET_RDZV_* and PET_MAX_RESTARTS of the elastic policy; v2: PET_NNODES, PET_NODE_RANK and
    # PET_MASTER_ADDR/PORT for a static rendezvous); a one-node job needs no rendezvous at all.
    rendezvous = "--standalone " if nodes == 1 else ""
    script = (
        f'printf "%s" "${CONFIG_ENV}" > {CONFIG_FILE_IN_POD} && '
        f"exec python -m torch.distributed.run {rendezvous}--nproc_per_node={nproc_per_node} "
        f'-m pipeline.train --config {CONFIG_FILE_IN_POD} --snapshot "$1" --input-stage "$2"'
    )
    return ["/bin/sh", "-c", script, "pretrain-train", snapshot, input_stage]


# The uid and gid the images run as (docker/*.Dockerfile: USER 10001:10001); the kubelet checks runAsNonRoot
# against runAsUser, not against the image's USER name.
RUN_AS = 10001


def pod_security_context() -> dict[str, Any]:
    """Pod level: non-root, the images' uid, files on the data volume group-owned, the default seccomp."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    """Container level: no privilege escalation, no Linux capabilities (NCCL over TCP or IB verbs needs none)."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def node_resources(settings: KubernetesJobSettings, nproc_per_node: int) -> dict[str, dict[str, Any]]:
    """Each node's (pod's) requests and limits: CPU, memory and nvidia.com/gpu, one GPU per process by default.
    Limits equal requests, so a node pod has the Guaranteed QoS class and is the last to be evicted."""
    gpus = nproc_per_node if settings.gpus_per_node is None else settings.gpus_per_node
    resources: dict[str, dict[str, Any]] = {
        "requests": {"cpu": settings.cpu, "memory": settings.memory},
        "limits": {"cpu": settings.cpu, "memory": settings.memory},
    }
    if gpus:
        resources["requests"]["nvidia.com/gpu"] = gpus
        resources["limits"]["nvidia.com/gpu"] = gpus
    return resources


def container_env(
    config: PipelineConfig, settings: KubernetesJobSettings, *, name: str, lineage: Lineage
) -> list[dict[str, str]]:
    """The training container's environment: NCCL settings, lineage, the run's name and the whole config."""
    env = {
        **settings.env,
        **lineage.to_env(),
        "PYTHONUNBUFFERED": "1",
        "PRETRAIN_RUN_ID": name,
        CONFIG_ENV: config.to_yaml(),
    }
    return [{"name": key, "value": str(value)} for key, value in env.items()]


def data_volumes(settings: KubernetesJobSettings) -> list[dict[str, Any]]:
    """The shared data/checkpoint volume (a PVC) and a memory-backed /dev/shm for the data loader and NCCL."""
    return [
        {"name": "data", "persistentVolumeClaim": {"claimName": settings.pvc_name}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": settings.shm_size}},
    ]


def data_volume_mounts(config: PipelineConfig) -> list[dict[str, str]]:
    return [
        {"name": "data", "mountPath": config.project.data_root},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]


def scheduling(settings: KubernetesJobSettings) -> dict[str, Any]:
    """Pod spec fields for where the pods run and as whom: node selector, tolerations, service account."""
    spec: dict[str, Any] = {}
    if settings.node_selector:
        spec["nodeSelector"] = dict(settings.node_selector)
    if settings.tolerations:
        spec["tolerations"] = copy.deepcopy(settings.tolerations)
    if settings.service_account_name:
        spec["serviceAccountName"] = settings.service_account_name
    return spec


def check_data_root(config: PipelineConfig) -> None:
    if "://" in config.project.data_root:
        raise InvalidManifestError(
            f"project.data_root {config.project.data_root!r} is a URI; the Kubernetes launcher mounts a "
            "PersistentVolumeClaim at project.data_root, so it must be a local path"
        )


def job_metadata(
    config: PipelineConfig, snapshot: str, lineage: Lineage
) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) of the job and its pods: what it trains, for whom (lineage), with which config."""
    labels = {
        "app.kubernetes.io/name": "pretrain-pipeline",
        "app.kubernetes.io/component": "train",
        "app.kubernetes.io/managed-by": "airflow",
        "pretrain.dev/corpus": label_value(config.project.corpus),
        "pretrain.dev/snapshot": label_value(snapshot),
    }
    if lineage.dag_id:
        labels["pretrain.dev/dag-id"] = label_value(lineage.dag_id)
    annotations = {
        f"pretrain.dev/{key.replace('_', '-')}": str(value)
        for key, value in lineage.to_dict().items()
        if value is not None
    }
    annotations["pretrain.dev/config-hash"] = config.hash
    train = config.train
    if train.pp_degree > 1:
        # For whoever reads the job: the pods' ranks form pp x dp (the config in the pods says the same).
        ranks = train.nnodes * train.nproc_per_node
        annotations["pretrain.dev/pipeline"] = (
            f"pp={train.pp_degree} x dp={ranks // train.pp_degree}, {train.pp_schedule}, "
            f"pp_microbatches={train.pp_microbatch_count}, pp_virtual_stages={train.pp_virtual_stages}"
        )
    if train.data_parallel == "fsdp" and train.dp_replicate > 1:
        # HSDP: rows of dp_shard consecutive ranks (a node when dp_shard is nproc_per_node) shard the model.
        ranks = train.nnodes * train.nproc_per_node
        annotations["pretrain.dev/hsdp"] = (
            f"dp_replicate={train.dp_replicate} x dp_shard={ranks // train.dp_replicate}"
        )
    return labels, annotations


# --- validation -------------------------------------------------------------------------------------


def _strict(schema: Any) -> Any:
    """The CRD's structural schema as JSON Schema that rejects unknown fields.

    The API server prunes unknown fields of a CRD object silently, so a typo such as `rdzvBackEnd` would
    vanish on create; rejecting it here turns that into an error that names the field.
    """
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    converted = {key: _strict(value) for key, value in schema.items() if not key.startswith("x-kubernetes-")}
    if (
        schema.get("type") == "object"
        and "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        converted["additionalProperties"] = False
    if schema.get("x-kubernetes-int-or-string"):
        converted.pop("type", None)
    return converted


def resource_documents(name: str) -> list[dict[str, Any]]:
    """The YAML documents of one file of this package's ``resources/`` (a CRD schema, the shipped runtime)."""
    text = (resources.files("operators.kubeflow") / "resources" / name).read_text(encoding="utf-8")
    return [doc for doc in yaml.safe_load_all(text) if doc]


@functools.cache
def crd_schema(crd: str, version: str) -> dict[str, Any]:
    """The openAPIV3Schema of one version of a vendored CRD (a file of ``resources/``), as strict JSON Schema."""
    documents = resource_documents(crd)
    (definition,) = [doc for doc in documents if doc.get("kind") == "CustomResourceDefinition"]
    (served,) = [v for v in definition["spec"]["versions"] if v["name"] == version]
    return _strict(served["schema"]["openAPIV3Schema"])


def crd_errors(job: Mapping[str, Any], crd: str, version: str) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft7Validator(
        crd_schema(crd, version), format_checker=jsonschema.FormatChecker()
    )
    return [
        f"{'.'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
        for error in sorted(validator.iter_errors(dict(job)), key=lambda e: list(map(str, e.absolute_path)))
    ]


def pod_errors(
    pod_spec: Mapping[str, Any],
    *,
    name: str,
    where: str,
    metadata: Mapping[str, Any] | None = None,
    kubernetes_version: str | None = None,
) -> list[str]:
    """A pod spec as a core/v1 Pod, checked with kubernetes-validate (strict); errors read ``where.spec...``."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **(metadata or {})},
        "spec": dict(pod_spec),
    }
    return core_errors(pod, where=where, kubernetes_version=kubernetes_version)


def core_errors(
    document: Mapping[str, Any], *, where: str, kubernetes_version: str | None = None
) -> list[str]:
    """A core Kubernetes object checked with kubernetes-validate (strict); its error reads ``where.<path>``."""
    import kubernetes_validate

    version = kubernetes_version or kubernetes_validate.latest_version()
    try:
        kubernetes_validate.validate(dict(document), version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join([where, *map(str, exc.absolute_path)])}: {exc.message}"]
    return []


def dns_label_errors(name: str) -> list[str]:
    if not _DNS1035.match(name) or len(name) > 63:
        return [f"metadata.name: {name!r} is not a DNS-1035 label (lowercase, starts with a letter)"]
    return []
