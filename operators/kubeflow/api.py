"""The two Kubeflow job APIs the Kubernetes launcher speaks, and what differs between them for the operator.

The kubernetes setting ``api`` picks one: ``trainer-v2`` (Kubeflow Trainer v2: a ``TrainJob`` that references
a ``ClusterTrainingRuntime``, rendered by ``trainjob.py``) or ``pytorchjob-v1`` (the legacy training-operator's
``PyTorchJob``, rendered by ``manifest.py``). Creating, polling, reading the node-0 pod's log and deleting
are the same calls for both (``client.py``, ``trigger.py``); only the resource path, the condition that
means success and the labels of the node-0 pod differ, and those live here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JobApi:
    name: str
    """The value of the kubernetes setting ``api``."""
    group: str
    version: str
    plural: str
    kind: str
    container: str
    """The training container, whose log is copied into the task log."""
    succeeded: str
    """The condition type of a job that finished successfully."""
    name_label: str
    """The pod label that holds the job's name."""
    node0_labels: tuple[tuple[str, str], ...]
    """Further pod labels that single out the first node's pod (rank 0)."""

    failed = "Failed"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def terminal_states(self) -> tuple[str, str]:
        return (self.succeeded, self.failed)

    def node0_selector(self, name: str) -> str:
        return ",".join(f"{key}={value}" for key, value in ((self.name_label, name), *self.node0_labels))


PYTORCHJOB_V1 = JobApi(
    name="pytorchjob-v1",
    group="kubeflow.org",
    version="v1",
    plural="pytorchjobs",
    kind="PyTorchJob",
    container="pytorch",  # the training-operator finds the training container by this name
    succeeded="Succeeded",
    name_label="training.kubeflow.org/job-name",
    node0_labels=(("training.kubeflow.org/job-role", "master"),),
)
# A TrainJob runs as a JobSet of its name; the node-0 pod is completion index 0 of the first `node` Job.
TRAINER_V2 = JobApi(
    name="trainer-v2",
    group="trainer.kubeflow.org",
    version="v1alpha1",
    plural="trainjobs",
    kind="TrainJob",
    container="node",  # the trainer finds the training container by this name
    succeeded="Complete",
    name_label="jobset.sigs.k8s.io/jobset-name",
    node0_labels=(
        ("jobset.sigs.k8s.io/replicatedjob-name", "node"),
        ("jobset.sigs.k8s.io/job-index", "0"),
        ("batch.kubernetes.io/job-completion-index", "0"),
    ),
)
APIS = {api.name: api for api in (TRAINER_V2, PYTORCHJOB_V1)}
DEFAULT_API = TRAINER_V2.name


def job_api(name: str) -> JobApi:
    try:
        return APIS[name]
    except KeyError:
        raise ValueError(f"kubernetes setting api={name!r} is not one of {sorted(APIS)}") from None


def job_state(job: Mapping[str, Any] | None, api: JobApi = PYTORCHJOB_V1) -> tuple[str, str]:
    """(state, message) from the job's conditions: the terminal one when there is one, else the latest true one.

    A TrainJob has no Running condition (only Suspended, Complete, Failed); it is Running while one of its
    child Jobs is active, and Pending before that.
    """
    if job is None:
        return "Missing", f"the {api.kind} no longer exists"
    status = job.get("status") or {}
    true = [c for c in status.get("conditions") or [] if c.get("status") == "True"]
    for terminal in api.terminal_states:
        for condition in true:
            if condition.get("type") == terminal:
                return terminal, condition.get("message") or ""
    if true:
        return true[-1].get("type", "Unknown"), true[-1].get("message") or ""
    if any((child.get("active") or 0) > 0 for child in status.get("jobsStatus") or []):
        return "Running", ""
    return "Pending", ""
