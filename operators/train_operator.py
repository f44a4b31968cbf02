"""Launch distributed training: torchrun on this worker, or a Kubeflow job (TrainJob or PyTorchJob) on Kubernetes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from operators.base import PipelineOperator
from operators.lineage import StageLineageMixin
from pipeline.config import PipelineConfig
from pipeline.core.lineage import Lineage
from pipeline.core.storage import DatasetRef
from pipeline.stages import stage as registered_stage
from pipeline.train.launcher.launch import name_run, train, training_inputs

ON_FINISH = ("delete", "delete_succeeded", "keep")
# Arguments that became config keys: a DAG passing one is told where it went.
MOVED_TO_CONFIG = {
    "launcher": "train.launcher",
    "nproc_per_node": "train.nproc_per_node",
    "nnodes": "train.nnodes",
}
SETTINGS_VARIABLE = "pretrain_kubernetes"


class TrainOperator(PipelineOperator, StageLineageMixin):
    """Train one snapshot with `torchrun -m pipeline.train`, locally or as a Kubeflow job on Kubernetes, as the
    config's ``train.launcher`` says. With a frozen config (``frozen_config``, the `pretrain` DAGs') the task and
    the ranks read that file as it is: it must name the run (``train.run_id``), and nothing rewrites it.

    ``train.launcher=local`` trains as `pretrain train` does (the same run: new, resumed or ``train.run_id``,
    under its lock) with torchrun as a child process in its own process group, streams every rank's output
    into the task log, and kills the whole group (agent and workers) when the task is killed.

    ``train.launcher=kubernetes`` renders, by the kubernetes setting ``api``, a Kubeflow Trainer v2 ``TrainJob``
    (``trainer-v2``, the default; ``operators.kubeflow.trainjob``) or a legacy ``kubeflow.org/v1`` PyTorchJob
    (``pytorchjob-v1``; ``operators.kubeflow.pytorchjob_v1``), creates it, and defers to a trigger that polls the
    job's conditions. Both go through the same steps below. The job's name is derived from the
    task instance (dag, run, task, map index) and not from the try number, so a retry finds the job
    its previous try created and reattaches to it instead of creating a second one; a previous try's
    *failed* job is deleted and resubmitted. Unless ``train.run_id`` names the training run, the job's
    name does (``train/<snapshot>/<job name>/``), so a resubmitted job resumes the run. When it finishes,
    the node-0 pod's log (v1: the Master's) is copied into the task log and the job is deleted or kept
    (``on_finish``). Killing the task deletes the job.

    Cluster settings (image, namespace, PVC, GPUs, ...) come from ``KubernetesJobSettings`` defaults, then
    the JSON Airflow Variable ``pretrain_kubernetes``, then the ``kubernetes_settings`` argument.
    """

    def __init__(
        self,
        *,
        input_stage: str | None = None,
        kubernetes_conn_id: str = "kubernetes_default",
        kubernetes_settings: dict[str, Any] | None = None,
        on_finish: str = "delete_succeeded",
        poll_interval: float = 15.0,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("task_id", "train")
        for argument in sorted(set(kwargs) & set(MOVED_TO_CONFIG)):
            raise TypeError(
                f"TrainOperator({argument}=...) is the config key {MOVED_TO_CONFIG[argument]} now: set it in the "
                "config file or the overrides"
            )
        super().__init__(**kwargs)
        if on_finish not in ON_FINISH:
            raise ValueError(f"on_finish {on_finish!r} is not one of {ON_FINISH}")
        self.input_stage = input_stage or registered_stage("train").reads[0]
        self.kubernetes_conn_id = kubernetes_conn_id
        self.kubernetes_settings = dict(kubernetes_settings or {})
        self.on_finish = on_finish
        self.poll_interval = poll_interval
        # (api, namespace, name) while this process watches a job
        self._job: tuple[str, str, str] | None = None

    @property
    def lineage_stage(self) -> str:
        return "train"

    def execute(self, context) -> str:
        config = self.resolved_config()
        if config.train.launcher == "local":
            return self._run_local(config, training_inputs(config, self.task_snapshot, self.input_stage))
        return self._start_kubernetes(config, context)

    def _with_run(self, config: PipelineConfig, run: str) -> PipelineConfig:
        """``config`` training the run ``run``; a frozen config must name it already."""
        if self.frozen_config and run != config.train.run_id:
            raise AirflowFailException(
                f"{self.config_path}: a frozen config is read as it is, so it names its run (train.run_id); "
                f"it names {config.train.run_id!r}, this task would train {run!r}"
            )
        return config.with_run(run)

    # --- local ----------------------------------------------------------------------------------------

    def _run_local(self, config: PipelineConfig, inputs: list[DatasetRef]) -> str:
        """What `pretrain train` does: the same run (new, resumed or named), lock, threads and torchrun."""
        manifest = train(
            self._with_run(config, name_run(config, self.task_snapshot)),
            inputs,
            self.task_snapshot,
            on_line=lambda line: self.log.info("%s", line),
            on_start=self.remember_process,
            # The ranks read the frozen file itself; else train() freezes this config for them.
            config_path=Path(self.config_path) if self.frozen_config and self.config_path else None,
        )
        return manifest.path

    # --- kubernetes -----------------------------------------------------------------------------------

    def job_settings(self):
        from airflow.sdk import Variable

        from operators.kubeflow.job_parts import KubernetesJobSettings

        settings = KubernetesJobSettings().merged(
            Variable.get(SETTINGS_VARIABLE, default=None, deserialize_json=True)
        )
        settings = settings.merged(self.kubernetes_settings)
        if settings.active_deadline_seconds is None and self.execution_timeout is not None:
            # A deferred task's timeout does not reach the cluster; let the job stop itself at the same time.
            settings = settings.merged(
                {"active_deadline_seconds": int(self.execution_timeout.total_seconds())}
            )
        return settings

    def job_client(self, namespace: str, api: str):
        from operators.kubeflow.api import job_api
        from operators.kubeflow.client import KubeflowJobClient, api_client_for

        return KubeflowJobClient(api_client_for(self.kubernetes_conn_id), namespace, job_api(api))

    def _start_kubernetes(self, config: PipelineConfig, context) -> str:
        from operators.kubeflow.api import job_api, job_state
        from operators.kubeflow.job_parts import job_name
        from operators.kubeflow.trainjob import render_job
        from operators.kubeflow.trigger import TRIGGERS

        ti = context["ti"]
        name = job_name(ti.dag_id, ti.run_id, ti.task_id, getattr(ti, "map_index", -1))
        # The one decision of the run the pods train: the config's, else the job's name, so a retry that
        # resubmits the job resumes it. execute_complete is handed the same run.
        run = name_run(config, self.task_snapshot, default=name)
        config = self._with_run(config, run)
        settings = self.job_settings()
        api = job_api(settings.api)
        lineage = Lineage(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id, try_number=ti.try_number)
        manifest = render_job(
            config,
            name=name,
            snapshot=self.task_snapshot,
            input_stage=self.input_stage,
            settings=settings,
            lineage=lineage,
        )
        client = self.job_client(settings.namespace, api.name)
        self._job = (api.name, settings.namespace, name)
        job = (api.kind, settings.namespace, name)  # for the log lines
        existing = client.get(name)
        state, message = job_state(existing, api)
        if existing is not None and existing.get("metadata", {}).get("deletionTimestamp"):
            self.log.info("%s %s/%s of an earlier try is being deleted; waiting to resubmit", *job)
            client.wait_deleted(name)
            existing = None
        if existing is not None and state == api.failed:
            self.log.warning("%s %s/%s of an earlier try failed (%s); resubmitting", *job, message)
            client.delete(name)
            client.wait_deleted(name)
            existing = None
        if existing is None:
            if client.create(manifest) is None:
                self.log.info("%s %s/%s was created concurrently; attaching to it", *job)
            else:
                self.log.info(
                    "created %s %s/%s: %d node(s) x %s process(es), image %s",
                    *job,
                    config.train.nnodes,
                    config.train.nproc_per_node,
                    settings.image,
                )
        elif state == api.succeeded:
            self.log.info("%s %s/%s already succeeded in an earlier try", *job)
            return self.execute_complete(
                context,
                {
                    "name": name,
                    "namespace": settings.namespace,
                    "api": api.name,
                    "state": state,
                    "message": message,
                },
                run=run,
            )
        else:
            self.log.info("reattaching to %s %s/%s (%s) created by an earlier try", *job, state)
        self.defer(
            trigger=TRIGGERS[api.name](
                name=name,
                namespace=settings.namespace,
                kubernetes_conn_id=self.kubernetes_conn_id,
                poll_interval=self.poll_interval,
                run=run,
            ),
            method_name="execute_complete",
        )

    def execute_complete(self, context, event: dict[str, Any], run: str | None = None) -> str:
        """The job ended: its node-0 log into the task log, the job deleted or kept, and the output path of the
        run ``_start_kubernetes`` decided (``run``, else the event's: the trigger carries it)."""
        from operators.kubeflow.api import PYTORCHJOB_V1, job_api

        name, namespace, state = event["name"], event["namespace"], event["state"]
        run = run or event.get("run") or name  # an event of a trigger deferred before it carried the run
        api = job_api(event.get("api", PYTORCHJOB_V1.name))  # a v1 trigger deferred before v2 sent no api
        self._job = (api.name, namespace, name)
        client = self.job_client(namespace, api.name)
        if state != "Missing":
            logs = client.node0_logs(name)
            self.log.info("---- node-0 log of %s %s/%s ----", api.kind, namespace, name)
            for line in logs.splitlines():
                self.log.info("%s", line)
            self.log.info("---- end of node-0 log ----")
        succeeded = state == api.succeeded
        if self.on_finish == "delete" or (self.on_finish == "delete_succeeded" and succeeded):
            client.delete(name)
            self.log.info("deleted %s %s/%s", api.kind, namespace, name)
        elif state != "Missing":
            self.log.info("kept %s %s/%s (on_finish=%s)", api.kind, namespace, name, self.on_finish)
        self._job = None
        if not succeeded:
            raise AirflowException(f"{api.kind} {namespace}/{name} ended {state}: {event.get('message', '')}")
        train = DatasetRef.of(self.resolved_config().with_run(run), "train", self.task_snapshot)
        if not train.is_complete():
            self.log.warning(
                "%s is not visible from this worker; mount the job's volume at project.data_root to read it",
                train.path,
            )
        return str(train.path)

    def on_kill(self) -> None:
        super().on_kill()
        if self._job is not None:
            api, namespace, name = self._job
            client = self.job_client(namespace, api)
            if client.delete(name):
                self.log.info("task killed: deleted %s %s/%s", client.api.kind, namespace, name)
