"""docker/compose.yaml (and the observability stack it includes): valid against the Compose Specification's
JSON schema (vendored in docker/compose-spec/), every service healthy-checked or waiting on a condition, every
image pinned, no secret in the file, every variable it reads documented in docker/.env.example.
`docker compose config` runs too where the CLI exists (not on our machines: no Docker engine, no plugin)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.docker.dockerfiles import DOCKER, ROOT, SERVICES_LOCK, parse, pip_installs, read_lock

COMPOSE = DOCKER / "compose.yaml"
OBSERVABILITY = DOCKER / "observability" / "compose.yaml"
ENV_EXAMPLE = DOCKER / ".env.example"
SCHEMA = DOCKER / "compose-spec" / "compose-spec.json"
# ${VAR}, ${VAR:-default}, ${VAR:?message}, $VAR; `$$` is a literal dollar for the container's shell.
VARIABLE = re.compile(r"\$\{([A-Za-z_]\w*)(?:(:?[-?+])([^}]*))?\}|\$([A-Za-z_]\w*)")
# One-shot jobs: they run to completion (restart: "no") and others wait for service_completed_successfully.
ONE_SHOT = {"setup", "airflow-init", "minio-setup"}
SECRET_KEY = re.compile(r"PASSWORD|SECRET|FERNET|_KEY$|ACCESS_KEY", re.IGNORECASE)


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def strings(node):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from strings(key)
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)
    elif isinstance(node, str):
        yield node


def variables(node) -> list[tuple[str, str | None, str]]:
    """(name, operator, argument) for every variable the document interpolates."""
    found = []
    for text in strings(node):
        for match in VARIABLE.finditer(text.replace("$$", "")):
            name = match[1] or match[4]
            found.append((name, match[2], match[3] or ""))
    return found


def env_example() -> dict[str, str]:
    values = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = value
    return values


def interpolate(node, env: dict[str, str]):
    def one(text: str) -> str:
        def replace(match: re.Match) -> str:
            name = match[1] or match[4]
            if name in env and (env[name] or match[2] not in (":-", ":?")):
                return env[name]
            if match[2] in ("-", ":-"):
                return match[3]
            raise AssertionError(f"${{{name}}} is not set by .env.example")

        parts = text.split("$$")
        return "$".join(VARIABLE.sub(replace, part) for part in parts)

    if isinstance(node, dict):
        return {one(k) if isinstance(k, str) else k: interpolate(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolate(v, env) for v in node]
    return one(node) if isinstance(node, str) else node


def stack() -> dict[str, dict]:
    """The services of compose.yaml and of every file it includes, as one model (what `include` builds)."""
    compose = load(COMPOSE)
    services = dict(compose["services"])
    for entry in compose.get("include", []):
        paths = entry["path"] if isinstance(entry, dict) else entry
        for path in [paths] if isinstance(paths, str) else paths:
            included = load(COMPOSE.parent / path)["services"]
            assert not set(included) & set(services), f"{path} redefines {set(included) & set(services)}"
            services.update(included)
    return services


def schema_validator() -> jsonschema.Draft7Validator:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


@pytest.mark.parametrize("path", [COMPOSE, OBSERVABILITY], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_compose_file_is_valid_against_the_compose_spec_schema(path):
    validator = schema_validator()
    raw = load(path)
    errors = sorted(validator.iter_errors(raw), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)
    # And once interpolated with .env.example's values, as Compose would see it.
    resolved = interpolate(raw, env_example())
    errors = sorted(validator.iter_errors(resolved), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_the_schema_check_is_not_vacuous():
    validator = schema_validator()
    broken = {"services": {"web": {"image": "nginx:1.29", "healthcheck": {"test": 42}, "restart": 3}}}
    assert list(validator.iter_errors(broken))
    assert list(validator.iter_errors({"services": {"web": {"imag": "nginx:1.29"}}}))


def test_the_stack_has_its_services_and_includes_the_observability_stack():
    compose = load(COMPOSE)
    assert compose["include"] == [{"path": "observability/compose.yaml"}]
    assert {
        "airflow-db",
        "airflow-init",
        "airflow-apiserver",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-triggerer",
        "mlflow-db",
        "minio",
        "minio-setup",
        "mlflow",
        "elasticsearch",
        "kibana",
        "filebeat",
        "prometheus",
        "grafana",
    } <= set(stack())


def test_airflow_runs_the_local_executor_on_postgres_and_mlflow_on_postgres_and_minio():
    services = stack()
    for name in ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"):
        env = services[name]["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
        assert "@airflow-db:5432/" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
        assert services[name]["command"][0] == name.removeprefix("airflow-").replace(
            "apiserver", "api-server"
        )
    mlflow = services["mlflow"]["environment"]
    assert "--serve-artifacts" in services["mlflow"]["command"]
    assert mlflow["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql+psycopg2://mlflow:")
    assert mlflow["MLFLOW_BACKEND_STORE_URI"].endswith("@mlflow-db:5432/mlflow")
    assert mlflow["MLFLOW_ARTIFACTS_DESTINATION"].startswith("s3://")
    assert mlflow["MLFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"


def test_every_service_is_healthchecked_or_waits_on_a_condition():
    services = stack()
    for name, service in services.items():
        depends = service.get("depends_on", {})
        assert isinstance(depends, dict), f"{name}: depends_on as a list starts it before they are ready"
        for target, spec in depends.items():
            assert target in services, f"{name} depends on unknown {target}"
            condition = spec["condition"]
            if target in ONE_SHOT:
                assert condition == "service_completed_successfully", f"{name} -> {target}"
            else:
                assert condition == "service_healthy", f"{name} -> {target}: {condition}"
                assert "healthcheck" in services[target], (
                    f"{name} waits for {target}, which has no healthcheck"
                )
        if name in ONE_SHOT:
            assert service.get("restart") == "no" and depends, (
                f"{name}: a one-shot job waits for what it sets up"
            )
        else:
            assert "healthcheck" in service, f"{name} has no healthcheck"
            test = service["healthcheck"]["test"]
            assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, f"{name}: {test}"


def test_every_image_is_pinned():
    for name, service in stack().items():
        image = service["image"]
        repository, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "")
        assert repository and tag and "latest" not in tag, f"{name}: image {image} is not pinned"
        assert "$" not in image, f"{name}: image {image}"


def test_built_images_name_a_dockerfile_that_exists():
    for name, service in stack().items():
        if "build" in service:
            context = COMPOSE.parent / service["build"]["context"]
            assert (context / service["build"]["dockerfile"]).is_file(), name
            assert service["image"].split(":")[1] == "0.1.0", (
                f"{name}: tag built images with the package version"
            )


def test_every_variable_is_in_env_example_and_secrets_are_required_variables():
    documented = env_example()
    for path in (COMPOSE, OBSERVABILITY):
        for name, operator, _ in variables(load(path)):
            assert name in documented, f"{path.name} reads ${name}, which docker/.env.example lacks"
            if path == COMPOSE:
                assert operator == ":?", f"${{{name}}} in compose.yaml: make it required (${{{name}:?...}})"
    used = {name for path in (COMPOSE, OBSERVABILITY) for name, _, _ in variables(load(path))}
    assert set(documented) <= used, f".env.example documents unused {set(documented) - used}"


def test_no_secret_is_written_in_the_compose_files():
    for name, service in stack().items():
        env = service.get("environment", {})
        assert isinstance(env, dict), f"{name}: environment as a mapping"
        for key, value in env.items():
            if SECRET_KEY.search(key):
                assert re.fullmatch(r"\$\{[A-Z_]+:\?[^}]*\}", str(value)), (
                    f"{name}: {key} is written in the file"
                )
        for text in strings(service):
            # credentials inside URLs: scheme://user:password@host
            for password in re.findall(r"://[^:/@\s]+:([^@\s]+)@", text):
                assert password.startswith("${") and ":?" in password, f"{name}: a password in {text}"


def test_named_volumes_are_declared_and_host_paths_exist():
    compose, observability = load(COMPOSE), load(OBSERVABILITY)
    declared = set(compose.get("volumes", {})) | set(observability.get("volumes", {}))
    for name, service in stack().items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("${"):
                continue  # the data root, a host folder from .env
            if source.startswith("."):
                continue  # checked by tests/tracking/test_dashboards.py for the observability files
            assert source in declared, f"{name} mounts undeclared volume {source}"
    for database in ("airflow-db", "mlflow-db", "minio"):
        assert any(v.split(":")[0] in declared for v in stack()[database]["volumes"]), database


def test_ports_are_bound_to_localhost():
    for name, service in stack().items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"


def compose_cli() -> list[str] | None:
    """`docker compose` (the CLI plugin), else a standalone Compose v2 `docker-compose` (v1 lacks `include`)."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    standalone = shutil.which("docker-compose")
    if standalone:
        version = subprocess.run([standalone, "version", "--short"], capture_output=True, text=True)
        if version.returncode == 0 and version.stdout.strip().lstrip("v").startswith("2."):
            return [standalone]
    return None


def test_docker_compose_config_accepts_the_stack(tmp_path):
    compose = compose_cli()
    if compose is None:
        pytest.skip("no Docker Compose v2 CLI on this machine; the JSON schema checks above stand in")
    env_file = tmp_path / ".env"
    env_file.write_text(ENV_EXAMPLE.read_text())
    base = [*compose, "--env-file", str(env_file), "-f", str(COMPOSE)]
    result = subprocess.run([*base, "--profile", "filebeat", "config", "--format", "json"], **RUN)
    assert result.returncode == 0, result.stderr
    model = json.loads(result.stdout)
    assert set(model["services"]) == set(stack())
    # The included file sees the parent's variables: Filebeat tails the data root the Airflow tasks write.
    (data,) = [v for v in model["services"]["filebeat"]["volumes"] if v["target"] == "/data"]
    assert data["source"] == env_example()["PRETRAIN_DATA_ROOT"]
    # Without the .env file, Compose refuses to start and names the missing variable.
    missing = subprocess.run([*compose, "-f", str(COMPOSE), "config", "--quiet"], **RUN)
    assert missing.returncode != 0 and "required variable" in missing.stderr


RUN = {"capture_output": True, "text": True, "timeout": 120, "env": {"PATH": os.environ.get("PATH", "")}}


def test_the_images_carry_the_drivers_the_stack_uses():
    """postgresql+psycopg2 URLs for Airflow (which also opens them with asyncpg) and MLflow; s3:// artifacts."""
    services_lock = read_lock(SERVICES_LOCK)
    assert {"psycopg2-binary", "asyncpg", "boto3"} <= set(services_lock)
    airflow = parse(DOCKER / "airflow.Dockerfile")
    assert any("requirements-services.lock" in " ".join(words) for words in pip_installs(airflow.stages[-1]))
    mlflow = " ".join(
        " ".join(words) for words in pip_installs(parse(DOCKER / "mlflow.Dockerfile").stages[0])
    )
    for package in ("mlflow==", "psycopg2-binary==", "boto3=="):
        assert package in mlflow
