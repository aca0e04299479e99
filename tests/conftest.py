"""Test settings. Airflow reads its configuration on first import, so the environment is set here,
at import time, before any test module imports airflow: a throwaway AIRFLOW_HOME with a SQLite
metadata DB, the project's dags/ folder, no example DAGs; fleetbench's data in a temp folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Real benchmark logs from other people's machines, copied into the repository (SOURCES.md there says from where).
REAL_LOGS = ROOT / "tests" / "fixtures" / "real-logs"
VENV_BIN = Path(sys.executable).parent

_session_dir = Path(tempfile.mkdtemp(prefix="fleetbench-tests-"))
os.environ["AIRFLOW_HOME"] = str(_session_dir / "airflow")
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(ROOT / "dags")
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(ROOT / "plugins")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_session_dir}/airflow/airflow.db"
os.environ["FLEETBENCH_DATA_DIR"] = str(_session_dir / "data")
os.environ.pop("FLEETBENCH_CONFIG", None)
os.environ.pop("FLEETBENCH_WAREHOUSE_URL", None)
Path(os.environ["AIRFLOW_HOME"]).mkdir(parents=True)

REGISTRY = "127.0.0.1:5000"
SMOKE_IMAGE = f"{REGISTRY}/fleetbench/cpu-smoke:latest"
PG_URL = "postgresql+psycopg2://fleetbench:fleetbench@127.0.0.1:5432/fleetbench"
# The real harness: TensorFlow 2.15.1 CPU (include/images/tf-cpu, built by `make images`, local only) and the
# upstream tensorflow/benchmarks git repository its bake step clones: FLEETBENCH_TF_BENCHMARKS_GIT (a URL), else
# the unmodified copy in ../shared/vendor next to the project.
TF_IMAGE = "fleetbench/tf-cpu:latest"
TF_BENCHMARKS_VENDOR = ROOT.parent / "shared" / "vendor" / "tensorflow-benchmarks.git"


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_session_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """Migrate the throwaway Airflow metadata DB once per session."""
    proc = subprocess.run([str(VENV_BIN / "airflow"), "db", "migrate"], capture_output=True, text=True,
                          env=os.environ.copy())
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture()
def data_dir(tmp_path, monkeypatch) -> Path:
    """Per-test warehouse (SQLite) and artifact folder."""
    monkeypatch.setenv("FLEETBENCH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", f"sqlite:///{tmp_path}/warehouse.db")
    return tmp_path / "data"


@pytest.fixture(scope="session")
def docker_api():
    import docker

    api = docker.APIClient(version="auto")
    try:
        api.ping()
    except Exception as exc:  # the suite needs the engine: `make test` starts it
        pytest.fail(f"no Docker engine answers ({exc}); run `make test`, which starts one")
    yield api
    api.close()


@pytest.fixture(scope="session")
def smoke_image(docker_api) -> str:
    """The CPU smoke image in the local registry (pushed by `make test`)."""
    try:
        docker_api.inspect_distribution(SMOKE_IMAGE)
    except Exception as exc:
        pytest.fail(f"{SMOKE_IMAGE} is not in the registry ({exc}); run `make test`, which builds and pushes it")
    return SMOKE_IMAGE


@pytest.fixture(scope="session")
def pg_url() -> str:
    from sqlalchemy import create_engine, text

    engine = create_engine(PG_URL)
    try:
        with engine.connect() as conn:
            conn.execute(text("select 1"))
    except Exception as exc:
        pytest.fail(f"PostgreSQL does not answer at {PG_URL} ({exc}); run `make test`, which starts it")
    finally:
        engine.dispose()
    return PG_URL


@pytest.fixture()
def pg_database(pg_url):
    """The URL of a fresh PostgreSQL database, dropped after the test."""
    from pg_databases import fresh_database

    with fresh_database(pg_url) as url:
        yield url


@pytest.fixture()
def pg_engine(pg_database):
    """A fleetbench warehouse engine on a fresh PostgreSQL database (not migrated)."""
    from fleetbench.warehouse import get_engine

    engine = get_engine(pg_database)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def tf_image(docker_api) -> str:
    """The real TensorFlow 2.15.1 CPU image (no benchmark code: the bake step adds it)."""
    try:
        docker_api.inspect_image(TF_IMAGE)
    except Exception as exc:
        pytest.fail(f"{TF_IMAGE} is not built ({exc}); run `make images`, which builds it")
    return TF_IMAGE


@pytest.fixture(scope="session")
def tf_benchmarks_git() -> str:
    """The git URL of tensorflow/benchmarks for the real-harness tests; they skip, saying why, without one."""
    url = os.environ.get("FLEETBENCH_TF_BENCHMARKS_GIT")
    if url:
        return url
    if (TF_BENCHMARKS_VENDOR / "HEAD").is_file():
        if (TF_BENCHMARKS_VENDOR / "refs").is_dir():
            return f"file://{TF_BENCHMARKS_VENDOR}"
        # A copy that dropped empty folders: git does not take a bare repository without refs/ (its refs are all
        # in packed-refs). Clone from a session copy with the empty refs/ put back; the contents are unchanged.
        copy = _session_dir / "tensorflow-benchmarks.git"
        if not copy.exists():
            shutil.copytree(TF_BENCHMARKS_VENDOR, copy)
            for folder in [copy, *copy.rglob("*")]:
                folder.chmod(folder.stat().st_mode | 0o200)
            (copy / "refs" / "heads").mkdir(parents=True, exist_ok=True)
            (copy / "refs" / "tags").mkdir(exist_ok=True)
        return f"file://{copy}"
    pytest.skip(f"no tensorflow/benchmarks git repository: FLEETBENCH_TF_BENCHMARKS_GIT is not set and "
                f"{TF_BENCHMARKS_VENDOR} does not exist")
