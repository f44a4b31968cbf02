"""Spark stages through the provider's SparkSubmitOperator: `local[...]` by default, a cluster by connection.

The application is the stage's own entrypoint file (``pipeline/<package>/__main__.py``) with the usual
``--snapshot/--config/--set`` arguments, so what runs under Airflow is exactly what `spark-submit` or
`pretrain <stage>` runs by hand.

Which master: when the Airflow connection ``pretrain_spark`` exists, its master wins (``spark://host:7077``,
``yarn``, ``k8s://...``) and our config's ``spark.master`` is ignored, because under spark-submit the
session takes the master from spark-submit (see ``pipeline.core.spark.launched_by_spark_submit``). Without
the connection the job runs in local mode with ``spark.master`` from the config, where the provider would
otherwise fall back to YARN.

Besides the provider's own extras (``deploy-mode``, ``namespace``, ...), the connection's extra may hold
``conf``, Spark settings for every job submitted there (a cluster's ``spark.kubernetes.*`` settings: image,
service account, pod templates, volumes), under any conf the task sets; a ``spark.pyspark.python`` among them
names the interpreter on the cluster, for the driver and the executors. ``application-root`` is where the
stages' files are on the cluster: with ``local:///opt/venv/lib/python3.11/site-packages`` (the pipeline image)
clean submits ``local:///opt/venv/lib/python3.11/site-packages/pipeline/clean/__main__.py``. A driver that
runs on Kubernetes (``--deploy-mode cluster``) needs it: it cannot read this machine's files.
docker/k8s/spark-connection.json is such a connection.

With a warm Spark Connect server configured (``spark.remote``, or ``SPARK_REMOTE`` in the worker's
environment) the stage runs as a plain process that attaches to it: no spark-submit, so no JVM of the task's
own (spark-submit would refuse a remote beside its master anyway).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow.exceptions import AirflowNotFoundException
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Connection

from operators.base import PipelineOperator
from operators.lineage import StageLineageMixin
from pipeline.config import PipelineConfig
from pipeline.core.proc import run_streaming
from pipeline.core.spark import remote_url
from pipeline.core.storage import DatasetRef
from pipeline.stages import stage as registered_stage

SPARK_CONN_ID = "pretrain_spark"


def stage_application(stage: str, root: str | None = None) -> str:
    """The file spark-submit runs for a stage: the `__main__.py` behind `pretrain <stage>`, here, or under
    ``root`` (a folder or ``local://`` URI holding the ``pipeline`` package where the driver runs)."""
    entry = registered_stage(stage)
    if root is None:
        return entry.application_file()
    return f"{root.rstrip('/')}/{entry.package.replace('.', '/')}/__main__.py"


def spark_connection(conn_id: str) -> Connection | None:
    try:
        return SparkSubmitHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None


@dataclass(frozen=True)
class SubmitTarget:
    """What the Spark connection adds to every submit: its ``conf`` and ``application-root`` extras."""

    conn_id: str
    conf: Mapping[str, str] = field(default_factory=dict)
    application_root: str | None = None
    driver_on_kubernetes: bool = False  # a k8s:// master in cluster mode: the driver runs in a pod

    @classmethod
    def of(cls, conn_id: str, deploy_mode: str | None = None) -> SubmitTarget:
        """``deploy_mode``: the task's own, which wins over the connection's (as in the provider's hook)."""
        connection = spark_connection(conn_id)
        if connection is None:
            return cls(conn_id)
        extra = connection.extra_dejson
        conf = extra.get("conf") or {}
        if not isinstance(conf, Mapping) or not all(
            isinstance(value, str | int | float | bool) for value in conf.values()
        ):
            raise ValueError(
                f"connection {conn_id!r}: extra 'conf' must be an object of Spark settings to strings, "
                f'e.g. {{"spark.executor.memory": "4g"}}; got {conf!r}'
            )
        kubernetes = connection.conn_type == "k8s" or (connection.host or "").startswith("k8s://")
        return cls(
            conn_id,
            conf={key: _conf_value(value) for key, value in conf.items()},
            application_root=extra.get("application-root"),
            driver_on_kubernetes=kubernetes and (deploy_mode or extra.get("deploy-mode")) == "cluster",
        )

    def application(self, stage: str) -> str:
        if self.application_root is None and self.driver_on_kubernetes:
            raise ValueError(
                f"connection {self.conn_id!r}: a driver on Kubernetes (deploy-mode cluster) cannot read "
                f"{stage_application(stage)} from this machine; set the extra 'application-root' to where "
                "the image holds the pipeline package, e.g. local:///opt/venv/lib/python3.11/site-packages"
            )
        return stage_application(stage, self.application_root)


def _conf_value(value: str | int | float | bool) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


class LocalDefaultSparkSubmitHook(SparkSubmitHook):
    """SparkSubmitHook whose master, when its connection does not exist, is ``default_master``, not YARN."""

    def __init__(self, *, default_master: str, **kwargs: Any) -> None:
        self._default_master = default_master
        super().__init__(**kwargs)
        if self._connection["master"].startswith("local"):
            # A local driver stays on loopback with its UI off, as pipeline.core.spark sets it outside
            # spark-submit; explicit conf still wins.
            self._conf = {
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.ui.enabled": "false",
                **self._conf,
            }

    def get_connection(self, conn_id: str) -> Connection:  # type: ignore[override]  # needs its master
        try:
            return super().get_connection(conn_id)
        except AirflowNotFoundException:
            # No cluster named: local mode with the config's spark.master. The provider would log
            # "Could not load connection string ..., defaulting to yarn" in every task, and mean YARN.
            return Connection(conn_id=conn_id, conn_type="spark", host=self._default_master)


class PipelineSparkSubmitOperator(PipelineOperator, StageLineageMixin, SparkSubmitOperator):
    """Submit one Spark stage for one snapshot and return its output path (XCom: a path, never data)."""

    # input_stage: a backfill names the stored source of its snapshot (crawl or ingest) at run time.
    template_fields: Sequence[str] = (
        *PipelineOperator.template_fields,
        *SparkSubmitOperator.template_fields,
        "input_stage",
    )

    def __init__(
        self,
        *,
        stage: str,
        input_stage: str | None = None,
        extra_args: Sequence[str] = (),
        conn_id: str = SPARK_CONN_ID,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("task_id", stage)
        super().__init__(conn_id=conn_id, name=f"pretrain-{stage}", **kwargs)
        self.stage = stage
        self.input_stage = input_stage
        self.extra_args = list(extra_args)

    def prepare_submit(self) -> PipelineConfig:
        """Fill in what spark-submit runs: the stage's file, its arguments, the interpreter, driver memory."""
        config = self.resolved_config()
        target = SubmitTarget.of(self._conn_id, self._deploy_mode)
        # The interpreter with pyarrow and our package, on driver and executors: this venv's, unless the
        # connection names the cluster's (the image's, on Kubernetes).
        python = target.conf.get("spark.pyspark.python", sys.executable)
        self.application = target.application(self.stage)
        self.application_args = self.stage_arguments()
        self._driver_memory = config.spark.driver_memory  # the driver JVM's heap is fixed at submit time
        self.conf = {
            "spark.pyspark.python": python,
            "spark.pyspark.driver.python": python,
            "spark.ui.showConsoleProgress": "false",
            "spark.log.level": "WARN",  # the task log gets our stage's lines, not Spark's start-up chatter
            **target.conf,
            **(self.conf or {}),
        }
        self.env_vars = {"PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python, **(self.env_vars or {})}
        self.name = f"pretrain-{self.stage}-{self.task_snapshot}"
        return config

    def execute(self, context) -> str:  # type: ignore[override]  # the output path, for XCom
        config = self.resolved_config()
        remote = remote_url(config)
        if remote is not None:
            self.log.info("attaching to the Spark Connect server %s", remote)
            command = [sys.executable, "-m", "pipeline.cli", self.stage, *self.stage_arguments()]
            run_streaming(
                command, env=self.child_environment(), logger=self.log, on_start=self.remember_process
            )
        else:
            config = self.prepare_submit()
            super().execute(context)
        return str(DatasetRef.of(config, self.stage, self.task_snapshot).require().path)

    def stage_arguments(self) -> list[str]:
        return [
            *self.cli_arguments(),
            *(["--input-stage", self.input_stage] if self.input_stage else []),
            *self.extra_args,
        ]

    def _get_hook(self) -> SparkSubmitHook:
        return LocalDefaultSparkSubmitHook(
            default_master=self.resolved_config().spark.master,
            conf=self.conf,
            conn_id=self._conn_id,
            files=self.files,
            py_files=self.py_files,
            archives=self._archives,
            driver_class_path=self.driver_class_path,
            jars=self.jars,
            java_class=self._java_class,
            packages=self.packages,
            exclude_packages=self.exclude_packages,
            repositories=self._repositories,
            total_executor_cores=self._total_executor_cores,
            executor_cores=self._executor_cores,
            executor_memory=self._executor_memory,
            driver_memory=self._driver_memory,
            keytab=self.keytab,
            principal=self.principal,
            proxy_user=self.proxy_user,
            name=self.name,
            num_executors=self._num_executors,
            status_poll_interval=self._status_poll_interval,
            application_args=self.application_args,
            env_vars=self.env_vars,
            verbose=self._verbose,
            spark_binary=self._spark_binary,
            properties_file=self.properties_file,
            yarn_queue=self._yarn_queue,
            deploy_mode=self._deploy_mode,
            post_submit_commands=self.post_submit_commands,
        )

    def on_kill(self) -> None:
        PipelineOperator.on_kill(self)
        SparkSubmitOperator.on_kill(self)
