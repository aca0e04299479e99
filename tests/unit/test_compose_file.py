"""docker-compose.yaml, Dockerfile and .env.example: the CeleryExecutor deployment, checked statically
(no image can be pulled here) and with `docker compose config` where a compose tool is installed; the
PostgreSQL roles script it mounts (scripts/postgres-roles.sh) run for real against the test server."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yaml"
ENV_EXAMPLE = ROOT / ".env.example"
ROLES_SCRIPT = ROOT / "scripts" / "postgres-roles.sh"
README = ROOT / "README.md"
CENTRAL = {"airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"}
WORKERS = {"airflow-worker", "airflow-gpu-worker"}
MONITORS = {"flower"}  # profile flower: Celery's monitor, on the central machine
AIRFLOW_SERVICES = CENTRAL | WORKERS | MONITORS
LONG_RUNNING = {"postgres", "redis"} | AIRFLOW_SERVICES - {"airflow-init"}
# Secrets every machine needs (compose requires them), and those of the central machine only.
FLEET_SECRETS = ("REDIS_PASSWORD", "CELERY_RESULTS_PASSWORD")
CENTRAL_SECRETS = ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__CORE__FERNET_KEY", "POSTGRES_PASSWORD",
                   "FLEETBENCH_WAREHOUSE_PASSWORD", "FLEETBENCH_WAREHOUSE_READER_PASSWORD",
                   "_AIRFLOW_WWW_USER_PASSWORD", "FLOWER_BASIC_AUTH")
SECRETS = FLEET_SECRETS + CENTRAL_SECRETS
MOUNTS = {"/opt/airflow/dags", "/opt/airflow/plugins", "/opt/airflow/include", "/opt/airflow/config"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())  # SafeLoader resolves the anchors and `<<` merge keys


def env_example() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines() if line and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


class MissingVariable(KeyError):
    pass


def interpolated(env: dict[str, str]) -> dict:
    """The compose file as compose resolves it with `env` (its whole text, every service, as compose
    does before it picks the services to start): ${X}, ${X:-default}, ${X-default}, ${X:?message}, $$."""
    def value(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group(1), m.group(2) or "", m.group(3) or ""
        unset, empty = name not in env, not env.get(name)
        if op in (":?", "?") and (empty if op == ":?" else unset):
            raise MissingVariable(f"{name}: {arg}")
        if op in (":-", "-") and (empty if op == ":-" else unset):
            return arg
        return env.get(name, "")

    return yaml.safe_load(re.sub(r"\$\$|\$\{(\w+)(?:(:?[-?])([^}]*))?\}", value, COMPOSE.read_text()))


def variables(value: object) -> set[str]:
    """The .env variables a compose value names (not $${X}: the container's own variables)."""
    return set(re.findall(r"(?<!\$)\$\{(\w+)", str(value)))


def test_the_official_services_and_the_gpu_host_worker(compose):
    assert set(compose["services"]) == {"postgres", "redis", "airflow-gpu-worker-init"} | AIRFLOW_SERVICES
    commands = {name: compose["services"][name].get("command") for name in AIRFLOW_SERVICES - {"airflow-init"}}
    assert commands["airflow-apiserver"] == "api-server"
    assert commands["airflow-scheduler"] == "scheduler"
    assert commands["airflow-dag-processor"] == "dag-processor"
    assert commands["airflow-triggerer"] == "triggerer"
    assert commands["airflow-worker"] == "celery worker --queues default"
    assert commands["airflow-gpu-worker"].startswith("celery worker --queues ${FLEETBENCH_WORKER_QUEUE")
    assert compose["services"]["airflow-gpu-worker"]["profiles"] == ["gpu-worker"]  # started on GPU hosts only


def test_flower_is_an_opt_in_profile_behind_a_login(compose):
    flower = compose["services"]["flower"]
    assert flower["profiles"] == ["flower"]  # `docker compose up -d` alone does not start it
    script = flower["command"][1]
    assert script.rstrip().endswith("exec /entrypoint airflow celery flower")
    assert 'exit 1' in script and "AIRFLOW__CELERY__FLOWER_BASIC_AUTH" in script  # no login: it does not start
    assert flower["environment"]["AIRFLOW__CELERY__FLOWER_BASIC_AUTH"] == "${FLOWER_BASIC_AUTH:-}"
    assert flower["ports"] == ["${FLOWER_PUBLISH:-127.0.0.1}:5555:5555"]  # loopback unless published
    assert "--user" in flower["healthcheck"]["test"][1]


def test_every_airflow_service_shares_executor_settings_and_the_central_ones_the_keys(compose):
    envs = {name: compose["services"][name]["environment"] for name in AIRFLOW_SERVICES}
    for name, env in envs.items():
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"].endswith("/execution/"), name
        assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://:${REDIS_PASSWORD"), name
        # the Celery result backend: its own role and database, not the metadata database's superuser
        backend = env["AIRFLOW__CELERY__RESULT_BACKEND"]
        assert backend.startswith("db+postgresql+psycopg2://"), name  # Celery would take SQLAlchemy's default driver
        assert variables(backend) >= {"CELERY_RESULTS_USER", "CELERY_RESULTS_PASSWORD", "CELERY_RESULTS_DB"}, name
        assert not variables(backend) & {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"}, name
    for key in ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__CORE__FERNET_KEY"):
        values = {envs[name][key] for name in CENTRAL}
        # one value for the central services, from .env (checked by airflow-init, see below)
        assert values == {f"${{{key}:-}}"}, (key, values)
    for name in CENTRAL:  # the metadata database: the central services only (workers: see below)
        assert (variables(envs[name]["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
                >= {"POSTGRES_USER", "POSTGRES_PASSWORD"}), name


def test_workers_get_no_metadata_database_fernet_key_or_jwt_secret(compose):
    """Airflow 3 workers reach the metadata only through the api-server's execution API, with the token
    the scheduler signed; the central secrets stay on the central machine (README "Deploying at fleet scale")."""
    services = compose["services"]
    for name in WORKERS:
        env = services[name]["environment"]
        for key in ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__API_AUTH__JWT_SECRET",
                    "AIRFLOW__API__SECRET_KEY"):
            assert key not in env, (name, key)
        # the central worker writes the warehouse (its own role); nothing else of the central secrets
        forbidden = set(CENTRAL_SECRETS) - ({"FLEETBENCH_WAREHOUSE_PASSWORD"} if name == "airflow-worker" else set())
        named = set().union(*(variables(v) for v in env.values()))
        assert not named & forbidden, (name, named & forbidden)
    # the GPU host's worker needs no warehouse (its tasks return through XCom); the central one writes it
    assert not any(k.startswith("FLEETBENCH_WAREHOUSE") for k in services["airflow-gpu-worker"]["environment"])
    assert "central" in services["airflow-gpu-worker"]["environment"]["AIRFLOW__CELERY__RESULT_BACKEND"]
    # resolved as compose does with a full .env: no central secret's value reaches a worker
    env = {**env_example(), **{k: f"value-of-{k.lower().strip('_')}" for k in SECRETS}}
    resolved = interpolated(env)["services"]
    for name, allowed in (("airflow-worker", ["FLEETBENCH_WAREHOUSE_PASSWORD"]), ("airflow-gpu-worker", [])):
        text = str(resolved[name]["environment"])
        assert [k for k in CENTRAL_SECRETS if env[k] in text] == allowed, name
    assert env["AIRFLOW__API_AUTH__JWT_SECRET"] in str(resolved["airflow-scheduler"]["environment"])


def test_a_gpu_host_env_holds_none_of_the_central_secrets(compose):
    """Compose interpolates every service on every machine: it may require only what a GPU host needs too.
    The central secrets are required where they are used: postgres and airflow-init refuse to start without."""
    text = COMPOSE.read_text()
    required = set(re.findall(r"(?<!\$)\$\{(\w+):?\?", text))
    assert required == set(FLEET_SECRETS), required
    gpu_host = {k: v for k, v in env_example().items() if k not in CENTRAL_SECRETS}
    gpu_host.update({k: f"value-of-{k.lower()}" for k in FLEET_SECRETS}, FLEETBENCH_CENTRAL_HOST="central.example")
    worker = interpolated(gpu_host)["services"]["airflow-gpu-worker"]["environment"]
    assert worker["AIRFLOW__CELERY__BROKER_URL"] == "redis://:value-of-redis_password@central.example:6379/0"
    with pytest.raises(MissingVariable, match="REDIS_PASSWORD"):
        interpolated({k: v for k, v in gpu_host.items() if k != "REDIS_PASSWORD"})
    services = compose["services"]
    postgres_check = " ".join(services["postgres"]["entrypoint"])
    init_check = services["airflow-init"]["command"][1]
    for key in ("POSTGRES_PASSWORD", "FLEETBENCH_WAREHOUSE_PASSWORD", "FLEETBENCH_WAREHOUSE_READER_PASSWORD",
                "CELERY_RESULTS_PASSWORD"):
        assert re.search(rf"for v in [^;]*\b{key}\b", postgres_check), key
    for key in ("AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__API_AUTH__JWT_SECRET", "_AIRFLOW_WWW_USER_PASSWORD"):
        assert re.search(rf"for v in [^;]*\b{key}\b", init_check), key
    assert 'exec docker-entrypoint.sh postgres' in postgres_check


def test_the_warehouse_has_its_own_roles_and_the_view_reads_as_the_reader(compose):
    services = compose["services"]
    urls = {name: {k: v for k, v in (services[name].get("environment") or {}).items()
                   if k.startswith("FLEETBENCH_WAREHOUSE") and k.endswith("URL")} for name in AIRFLOW_SERVICES}
    assert {name for name, u in urls.items() if u} == {"airflow-init", "airflow-worker", "airflow-apiserver"}
    writer = {"FLEETBENCH_WAREHOUSE_USER", "FLEETBENCH_WAREHOUSE_PASSWORD", "FLEETBENCH_WAREHOUSE_DB"}
    reader = {"FLEETBENCH_WAREHOUSE_READER_USER", "FLEETBENCH_WAREHOUSE_READER_PASSWORD", "FLEETBENCH_WAREHOUSE_DB"}
    for name in ("airflow-init", "airflow-worker"):  # migrations; store, report
        assert variables(urls[name]["FLEETBENCH_WAREHOUSE_URL"]) == writer, name
    api = urls["airflow-apiserver"]  # the results view only reads: no credential that writes
    assert set(api) == {"FLEETBENCH_WAREHOUSE_URL", "FLEETBENCH_WAREHOUSE_READ_URL"}
    assert all(variables(v) == reader for v in api.values()), api
    # the roles and databases come from the script the postgres image runs on a new volume
    postgres = services["postgres"]
    assert ("${AIRFLOW_PROJ_DIR:-.}/scripts/postgres-roles.sh:/docker-entrypoint-initdb.d/10-fleetbench-roles.sh:ro"
            in postgres["volumes"])
    assert os.access(ROLES_SCRIPT, os.X_OK)  # executed (not sourced) by the image's entrypoint
    for key in ("CELERY_RESULTS_PASSWORD", "FLEETBENCH_WAREHOUSE_PASSWORD", "FLEETBENCH_WAREHOUSE_READER_PASSWORD",
                "CELERY_RESULTS_USER", "FLEETBENCH_WAREHOUSE_USER", "FLEETBENCH_WAREHOUSE_READER_USER",
                "FLEETBENCH_WAREHOUSE_DB", "CELERY_RESULTS_DB"):
        assert variables(postgres["environment"][key]) == {key}, key


def test_the_view_prefers_the_read_only_url(monkeypatch):
    from fleetbench.warehouse import warehouse_read_url, warehouse_url

    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", "postgresql://writer:w@db/fleetbench")
    monkeypatch.delenv("FLEETBENCH_WAREHOUSE_READ_URL", raising=False)
    assert warehouse_read_url() == warehouse_url() == "postgresql://writer:w@db/fleetbench"
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_READ_URL", "postgresql://reader:r@db/fleetbench")
    assert warehouse_read_url() == "postgresql://reader:r@db/fleetbench"


def test_readme_says_what_the_docker_socket_grants():
    section = README.read_text().split("## Deploying at fleet scale", 1)[1].split("\n## ", 1)[0]
    assert "/var/run/docker.sock" in section and "root-equivalent" in section
    assert "scripts/postgres-roles.sh" in section and "FLEETBENCH_WAREHOUSE_READ_URL" in section


def test_code_and_config_are_mounted_into_every_airflow_service(compose):
    for name in AIRFLOW_SERVICES:
        targets = {re.search(r":(/[^:]*)(:ro|:rw)?$", v).group(1) for v in compose["services"][name]["volumes"]}
        assert MOUNTS <= targets, (name, targets)
        assert "/opt/airflow/fleetbench-data" in targets, name  # artifacts every worker must share
    gpu = compose["services"]["airflow-gpu-worker"]["volumes"]
    assert "/var/run/docker.sock:/var/run/docker.sock" in gpu  # topology (b): the host's own engine
    assert "root-equivalent" in COMPOSE.read_text()  # and what that grants, said where it is mounted
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
    # the GPU host's worker must not start a local PostgreSQL/Redis: it uses the central machine's; it waits only for
    # the local init that makes its folders and gives them to its user (airflow-init runs on the central machine)
    assert services["airflow-gpu-worker"]["depends_on"] == {
        "airflow-gpu-worker-init": {"condition": "service_completed_successfully"}}
    init_gpu = services["airflow-gpu-worker-init"]
    assert init_gpu["profiles"] == ["gpu-worker"] and init_gpu["user"] == "0:0"
    def target(volume: str) -> str:
        return re.search(r":(/[^:]*)(:ro|:rw)?$", volume).group(1)

    gpu_writes = {target(v) for v in services["airflow-gpu-worker"]["volumes"]
                  if target(v) in ("/opt/airflow/logs", "/opt/airflow/config", "/opt/airflow/fleetbench-data")}
    assert gpu_writes == {target(v) for v in init_gpu["volumes"]} == {
        "/opt/airflow/logs", "/opt/airflow/config", "/opt/airflow/fleetbench-data"}
    for folder in gpu_writes:
        assert folder in init_gpu["command"][1] and 'chown -R "${AIRFLOW_UID:-50000}:0"' in init_gpu["command"][1]
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


def test_docker_compose_config_accepts_the_file(tmp_path):
    cmd = compose_command()
    if cmd is None:
        if os.environ.get("CI"):  # it went stale unnoticed while every run skipped it
            pytest.fail("no docker compose / docker-compose: `bash scripts/ensure-compose.sh` (make test-services) "
                        "installs Debian's docker-compose")
        pytest.skip("no docker compose / docker-compose installed (bash scripts/ensure-compose.sh)")
    filled = tmp_path / "env"
    filled.write_text("\n".join(f"{k}={'test-' + k.lower().strip('_') if k in SECRETS else v}"
                                for k, v in env_example().items()) + "\n")
    base = [*cmd, "--project-directory", str(ROOT), "-f", str(COMPOSE)]
    proc = subprocess.run([*base, "--env-file", str(filled), "--profile", "gpu-worker", "config"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    resolved = yaml.safe_load(proc.stdout)["services"]
    assert set(resolved) == {"postgres", "redis", "airflow-gpu-worker-init"} | AIRFLOW_SERVICES
    jwt = {resolved[name]["environment"]["AIRFLOW__API_AUTH__JWT_SECRET"] for name in CENTRAL}
    assert jwt == {"test-airflow__api_auth__jwt_secret"}
    assert not any("AIRFLOW__API_AUTH__JWT_SECRET" in resolved[name]["environment"] for name in WORKERS)
    # .env.example as it is (secrets empty): refused, naming what is missing
    empty = subprocess.run([*base, "--env-file", str(ENV_EXAMPLE), "config"], capture_output=True, text=True,
                           timeout=120)
    assert empty.returncode != 0 and "in .env" in empty.stderr
    # a GPU host's .env: the two fleet secrets, none of the central ones
    gpu_env = tmp_path / "gpu-env"
    gpu_env.write_text("\n".join(f"{k}={'test-' + k.lower() if k in FLEET_SECRETS else v}"
                                  for k, v in env_example().items() if k not in CENTRAL_SECRETS) + "\n")
    gpu = subprocess.run([*base, "--env-file", str(gpu_env), "--profile", "gpu-worker", "config"],
                         capture_output=True, text=True, timeout=120)
    assert gpu.returncode == 0, gpu.stderr
    worker = yaml.safe_load(gpu.stdout)["services"]["airflow-gpu-worker"]["environment"]
    assert worker["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://:test-redis_password@")


# -- scripts/postgres-roles.sh, run for real ------------------------------------------------------
def need_superuser() -> None:
    """The test role of PG_URL may create databases, not roles: the script runs as the server's superuser."""
    if os.geteuid() != 0 or not shutil.which("runuser") or not shutil.which("psql"):
        pytest.skip("needs root, runuser and psql to act as the PostgreSQL superuser")
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("no postgres OS user (the superuser's peer login)")


def superuser_psql(*args: str, input: str | None = None, env: dict[str, str] | None = None):
    """psql (or a script) as the server's superuser over its local socket, as the postgres image runs
    /docker-entrypoint-initdb.d/ scripts."""
    return subprocess.run(["runuser", "-u", "postgres", "--", *args], input=input, capture_output=True, text=True,
                          cwd="/", timeout=120, env={"PATH": os.environ["PATH"], "PGPORT": "5432", **(env or {})})


def run_roles_script(env: dict[str, str]) -> None:
    proc = superuser_psql("bash", "-s", input=ROLES_SCRIPT.read_text(), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def url_of(user: str, password: str, db: str) -> str:
    return f"postgresql+psycopg2://{user}:{password}@127.0.0.1:5432/{db}"


@pytest.fixture()
def pg_roles(pg_url, request):
    """The roles script run (twice: it is idempotent) with throwaway role and database names; with
    `request.param` true on a warehouse that the test role created and migrated first (a deployment
    from before the script, whose warehouse the superuser owned)."""
    from pg_databases import fresh_database

    need_superuser()
    tag = uuid.uuid4().hex[:8]
    names = SimpleNamespace(wh=f"fbt_wh_{tag}", reader=f"fbt_rd_{tag}", celery=f"fbt_cel_{tag}",
                            wh_db=f"fbt_whdb_{tag}", celery_db=f"fbt_celdb_{tag}",
                            wh_pw=uuid.uuid4().hex, reader_pw=uuid.uuid4().hex, celery_pw=uuid.uuid4().hex)
    with fresh_database(pg_url, prefix="fbt_meta") as metadata_url:
        names.metadata_url = metadata_url
        names.metadata_db = metadata_url.rsplit("/", 1)[1]
        try:
            if getattr(request, "param", False):
                from fleetbench.warehouse import get_engine, store_run, upgrade
                from warehouse_rows import result_row, run_row

                admin = get_engine(pg_url)
                with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                    conn.exec_driver_sql(f'CREATE DATABASE "{names.wh_db}"')
                admin.dispose()
                old = get_engine(pg_url.rsplit("/", 1)[0] + "/" + names.wh_db)
                upgrade(old)
                store_run(old, run_row("r0"), [], [result_row("c0", run_id="r0")])
                old.dispose()
            env = {"POSTGRES_USER": "postgres", "POSTGRES_DB": names.metadata_db,
                   "CELERY_RESULTS_USER": names.celery, "CELERY_RESULTS_DB": names.celery_db,
                   "CELERY_RESULTS_PASSWORD": names.celery_pw,
                   "FLEETBENCH_WAREHOUSE_USER": names.wh, "FLEETBENCH_WAREHOUSE_DB": names.wh_db,
                   "FLEETBENCH_WAREHOUSE_PASSWORD": names.wh_pw,
                   "FLEETBENCH_WAREHOUSE_READER_USER": names.reader,
                   "FLEETBENCH_WAREHOUSE_READER_PASSWORD": names.reader_pw}
            run_roles_script(env)
            run_roles_script(env)
            names.warehouse_url = url_of(names.wh, names.wh_pw, names.wh_db)
            names.reader_url = url_of(names.reader, names.reader_pw, names.wh_db)
            names.celery_url = url_of(names.celery, names.celery_pw, names.celery_db)
            yield names
        finally:
            superuser_psql("psql", "-q", "-c", f'DROP DATABASE IF EXISTS "{names.wh_db}" WITH (FORCE)',
                           "-c", f'DROP DATABASE IF EXISTS "{names.celery_db}" WITH (FORCE)',
                           "-c", f'DROP ROLE IF EXISTS "{names.wh}", "{names.reader}", "{names.celery}"')


def sqlstate(engine, *statements: str, read_write: bool = False) -> str | None:
    """The SQLSTATE the last statement fails with (None: it ran), in a transaction rolled back afterwards."""
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    with engine.connect() as conn:
        try:
            if read_write:  # past the reader's default_transaction_read_only: the privileges themselves
                conn.execute(text("SET TRANSACTION READ WRITE"))
            for statement in statements:
                conn.execute(text(statement))
        except DBAPIError as exc:
            return exc.orig.pgcode
        finally:
            conn.rollback()
    return None


def connect_error(url: str) -> str:
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import OperationalError

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(text("select 1"))
    except OperationalError as exc:
        return str(exc.orig)
    finally:
        engine.dispose()
    return ""


def check_roles(names, stored_before: int = 0) -> None:
    """The warehouse role migrates and writes its database; the reader reads every table and view (the
    results view included) and may change nothing; no role reaches a database that is not its own."""
    from alembic.script import ScriptDirectory
    from fastapi.testclient import TestClient
    from sqlalchemy import inspect, text

    from fleetbench.regression import store_findings
    from fleetbench.report.web import create_app
    from fleetbench.warehouse import MIGRATIONS, current_revision, get_engine, store_run, upgrade
    from warehouse_rows import result_row, run_row

    writer, reader = get_engine(names.warehouse_url), get_engine(names.reader_url)
    try:
        upgrade(writer)
        assert current_revision(writer) == ScriptDirectory(str(MIGRATIONS)).get_current_head()
        assert store_run(writer, run_row("r1"), [], [result_row("c1"), result_row("c2")])["written"] == 2
        store_findings(writer, "fleet_benchmark", "r1", [])

        tables = inspect(reader).get_table_names() + inspect(reader).get_view_names()
        assert {"benchmark_results", "runs", "steps", "regressions", "alembic_version"} <= set(tables)
        with reader.connect() as conn:
            for table in tables:
                conn.execute(text(f'SELECT * FROM "{table}" LIMIT 1'))
            assert conn.execute(text("SELECT count(*) FROM benchmark_results")).scalar() == 2 + stored_before
        with TestClient(create_app(engine_factory=lambda: reader)) as client:
            data = client.get("/report.json").json()
        assert data["state"] == "ok" and data["summary"]["results"] == 2 + stored_before

        insert = "INSERT INTO runs (dag_id, run_id) VALUES ('d', 'r')"
        assert sqlstate(reader, insert) == "25006"  # read-only transaction (the role's default) ...
        for statement in (insert, "UPDATE benchmark_results SET images_per_sec = 0", "DELETE FROM steps",
                          "TRUNCATE runs CASCADE", "CREATE TABLE x (i int)", "CREATE VIEW x AS SELECT 1",
                          "CREATE TEMP TABLE x (i int)", "DROP TABLE runs CASCADE"):
            assert sqlstate(reader, statement, read_write=True) == "42501", statement  # ... and no privilege

        for user, password in ((names.wh, names.wh_pw), (names.reader, names.reader_pw),
                               (names.celery, names.celery_pw)):
            assert "CONNECT privilege" in connect_error(url_of(user, password, names.metadata_db)), user
        assert "CONNECT privilege" in connect_error(url_of(names.reader, names.reader_pw, names.celery_db))
        assert "CONNECT privilege" in connect_error(url_of(names.celery, names.celery_pw, names.wh_db))
    finally:
        writer.dispose()
        reader.dispose()


@pytest.mark.integration  # a PostgreSQL superuser: `make test` runs it, `make test-unit` does not
@pytest.mark.parametrize("pg_roles", [False], indirect=True, ids=["new-volume"])
def test_roles_script_gives_warehouse_reader_and_result_backend_their_own_roles(pg_roles):
    from celery import Celery

    check_roles(pg_roles)
    # the Celery result backend's role creates its tables (as `airflow celery worker` does) and stores a state
    app = Celery("fleetbench-roles-test", backend="db+" + pg_roles.celery_url)
    try:
        app.backend.store_result("task-1", 42, "SUCCESS")
        assert app.backend.get_task_meta("task-1")["status"] == "SUCCESS"
    finally:
        app.backend.ResultSession().get_bind().dispose()


@pytest.mark.integration  # a PostgreSQL superuser: `make test` runs it, `make test-unit` does not
@pytest.mark.parametrize("pg_roles", [True], indirect=True, ids=["warehouse-from-before"])
def test_roles_script_takes_over_a_warehouse_another_role_created(pg_roles):
    from fleetbench.warehouse import downgrade, get_engine, upgrade

    check_roles(pg_roles, stored_before=1)
    writer = get_engine(pg_roles.warehouse_url)
    try:  # the warehouse role owns every table now: it can migrate down and up again
        downgrade(writer, "base")
        upgrade(writer)
    finally:
        writer.dispose()
