"""Spark on Kubernetes in docker/k8s: every pod there is hardened, the Spark pieces agree with each other and
with the image, and the pod templates' commands start Spark's driver and executor as Spark asks.

kubernetes-validate checks every manifest's schema (test_pytorchjob_v1_manifest.py); no Kubernetes API server runs
here, so whether a cluster admits and runs these pods is not checked. The commands run here with stand-ins
for `java` and `spark-submit` that print what they were given.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from operators.kubeflow.trainjob import node_pod
from tests.docker.dockerfiles import final_user, parse

ROOT = Path(__file__).resolve().parents[2]
K8S_DIR = ROOT / "docker" / "k8s"
CONNECTION = json.loads((K8S_DIR / "spark-connection.json").read_text())["pretrain_spark"]
CONF = CONNECTION["extra"]["conf"]
# The training jobs rendered by operators/kubeflow, and the ClusterTrainingRuntime they run on, set no
# securityContext and no cpu limit yet: known gaps, kept visible. strict: a file that becomes hardened fails
# here until it leaves this set.
NOT_YET_HARDENED: set[str] = set()  # files whose pods may fail the hardening check below (none now)


def documents(name: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all((K8S_DIR / name).read_text()) if doc]


def one(name: str, kind: str) -> dict:
    (found,) = [doc for doc in documents(name) if doc["kind"] == kind]
    return found


def pod_specs(document: dict) -> list[dict]:
    """The pod specs a manifest makes: a Pod's own, each pod template's in a job or runtime, and for a
    TrainJob the node pod the Trainer assembles from it and its runtime."""
    if document["kind"] == "TrainJob":
        return [node_pod(document)]
    found = []

    def walk(node) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("containers"), list):
                found.append(node)
                return
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document)
    return found


def all_pod_specs():
    for path in sorted(K8S_DIR.glob("*.yaml")):
        for index, document in enumerate(documents(path.name)):
            for number, spec in enumerate(pod_specs(document)):
                marks = ()
                if path.name in NOT_YET_HARDENED:
                    marks = pytest.mark.xfail(strict=True, reason="training pods: no securityContext yet")
                yield pytest.param(spec, id=f"{path.name}:{index}:{document['kind']}:{number}", marks=marks)


def hardening_problems(spec: dict) -> list[str]:
    pod = spec.get("securityContext") or {}
    problems = []
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        name = container["name"]
        context = container.get("securityContext") or {}
        if not context.get("runAsNonRoot", pod.get("runAsNonRoot")):
            problems.append(f"{name}: runAsNonRoot is not true")
        if not context.get("runAsUser", pod.get("runAsUser")):
            problems.append(f"{name}: no non-zero runAsUser (the image's USER is not checked by the kubelet)")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        if "ALL" not in (context.get("capabilities") or {}).get("drop", []):
            problems.append(f"{name}: capabilities do not drop ALL")
        if context.get("privileged"):
            problems.append(f"{name}: privileged")
        resources = container.get("resources") or {}
        for kind in ("requests", "limits"):
            missing = {"cpu", "memory"} - set(resources.get(kind) or {})
            if missing:
                problems.append(f"{name}: no {kind} for {sorted(missing)}")
    return problems


def test_a_pod_spec_is_found_in_every_kind_that_makes_pods():
    kinds = {doc["kind"] for path in K8S_DIR.glob("*.yaml") for doc in documents(path.name) if pod_specs(doc)}
    assert kinds == {"Pod", "PyTorchJob", "TrainJob", "ClusterTrainingRuntime"}


@pytest.mark.parametrize("spec", all_pod_specs())
def test_every_pod_runs_non_root_with_limits_and_no_privilege_escalation(spec):
    assert hardening_problems(spec) == []


def test_the_hardening_check_names_what_is_missing():
    spec = one("spark-executor-pod-template.yaml", "Pod")["spec"]
    assert hardening_problems(spec) == []
    weak = json.loads(json.dumps(spec))
    del weak["securityContext"]["runAsNonRoot"]
    (container,) = weak["containers"]
    container["securityContext"] = {"privileged": True}
    del container["resources"]["limits"]["cpu"]
    assert hardening_problems(weak) == [
        "spark-kubernetes-executor: runAsNonRoot is not true",
        "spark-kubernetes-executor: allowPrivilegeEscalation is not false",
        "spark-kubernetes-executor: capabilities do not drop ALL",
        "spark-kubernetes-executor: privileged",
        "spark-kubernetes-executor: no limits for ['cpu']",
    ]


def image_env() -> dict[str, str]:
    stage = parse(ROOT / "docker" / "Dockerfile").stages[-1]
    env = {}
    for keyword, rest in stage.instructions:
        if keyword == "ENV":
            env.update(item.split("=", 1) for item in shlex.split(rest.replace("\\\n", " ")))
    return env


def test_the_spark_pieces_agree_with_each_other_and_with_the_pipeline_image():
    dockerfile = parse(ROOT / "docker" / "Dockerfile")
    uid = int(final_user(dockerfile.stages[-1]).split(":")[0])
    env = image_env()
    namespace = one("namespace.yaml", "Namespace")["metadata"]
    assert namespace["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    extra = CONNECTION["extra"]
    assert CONNECTION["host"].startswith("k8s://https://") and extra["deploy-mode"] == "cluster"
    assert extra["namespace"] == namespace["name"]
    for doc in documents("spark-rbac.yaml"):
        assert doc["metadata"]["namespace"] == namespace["name"]
    submit = [doc for doc in documents("rbac.yaml") if doc["metadata"]["name"] == "pretrain-spark-submit"]
    assert {doc["kind"] for doc in submit} == {"Role", "RoleBinding"}
    assert {doc["metadata"]["namespace"] for doc in submit} == {namespace["name"]}

    account = one("spark-rbac.yaml", "ServiceAccount")["metadata"]["name"]
    assert CONF["spark.kubernetes.authenticate.driver.serviceAccountName"] == account
    (rule,) = one("spark-rbac.yaml", "Role")["rules"]
    assert {"pods", "services", "configmaps"} <= set(rule["resources"])
    assert {"create", "get", "list", "watch", "delete"} <= set(rule["verbs"])
    binding = one("spark-rbac.yaml", "RoleBinding")
    assert binding["subjects"][0]["name"] == account and binding["roleRef"]["name"] == "pretrain-spark-driver"

    claim = one("pvc.yaml", "PersistentVolumeClaim")["metadata"]["name"]
    python_version = dockerfile.all_args()["PYTHON_VERSION"]
    assert extra["application-root"] == f"local:///opt/venv/lib/python{python_version}/site-packages"
    assert CONF["spark.pyspark.python"] == CONF["spark.pyspark.driver.python"] == env["PYSPARK_PYTHON"]
    for role in ("driver", "executor"):
        volume = f"spark.kubernetes.{role}.volumes.persistentVolumeClaim.data"
        assert CONF[f"{volume}.options.claimName"] == claim
        assert CONF[f"{volume}.mount.path"] == env["PRETRAIN__PROJECT__DATA_ROOT"]  # project.data_root
        template = Path(CONF[f"spark.kubernetes.{role}.podTemplateFile"]).name
        pod = one(template, "Pod")["spec"]
        (container,) = pod["containers"]
        assert container["name"] == CONF[f"spark.kubernetes.{role}.podTemplateContainerName"]
        assert pod["securityContext"]["runAsUser"] == uid
        assert container["image"].split(":")[0].endswith("pretrain-pipeline")
    assert one("spark-driver-pod-template.yaml", "Pod")["spec"]["serviceAccountName"] == account
    executor = one("spark-executor-pod-template.yaml", "Pod")["spec"]
    assert executor["automountServiceAccountToken"] is False
    (container,) = executor["containers"]
    gib = lambda size: int(re.fullmatch(r"(\d+)[gG]i?", size).group(1))  # noqa: E731
    memory = gib(CONF["spark.executor.memory"]) + gib(CONF["spark.executor.memoryOverhead"])
    assert container["resources"] == {
        "requests": {"cpu": CONF["spark.kubernetes.executor.request.cores"], "memory": f"{memory}Gi"},
        "limits": {"cpu": CONF["spark.kubernetes.executor.limit.cores"], "memory": f"{memory}Gi"},
    }


def run_template_command(template: str, args: list[str], env: dict[str, str], tmp_path: Path):
    """The template container's command with Spark's arguments, `java` and `spark-submit` as stand-ins."""
    (container,) = one(template, "Pod")["spec"]["containers"]
    command = container["command"]
    assert command[:2] == ["tini", "--"]  # the image's init, which reaps the JVM's and Python's children
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    for program in ("java", "spark-submit"):
        (stubs / program).write_text(f"#!/bin/sh\necho {program}\nprintf '%s\\n' \"$@\"\n")
        (stubs / program).chmod(0o755)
    path = os.pathsep.join([str(stubs), str(Path(sys.executable).parent), os.environ["PATH"]])
    return subprocess.run(
        [*command[2:], *args], env={"PATH": path, **env}, capture_output=True, text=True, timeout=120
    )


def test_the_driver_template_starts_the_application_in_client_mode_in_its_pod(tmp_path):
    spark_args = [
        *("driver", "--properties-file", "/opt/spark/conf/spark.properties"),
        *("--class", "org.apache.spark.deploy.PythonRunner"),
        "local:///opt/venv/lib/python3.11/site-packages/pipeline/clean/__main__.py",
        *("--snapshot", "2026-11-29", "--set", "spark.output_files=8"),
    ]
    env = {"SPARK_DRIVER_BIND_ADDRESS": "10.1.2.3"}
    done = run_template_command("spark-driver-pod-template.yaml", spark_args, env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "spark-submit",
        *("--deploy-mode", "client", "--conf", "spark.driver.bindAddress=10.1.2.3"),
        *spark_args[1:],
    ]
    wrong = run_template_command("spark-driver-pod-template.yaml", ["executor"], env, tmp_path)
    assert wrong.returncode == 2 and "expected Spark's 'driver' arguments" in wrong.stderr


def test_the_executor_template_starts_the_kubernetes_executor_backend_from_the_images_jars(tmp_path):
    import pyspark

    env = {
        "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@clean-driver-svc.pretrain.svc:7078",
        "SPARK_EXECUTOR_ID": "3",
        "SPARK_EXECUTOR_CORES": "2",
        "SPARK_EXECUTOR_MEMORY": "4g",
        "SPARK_APPLICATION_ID": "spark-0123abcd",
        "SPARK_EXECUTOR_POD_IP": "10.1.2.4",
        "SPARK_RESOURCE_PROFILE_ID": "0",
        "SPARK_EXECUTOR_POD_NAME": "pretrain-clean-exec-3",
        "SPARK_CONF_DIR": "/opt/spark/conf",
        # Spark numbers the JVM options; 10 comes after 2, and an option keeps its spaces.
        "SPARK_JAVA_OPT_10": "-Dspark.driver.port=7078",
        "SPARK_JAVA_OPT_2": "-XX:OnOutOfMemoryError=kill -9 %p",
        "SPARK_JAVA_OPT_0": "-Djava.net.preferIPv6Addresses=false",
    }
    done = run_template_command("spark-executor-pod-template.yaml", ["executor"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    jars = Path(pyspark.__file__).parent / "jars"
    assert any(jars.glob("spark-kubernetes_*.jar"))  # the backend's class ships with pyspark
    assert done.stdout.splitlines() == [
        "java",
        *("-Djava.net.preferIPv6Addresses=false", "-XX:OnOutOfMemoryError=kill -9 %p"),
        *("-Dspark.driver.port=7078", "-Xms4g", "-Xmx4g", "-cp", f"/opt/spark/conf:{jars}/*"),
        "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend",
        *("--driver-url", env["SPARK_DRIVER_URL"], "--executor-id", "3", "--cores", "2"),
        *("--app-id", "spark-0123abcd", "--hostname", "10.1.2.4", "--resourceProfileId", "0"),
        *("--podName", "pretrain-clean-exec-3"),
    ]
    with_classpath = run_template_command(
        "spark-executor-pod-template.yaml", ["executor"], {**env, "SPARK_CLASSPATH": "/extra/x.jar"}, tmp_path
    )
    assert f"/opt/spark/conf:/extra/x.jar:{jars}/*" in with_classpath.stdout.splitlines()
    missing = run_template_command(
        "spark-executor-pod-template.yaml", ["executor"], {"SPARK_EXECUTOR_MEMORY": "4g"}, tmp_path
    )
    assert missing.returncode != 0 and "SPARK_DRIVER_URL" in missing.stderr  # set -u: no half-set backend
