"""The four Kubernetes API calls the Kubernetes launcher makes: create, read and delete the job, read logs.

The same calls for a v1 PyTorchJob and a v2 TrainJob; ``api`` (``operators.kubeflow.api``) says which
resource and which pod is node 0.

Synchronous (the operator, in a worker) through the `kubernetes` client; the trigger polls with the
async client of the same connection (see ``trigger.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi, V1DeleteOptions
from kubernetes.client.exceptions import ApiException

from operators.kubeflow.api import PYTORCHJOB_V1, JobApi

log = logging.getLogger(__name__)


def api_client_for(conn_id: str) -> ApiClient:
    """An ApiClient from an Airflow Kubernetes connection (kubeconfig path or content, or in-cluster)."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    return KubernetesHook(conn_id=conn_id).get_conn()


class KubeflowJobClient:
    def __init__(self, api_client: ApiClient, namespace: str, api: JobApi = PYTORCHJOB_V1) -> None:
        self.namespace = namespace
        self.api = api
        self.custom = CustomObjectsApi(api_client)
        self.core = CoreV1Api(api_client)

    def create(self, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
        """Create the job; None when one with that name already exists (another try created it)."""
        try:
            return self.custom.create_namespaced_custom_object(
                self.api.group, self.api.version, self.namespace, self.api.plural, dict(manifest)
            )
        except ApiException as exc:
            if exc.status == 409:
                return None
            raise

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(
                self.api.group, self.api.version, self.namespace, self.api.plural, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def delete(self, name: str) -> bool:
        """Delete the job and, in the background, its pods and services; False when it was already gone."""
        try:
            self.custom.delete_namespaced_custom_object(
                self.api.group,
                self.api.version,
                self.namespace,
                self.api.plural,
                name,
                body=V1DeleteOptions(propagation_policy="Background"),
            )
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def wait_deleted(self, name: str, timeout_s: float = 120.0, poll_s: float = 2.0) -> None:
        """Deletion is asynchronous (finalizers); a new job of the same name can only be created after it."""
        deadline = time.monotonic() + timeout_s
        while self.get(name) is not None:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.api.kind} {self.namespace}/{name} still exists {timeout_s:.0f}s after delete"
                )
            time.sleep(poll_s)

    def node0_logs(self, name: str, tail_lines: int | None = 5000) -> str:
        """The training container's log of the job's node-0 pod (rank 0: the v1 Master, the v2 node 0), '' when
        the pod is gone. After a restart of the group, the newest such pod."""
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector=self.api.node0_selector(name)
        ).items
        if not pods:
            return ""
        pod = max(
            pods,
            key=lambda p: (
                p.metadata.creation_timestamp is not None,
                p.metadata.creation_timestamp,
                p.metadata.name,
            ),
        )
        try:
            # Raw bytes: the client's own str decoding of log bodies is not reliable across versions.
            response = self.core.read_namespaced_pod_log(
                pod.metadata.name,
                self.namespace,
                container=self.api.container,
                tail_lines=tail_lines,
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status in (400, 404):  # the container never started, or the pod went away
                log.warning("no log for pod %s: %s", pod.metadata.name, exc.reason)
                return ""
            raise
        return response.data.decode("utf-8", "replace")
