"""docker-compose.yaml, Dockerfile and .env.example: the CeleryExecutor deployment, checked statically
(no image can be pulled here) and with `docker compose config` where a compose tool is installed."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yaml"
ENV_EXAMPLE = ROOT / ".env.example"
AIRFLOW_SERVICES = {"airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
                    "airflow-triggerer", "airflow-worker", "airflow-gpu-worker"}
LONG_RUNNING = {"postgres", "redis"} | AIRFLOW_SERVICES - {"airflow-init"}
SECRETS = ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__CORE__FERNET_KEY", "POSTGRES_PASSWORD", "REDIS_PASSWORD",
           "_AIRFLOW_WWW_USER_PASSWORD")
MOUNTS = {"/opt/airflow/dags", "/opt/airflow/plugins", "/opt/airflow/include", "/opt/airflow/config"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())  # SafeLoader resolves the anchors and `<<` merge keys


def env_example() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines() if line and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def test_the_official_services_and_the_gpu_host_worker(compose):
    assert set(compose["services"]) == {"postgres", "redis"} | AIRFLOW_SERVICES
    commands = {name: compose["services"][name].get("command") for name in AIRFLOW_SERVICES - {"airflow-init"}}
    assert commands["airflow-apiserver"] == "api-server"
    assert commands["airflow-scheduler"] == "scheduler"
    assert commands["airflow-dag-processor"] == "dag-processor"
    assert commands["airflow-triggerer"] == "triggerer"
    assert commands["airflow-worker"] == "celery worker --queues default"
    assert commands["airflow-gpu-worker"].startswith("celery worker --queues ${FLEETBENCH_WORKER_QUEUE")
    assert compose["services"]["airflow-gpu-worker"]["profiles"] == ["gpu-worker"]  # started on GPU hosts only


def test_every_airflow_service_shares_executor_secrets_and_api_url(compose):
    envs = {name: compose["services"][name]["environment"] for name in AIRFLOW_SERVICES}
    for name, env in envs.items():
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"].endswith("/execution/"), name
        assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://:${REDIS_PASSWORD"), name
    for key in ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__CORE__FERNET_KEY"):
        values = {env[key] for env in envs.values()}
        # one value for all services, from .env, and required (compose refuses to start without it)
        assert values == {f"${{{key}:?set {key} in .env}}"}, (key, values)


def test_code_and_config_are_mounted_into_every_airflow_service(compose):
    for name in AIRFLOW_SERVICES:
        targets = {re.search(r":(/[^:]*)(:ro|:rw)?$", v).group(1) for v in compose["services"][name]["volumes"]}
        assert MOUNTS <= targets, (name, targets)
        assert "/opt/airflow/fleetbench-data" in targets, name  # artifacts every worker must share
    gpu = compose["services"]["airflow-gpu-worker"]["volumes"]
    assert "/var/run/docker.sock:/var/run/docker.sock" in gpu  # topology (b): the host's own engine
    assert not any("docker.sock" in v for v in compose["services"]["airflow-worker"]["volumes"])


def test_healthchecks_and_start_order(compose):
    services = compose["services"]
    for name in LONG_RUNNING:
        assert services[name]["healthcheck"]["test"], name
    for name in AIRFLOW_SERVICES - {"airflow-init", "airflow-gpu-worker"}:
        deps = services[name]["depends_on"]
        assert deps["postgres"]["condition"] == deps["redis"]["condition"] == "service_healthy", name
        assert deps["airflow-init"]["condition"] == "service_completed_successfully", name
    assert services["airflow-worker"]["depends_on"]["airflow-apiserver"]["condition"] == "service_healthy"
    # the GPU host's worker must not start a local PostgreSQL/Redis: it uses the central machine's
    assert "depends_on" not in services["airflow-gpu-worker"]
    assert "central" in services["airflow-gpu-worker"]["environment"]["AIRFLOW__CELERY__BROKER_URL"]
    init = services["airflow-init"]
    assert init["environment"]["_AIRFLOW_DB_MIGRATE"] == "true"
    script = init["command"][1]
    assert "fleetbench db upgrade" in script and "airflow pools import" in script


def test_image_is_built_from_requirements():
    dockerfile = (ROOT / "Dockerfile").read_text()
    requirements = (ROOT / "requirements.txt").read_text()
    pinned = re.search(r"^apache-airflow==([\d.]+)", requirements, re.M).group(1)
    assert f"ARG AIRFLOW_VERSION={pinned}" in dockerfile
    assert "FROM apache/airflow:${AIRFLOW_VERSION}-python${PYTHON_VERSION}" in dockerfile
    assert "-r /opt/airflow/requirements.txt" in dockerfile
    assert re.search(r"^apache-airflow-providers-celery==", requirements, re.M)


def test_env_example_documents_every_variable_and_holds_no_secret(compose):
    used = set(re.findall(r"(?<!\$)\$\{(\w+)", COMPOSE.read_text()))  # $${X}: the container's own variable
    documented = env_example()
    assert used <= set(documented), sorted(used - set(documented))
    for key in SECRETS:
        assert documented[key] == "", f"{key} must be empty in .env.example (generate it, keep it in .env)"


def compose_command() -> list[str] | None:
    """`docker compose` (v2 plugin) or `docker-compose` (Debian's v1), whichever answers."""
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) and subprocess.run([*cmd, "version"], capture_output=True).returncode == 0:
            return cmd
    return None


@pytest.mark.skipif(compose_command() is None, reason="no docker compose / docker-compose installed")
def test_docker_compose_config_accepts_the_file(tmp_path):
    cmd = compose_command()
    filled = tmp_path / "env"
    filled.write_text("\n".join(f"{k}={'test-' + k.lower().strip('_') if k in SECRETS else v}"
                                for k, v in env_example().items()) + "\n")
    base = [*cmd, "--project-directory", str(ROOT), "-f", str(COMPOSE)]
    proc = subprocess.run([*base, "--env-file", str(filled), "--profile", "gpu-worker", "config"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    resolved = yaml.safe_load(proc.stdout)["services"]
    assert set(resolved) == {"postgres", "redis"} | AIRFLOW_SERVICES
    jwt = {resolved[name]["environment"]["AIRFLOW__API_AUTH__JWT_SECRET"] for name in AIRFLOW_SERVICES}
    assert jwt == {"test-airflow__api_auth__jwt_secret"}
    # .env.example as it is (secrets empty): refused, naming what is missing
    empty = subprocess.run([*base, "--env-file", str(ENV_EXAMPLE), "config"], capture_output=True, text=True, timeout=120)
    assert empty.returncode != 0 and "in .env" in empty.stderr
