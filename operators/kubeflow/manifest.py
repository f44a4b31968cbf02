"""Render and validate a Kubeflow ``kubeflow.org/v1`` PyTorchJob for one training run; the job settings and the
pod parts (command, environment, resources, volumes, labels) that the TrainJob renderer shares.

The job runs the same entrypoint as the local launcher (`torchrun -m pipeline.train`) in the pipeline image.
The resolved config travels inside the manifest (an environment variable the container writes to a file), so
the job is self-describing: `kubectl get pytorchjob -o yaml` shows exactly what was trained. Data and
checkpoints live on a shared PersistentVolumeClaim mounted at ``project.data_root``, so Airflow workers that
mount the same volume at the same path read the results (the report task) without copying.

Validation has two parts: each replica's pod spec against the core Kubernetes OpenAPI schema
(kubernetes-validate), and the whole object against the PyTorchJob CRD's OpenAPI schema kept in
``docker/k8s/crds/``, plus the rules the training-operator's admission webhook enforces.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from operators.kubeflow.api import DEFAULT_API, PYTORCHJOB_V1, job_api
from operators.kubeflow.api import job_state as job_state  # re-exported for the v1 path's callers
from pipeline.config import PipelineConfig
from pipeline.core.config import PROJECT_ROOT
from pipeline.core.lineage import Lineage
from pipeline.stages import stage as registered_stage

GROUP = PYTORCHJOB_V1.group
VERSION = PYTORCHJOB_V1.version
PLURAL = PYTORCHJOB_V1.plural
KIND = PYTORCHJOB_V1.kind
CONTAINER_NAME = PYTORCHJOB_V1.container
PORT_NAME = "pytorchjob-port"  # the training-operator finds the rendezvous port by this name
K8S_DIR = PROJECT_ROOT / "docker" / "k8s"
CRD_PATH = K8S_DIR / "crds" / "kubeflow.org_pytorchjobs.yaml"
CONFIG_ENV = "PRETRAIN_CONFIG_YAML"
CONFIG_FILE_IN_POD = "/tmp/pretrain-config.yaml"

RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
CLEAN_POD_POLICIES = ("None", "Running", "All")
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
    """trainer-v2: the ClusterTrainingRuntime the TrainJob references (docker/k8s/torch-distributed-runtime.yaml)."""
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
    if train.pipeline_stages > 1:
        # For whoever reads the job: the pods' ranks form pp x dp (the config in the pods says the same).
        ranks = train.nnodes * train.nproc_per_node
        annotations["pretrain.dev/pipeline"] = (
            f"pp={train.pipeline_stages} x dp={ranks // train.pipeline_stages}, {train.pipeline_schedule}, "
            f"microbatches={train.pipeline_microbatches}, stages_per_rank={train.stages_per_rank}"
        )
    return labels, annotations


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
    input_stage = input_stage or registered_stage("train").default_input
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


@functools.cache
def crd_schema(path: Path = CRD_PATH, version: str = VERSION) -> dict[str, Any]:
    """The openAPIV3Schema of one version of a vendored CRD (the PyTorchJob's by default), as strict JSON Schema."""
    documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    (crd,) = [doc for doc in documents if doc.get("kind") == "CustomResourceDefinition"]
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return _strict(served["schema"]["openAPIV3Schema"])


def crd_errors(job: Mapping[str, Any], path: Path = CRD_PATH, version: str = VERSION) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft7Validator(
        crd_schema(path, version), format_checker=jsonschema.FormatChecker()
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


def dns_label_errors(name: str) -> list[str]:
    if not _DNS1035.match(name) or len(name) > 63:
        return [f"metadata.name: {name!r} is not a DNS-1035 label (lowercase, starts with a letter)"]
    return []


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


def validate_pytorch_job(job: Mapping[str, Any], crd_path: Path = CRD_PATH) -> None:
    """Raise InvalidManifestError listing every problem; silent when the job is valid."""
    errors = controller_errors(job) + crd_errors(job, crd_path) + core_type_errors(job)
    if errors:
        raise InvalidManifestError(
            f"PyTorchJob {job.get('metadata', {}).get('name')!r} is invalid:\n  " + "\n  ".join(errors)
        )
