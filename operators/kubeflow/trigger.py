"""Deferrable wait for a PyTorchJob: poll its conditions in the triggerer until it succeeds or fails."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from operators.kubeflow.manifest import GROUP, PLURAL, TERMINAL_STATES, VERSION, job_state

MAX_CONSECUTIVE_ERRORS = 5


class PyTorchJobTrigger(BaseTrigger):
    """Fires once with {"name", "namespace", "state", "message"} when the job is Succeeded, Failed or gone.

    Transient API errors are retried (up to MAX_CONSECUTIVE_ERRORS polls in a row) rather than failing a
    long training job because the API server blinked. When a user kills the deferred task (mark failed,
    clear), ``on_kill`` deletes the job; a triggerer restart does not.
    """

    def __init__(
        self,
        *,
        name: str,
        namespace: str,
        kubernetes_conn_id: str = "kubernetes_default",
        poll_interval: float = 15.0,
        delete_on_kill: bool = True,
    ) -> None:
        super().__init__()
        self.name = name
        self.namespace = namespace
        self.kubernetes_conn_id = kubernetes_conn_id
        self.poll_interval = poll_interval
        self.delete_on_kill = delete_on_kill

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "name": self.name,
                "namespace": self.namespace,
                "kubernetes_conn_id": self.kubernetes_conn_id,
                "poll_interval": self.poll_interval,
                "delete_on_kill": self.delete_on_kill,
            },
        )

    def _hook(self):
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook

        return AsyncKubernetesHook(conn_id=self.kubernetes_conn_id)

    async def get_job(self) -> dict[str, Any] | None:
        from kubernetes_asyncio.client import CustomObjectsApi
        from kubernetes_asyncio.client.exceptions import ApiException

        async with self._hook().get_conn() as api_client:
            try:
                return await CustomObjectsApi(api_client).get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, self.name
                )
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise

    async def run(self) -> AsyncIterator[TriggerEvent]:
        errors = 0
        last_state = None
        while True:
            try:
                job = await self.get_job()
                errors = 0
            except Exception as exc:
                errors += 1
                self.log.warning(
                    "polling PyTorchJob %s/%s failed (%d): %s", self.namespace, self.name, errors, exc
                )
                if errors >= MAX_CONSECUTIVE_ERRORS:
                    yield self._event("Error", f"{errors} polls in a row failed; last error: {exc}")
                    return
                await asyncio.sleep(self.poll_interval)
                continue
            state, message = job_state(job)
            if state != last_state:
                self.log.info("PyTorchJob %s/%s is %s %s", self.namespace, self.name, state, message)
                last_state = state
            if state in (*TERMINAL_STATES, "Missing"):
                yield self._event(state, message)
                return
            await asyncio.sleep(self.poll_interval)

    def _event(self, state: str, message: str) -> TriggerEvent:
        return TriggerEvent(
            {"name": self.name, "namespace": self.namespace, "state": state, "message": message}
        )

    async def on_kill(self) -> None:
        if not self.delete_on_kill:
            return
        from kubernetes_asyncio.client import CustomObjectsApi, V1DeleteOptions
        from kubernetes_asyncio.client.exceptions import ApiException

        async with self._hook().get_conn() as api_client:
            try:
                await CustomObjectsApi(api_client).delete_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    self.namespace,
                    PLURAL,
                    self.name,
                    body=V1DeleteOptions(propagation_policy="Background"),
                )
                self.log.info("task killed: deleted PyTorchJob %s/%s", self.namespace, self.name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
