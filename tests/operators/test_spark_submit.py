"""PipelineSparkSubmitOperator builds the spark-submit command: whose master, which interpreter, which file.

These check the command the provider's hook would run; the Spark stages really run through spark-submit
in the corpus DAG tests (tests/dags).
"""

import json
import sys
from pathlib import Path

import pytest

from operators.spark import PipelineSparkSubmitOperator, stage_application

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def submit_command(tmp_path, stage="clean", input_stage="crawl", master="local[3]"):
    op = PipelineSparkSubmitOperator(
        stage=stage,
        input_stage=input_stage,
        snapshot="2026-11-29",
        config_path="",
        overrides=[f"project.data_root={tmp_path}", f"spark.master={master}", "spark.driver_memory=3g"],
    )
    op.prepare_submit()
    return op, op._get_hook()._build_spark_submit_command(op.application)


def value_after(command, flag):
    return command[command.index(flag) + 1]


def confs(command):
    return {
        command[i + 1].split("=", 1)[0]: command[i + 1].split("=", 1)[1]
        for i, a in enumerate(command)
        if a == "--conf"
    }


class RecordingLogger:
    def __init__(self):
        self.lines = []

    def __getattr__(self, level):
        return lambda message, *args, **kwargs: self.lines.append(
            (level, message % args if args else message)
        )


def test_without_a_connection_the_config_master_runs_locally(tmp_path, monkeypatch):
    from operators.spark import LocalDefaultSparkSubmitHook

    monkeypatch.delenv("AIRFLOW_CONN_PRETRAIN_SPARK", raising=False)
    hook_log = RecordingLogger()
    monkeypatch.setattr(LocalDefaultSparkSubmitHook, "log", property(lambda self: hook_log))
    op, command = submit_command(tmp_path)
    # The provider's "Could not load connection string pretrain_spark, defaulting to yarn", in every task:
    assert not [line for line in hook_log.lines if "Could not load connection" in line[1]], hook_log.lines
    assert command[0] == "spark-submit"
    assert value_after(command, "--master") == "local[3]"  # not the provider's fallback, yarn
    assert value_after(command, "--driver-memory") == "3g"
    settings = confs(command)
    assert settings["spark.pyspark.python"] == sys.executable
    assert settings["spark.pyspark.driver.python"] == sys.executable
    assert settings["spark.driver.bindAddress"] == "127.0.0.1"
    assert op.env_vars == {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    application = command.index(str(PROJECT_ROOT / "pipeline" / "clean" / "__main__.py"))
    assert command[application + 1 :] == [
        "--snapshot",
        "2026-11-29",
        "--set",
        f"project.data_root={tmp_path}",
        "--set",
        "spark.master=local[3]",
        "--set",
        "spark.driver_memory=3g",
        "--input-stage",
        "crawl",
    ]


@pytest.mark.parametrize(
    ("connection", "master"),
    [
        ("spark://spark-master.example:7077", "spark://spark-master.example:7077"),
        (json.dumps({"conn_type": "spark", "host": "yarn"}), "yarn"),
        (
            json.dumps({"conn_type": "spark", "host": "k8s://https://10.0.0.1:6443"}),
            "k8s://https://10.0.0.1:6443",
        ),
    ],
)
def test_the_connection_master_wins_over_the_config(tmp_path, monkeypatch, connection, master):
    monkeypatch.setenv("AIRFLOW_CONN_PRETRAIN_SPARK", connection)
    _, command = submit_command(tmp_path, master="local[3]")
    assert value_after(command, "--master") == master
    assert "spark.driver.bindAddress" not in confs(command)  # a cluster driver is not pinned to loopback
    assert confs(command)["spark.pyspark.python"] == sys.executable


def test_each_spark_stage_submits_its_own_entrypoint():
    assert stage_application("clean") == str(PROJECT_ROOT / "pipeline" / "clean" / "__main__.py")
    assert stage_application("tokenize") == str(PROJECT_ROOT / "pipeline" / "tokenization" / "__main__.py")
    with pytest.raises(ValueError, match="unknown stage 'dedupe'"):
        stage_application("dedupe")


K8S_CONNECTION_FILE = PROJECT_ROOT / "docker" / "k8s" / "spark-connection.json"


def kubernetes_connection(monkeypatch, **extra_changes):
    """docker/k8s/spark-connection.json, as `airflow connections import` reads it, in the environment."""
    from airflow.secrets.local_filesystem import load_connections_dict

    connection = load_connections_dict(str(K8S_CONNECTION_FILE))["pretrain_spark"]
    extra = {**connection.extra_dejson, **extra_changes}
    value = {"conn_type": connection.conn_type, "host": connection.host, "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_PRETRAIN_SPARK", json.dumps(value))
    return extra


def test_the_kubernetes_connection_submits_the_image_stage_in_cluster_mode(tmp_path, monkeypatch):
    extra = kubernetes_connection(monkeypatch)
    op = PipelineSparkSubmitOperator(
        stage="dedup",
        snapshot="2026-11-29",
        config_path="",
        overrides=["spark.driver_memory=3g"],
        conf={"spark.executor.instances": "8"},  # the task's own conf wins over the connection's
    )
    op.prepare_submit()
    command = op._get_hook()._build_spark_submit_command(op.application)
    assert value_after(command, "--master") == "k8s://https://kubernetes.default.svc:443"
    assert value_after(command, "--deploy-mode") == "cluster"
    assert value_after(command, "--driver-memory") == "3g"
    settings = confs(command)
    assert settings["spark.kubernetes.namespace"] == "pretrain"  # the provider's `namespace` extra
    for key, value in extra["conf"].items():
        assert settings[key] == (value if key != "spark.executor.instances" else "8"), key
    # The image's interpreter, not this machine's, on the driver (and so for its executors).
    assert settings["spark.pyspark.python"] == "/opt/venv/bin/python"
    assert settings["spark.kubernetes.driverEnv.PYSPARK_PYTHON"] == "/opt/venv/bin/python"
    assert "spark.driver.bindAddress" not in settings
    # The stage's file inside the image, then the same arguments as everywhere else.
    application = "local:///opt/venv/lib/python3.11/site-packages/pipeline/dedup/__main__.py"
    at = command.index(application)
    # project.data_root is the image's (/data, where the volume is mounted) unless the task sets it.
    assert command[at + 1 :] == ["--snapshot", "2026-11-29", "--set", "spark.driver_memory=3g"]


def test_a_driver_on_kubernetes_needs_the_application_root(tmp_path, monkeypatch):
    kubernetes_connection(monkeypatch, **{"application-root": None})
    op = PipelineSparkSubmitOperator(stage="clean", snapshot="s1", config_path="", overrides=[])
    with pytest.raises(
        ValueError, match=r"pretrain_spark.*cannot read .*pipeline/clean/__main__\.py.*application-root"
    ):
        op.prepare_submit()
    # In client mode the driver is here and reads this checkout's file.
    kubernetes_connection(monkeypatch, **{"application-root": None, "deploy-mode": "client"})
    op.prepare_submit()
    assert op.application == str(PROJECT_ROOT / "pipeline" / "clean" / "__main__.py")


def test_connection_conf_must_be_an_object_of_settings(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_PRETRAIN_SPARK",
        json.dumps({"conn_type": "spark", "host": "spark://m:7077", "extra": {"conf": ["spark.x=1"]}}),
    )
    op = PipelineSparkSubmitOperator(stage="clean", snapshot="s1", config_path="", overrides=[])
    with pytest.raises(ValueError, match=r"extra 'conf' must be an object of Spark settings"):
        op.prepare_submit()
    monkeypatch.setenv(
        "AIRFLOW_CONN_PRETRAIN_SPARK",
        json.dumps(
            {
                "conn_type": "spark",
                "host": "spark://m:7077",
                "extra": {"conf": {"spark.dynamicAllocation.enabled": True, "spark.executor.cores": 2}},
            }
        ),
    )
    _, command = submit_command(tmp_path)
    assert confs(command)["spark.dynamicAllocation.enabled"] == "true"  # Spark's spelling, not Python's
    assert confs(command)["spark.executor.cores"] == "2"


@pytest.mark.parametrize("how", ["config", "environment"])
def test_with_a_warm_server_the_stage_attaches_as_a_plain_process_without_spark_submit(
    tmp_path, monkeypatch, how
):
    """spark-submit would start a JVM of the task's own, and refuses SPARK_REMOTE beside its master. The real
    run of this path is tests/dags/test_airflow_server.py's (its tasks attach to the session's server)."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    import operators.spark as spark_operators

    url = "sc://127.0.0.1:15999"
    overrides = [f"project.data_root={tmp_path}"]
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    if how == "config":
        overrides.append(f"spark.remote={url}")
    else:
        monkeypatch.setenv("SPARK_REMOTE", url)
    ran = []

    class Ran(Exception):
        pass

    def run_streaming(command, **kwargs):
        ran.append(command)
        raise Ran

    def submit(self, context):
        raise AssertionError("spark-submit was run")

    monkeypatch.setattr(spark_operators, "run_streaming", run_streaming)
    monkeypatch.setattr(SparkSubmitOperator, "execute", submit)
    op = PipelineSparkSubmitOperator(
        stage="clean", input_stage="ingest", snapshot="2026-11-29", config_path="", overrides=overrides
    )
    with pytest.raises(Ran):
        op.execute({})
    (command,) = ran
    assert command[:4] == [sys.executable, "-m", "pipeline.cli", "clean"]
    assert value_after(command, "--snapshot") == "2026-11-29"
    assert value_after(command, "--input-stage") == "ingest"
    assert f"project.data_root={tmp_path}" in command
