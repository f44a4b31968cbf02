"""Deferrable wait for a Kubeflow job (v1 PyTorchJob, v2 TrainJob): poll its conditions in the triggerer until it
succeeds or fails."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from operators.kubeflow.api import PYTORCHJOB_V1, TRAINER_V2, JobApi, job_state

MAX_CONSECUTIVE_ERRORS = 5


class KubeflowJobTrigger(BaseTrigger):
    """Fires once with {"name", "namespace", "api", "state", "message", "run"} when the job succeeded, failed or is
    gone. ``run`` is the training run the job trains, handed back to the resumed task in the event itself:
    Airflow's dag.test() resumes a task with the event alone, dropping the kwargs given to ``defer``.

    One subclass per API (its class path is what Airflow stores for a deferred task, so a v1 trigger
    serialized before v2 existed still loads).

    Transient API errors are retried (up to MAX_CONSECUTIVE_ERRORS polls in a row) rather than failing a
    long training job because the API server blinked. When a user kills the deferred task (mark failed,
    clear), ``on_kill`` deletes the job; a triggerer restart does not.
    """

    api: JobApi

    def __init__(
        self,
        *,
        name: str,
        namespace: str,
        kubernetes_conn_id: str = "kubernetes_default",
        poll_interval: float = 15.0,
        delete_on_kill: bool = True,
        run: str | None = None,
    ) -> None:
        super().__init__()
        self.run_id = run
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
                "run": self.run_id,
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
                    self.api.group, self.api.version, self.namespace, self.api.plural, self.name
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
                    "polling %s %s/%s failed (%d): %s", self.api.kind, self.namespace, self.name, errors, exc
                )
                if errors >= MAX_CONSECUTIVE_ERRORS:
                    yield self._event("Error", f"{errors} polls in a row failed; last error: {exc}")
                    return
                await asyncio.sleep(self.poll_interval)
                continue
            state, message = job_state(job, self.api)
            if state != last_state:
                self.log.info("%s %s/%s is %s %s", self.api.kind, self.namespace, self.name, state, message)
                last_state = state
            if state in (*self.api.terminal_states, "Missing"):
                yield self._event(state, message)
                return
            await asyncio.sleep(self.poll_interval)

    def _event(self, state: str, message: str) -> TriggerEvent:
        return TriggerEvent(
            {
                "name": self.name,
                "namespace": self.namespace,
                "api": self.api.name,
                "state": state,
                "message": message,
                "run": self.run_id,
            }
        )

    async def on_kill(self) -> None:
        if not self.delete_on_kill:
            return
        from kubernetes_asyncio.client import CustomObjectsApi, V1DeleteOptions
        from kubernetes_asyncio.client.exceptions import ApiException

        async with self._hook().get_conn() as api_client:
            try:
                await CustomObjectsApi(api_client).delete_namespaced_custom_object(
                    self.api.group,
                    self.api.version,
                    self.namespace,
                    self.api.plural,
                    self.name,
                    body=V1DeleteOptions(propagation_policy="Background"),
                )
                self.log.info("task killed: deleted %s %s/%s", self.api.kind, self.namespace, self.name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


class PyTorchJobTrigger(KubeflowJobTrigger):
    """Waits for a kubeflow.org/v1 PyTorchJob."""

    api = PYTORCHJOB_V1


class TrainJobTrigger(KubeflowJobTrigger):
    """Waits for a trainer.kubeflow.org/v1alpha1 TrainJob."""

    api = TRAINER_V2


TRIGGERS = {trigger.api.name: trigger for trigger in (PyTorchJobTrigger, TrainJobTrigger)}
