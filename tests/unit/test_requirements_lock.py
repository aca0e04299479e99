"""requirements.lock stands in for Airflow's constraints file: it pins every requirement of requirements.txt
(and what they need) to one version that satisfies it, and `make venv` and the Dockerfile install with it."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            assert canonicalize_name(name) not in pins, f"{name} pinned twice"
            pins[canonicalize_name(name)] = version
    return pins


def requirements(path: str) -> list[Requirement]:
    lines = (ROOT / path).read_text().splitlines()
    return [Requirement(line.split("#")[0]) for line in lines if line.split("#")[0].strip()]


def test_every_requirement_is_pinned_to_a_version_that_satisfies_it():
    pins = lock()
    for req in requirements("requirements.txt"):
        version = pins.get(canonicalize_name(req.name))
        assert version is not None, f"{req.name} is not in requirements.lock"
        assert req.specifier.contains(version, prereleases=True), f"{req.name}=={version} does not satisfy {req}"
    assert pins["apache-airflow"] == pins["apache-airflow-core"]
    assert len(pins) > 100  # the whole resolved set, not just the direct requirements


def test_test_tools_stay_out_of_the_lock():
    pins = lock()
    for req in requirements("requirements-dev.txt"):
        assert canonicalize_name(req.name) not in pins, req.name


def test_make_venv_and_the_image_install_with_it():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^\$\(VENV\)/\.installed:.*requirements\.lock", makefile, re.M)
    assert "pip install -q -r requirements.txt -c requirements.lock" in makefile
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"-r /opt/airflow/requirements\.txt \\\n\s+-c /opt/airflow/requirements\.lock", dockerfile)
    assert "COPY --chown=airflow:0 requirements.txt requirements.lock /opt/airflow/" in dockerfile


def test_the_package_declares_what_it_imports_and_the_lock_satisfies_it():
    """pyproject.toml's dependencies: each is a requirement of requirements.txt, and its locked version fits."""
    import tomllib

    declared = [Requirement(d) for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    assert {canonicalize_name(d.name) for d in declared} >= {"apache-airflow", "apache-airflow-providers-docker",
                                                           "docker", "pandas", "sqlalchemy", "pydantic"}
    runtime = {canonicalize_name(r.name) for r in requirements("requirements.txt")}
    pins = lock()
    for dep in declared:
        assert canonicalize_name(dep.name) in runtime, f"{dep.name} is not in requirements.txt"
        assert dep.specifier.contains(pins[canonicalize_name(dep.name)], prereleases=True), dep
