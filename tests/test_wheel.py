"""The installed wheel works outside the checkout: what the Airflow and trainer images run.

The wheel is built from this checkout (the CPU kernels only, to keep it quick), installed into a folder of its
own, and run from another directory with that folder first on the path, so nothing can be read from the source
tree: files the code reads at run time must be package data.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import PROJECT_ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A folder holding the wheel's packages (and its `pretrain` script under bin/)."""
    root = tmp_path_factory.mktemp("wheel")
    dist, target = root / "dist", root / "site"
    environment = {**os.environ, "PRETRAIN_BUILD_CUDA": "0"}
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", dist, "."]
    subprocess.run(build, cwd=PROJECT_ROOT, env=environment, check=True, capture_output=True, timeout=900)
    (wheel,) = dist.glob("pretrain_pipeline-*.whl")
    install = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", target, wheel]
    subprocess.run(install, check=True, capture_output=True, timeout=600)
    return target


def run(installed: Path, tmp_path: Path, *command: str) -> subprocess.CompletedProcess:
    """``command`` from an empty directory, the installed packages first on the path."""
    workdir = tmp_path / "elsewhere"
    workdir.mkdir(exist_ok=True)
    environment = {
        **{key: value for key, value in os.environ.items() if not key.startswith("PRETRAIN__")},
        "PYTHONPATH": str(installed),
    }
    return subprocess.run(
        list(command), cwd=workdir, env=environment, capture_output=True, text=True, timeout=300
    )


def test_the_wheel_is_what_runs(installed, tmp_path):
    done = run(
        installed, tmp_path, sys.executable, "-c", "import pipeline, operators; print(pipeline.__file__)"
    )
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(installed)


def test_pretrain_help_and_config_run_from_the_wheel(installed, tmp_path):
    script = installed / "bin" / "pretrain"
    helped = run(installed, tmp_path, sys.executable, str(script), "--help")
    assert helped.returncode == 0, helped.stderr
    assert "tokenize" in helped.stdout and "train" in helped.stdout
    shown = run(installed, tmp_path, sys.executable, str(script), "config", "--set", "train.steps=7")
    assert shown.returncode == 0, shown.stderr
    assert "steps: 7" in shown.stdout


@pytest.mark.parametrize(("api", "kind"), [("trainer-v2", "TrainJob"), ("pytorchjob-v1", "PyTorchJob")])
def test_the_kubernetes_job_renders_from_the_wheel(installed, tmp_path, api, kind):
    """Used to fail with FileNotFoundError for docker/k8s/torch-distributed-runtime.yaml: the CRD schemas and
    the runtime were read from the checkout's docker/ folder, which no wheel holds."""
    done = run(
        installed,
        tmp_path,
        sys.executable,
        "-m",
        "operators.kubeflow",
        "--snapshot",
        "w1",
        "--settings",
        json.dumps({"api": api}),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    job = yaml.safe_load(done.stdout)
    assert job["kind"] == kind and job["metadata"]["name"] == "pretrain-train-example"


def test_the_wheel_names_the_code_it_was_built_from(installed, tmp_path):
    """Manifests record the code version: a wheel's is the revision it was built from, with its version."""
    done = run(
        installed,
        tmp_path,
        sys.executable,
        "-c",
        "from pipeline.core.lineage import code_version; print(code_version())",
    )
    assert done.returncode == 0, done.stderr
    revision = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert done.stdout.startswith(revision) and "pretrain-pipeline==" in done.stdout
