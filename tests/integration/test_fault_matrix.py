"""Faults from outside a case, produced for real: each ends classified (or cleaned), with no container left.

Engine lost mid-case is in test_case_failures.py (a proxy in front of the engine is cut).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from fleetbench.cleanup import TIMEOUT_LABEL, clean_engine

pytestmark = pytest.mark.integration

BASE = "fleetbench/base:bookworm"

WORKER = """
import sys
from fleetbench.airflow.operators import BenchmarkCaseOperator

name, token, log_dir = sys.argv[1:4]
BenchmarkCaseOperator(
    task_id="run_case", image="%s", command=["sh", "-c", "echo case started; sleep 300"], container_name=name,
    labels={"org.fleetbench.managed": "true", "org.fleetbench.run_id": "sigkill-" + token,
            "org.fleetbench.test": token, "%s": "3"},
    case={"host": "localhost", "case_key": "sigkill." + token}, log_dir=log_dir, timeout_s=3,
).execute({})
""" % (BASE, TIMEOUT_LABEL)


def test_worker_sigkilled_mid_case_leaves_an_orphan_that_maintenance_reaps(docker_api, tmp_path):
    """The worker process running a case is SIGKILLed (no on_kill, no finally): its container keeps running,
    holding what it holds. Maintenance finds it past its own timeout label and stops and removes it."""
    token = uuid.uuid4().hex[:10]
    name = f"fbtest-{token}-sigkill"
    worker = subprocess.Popen([sys.executable, "-c", WORKER, name, token, str(tmp_path)], env=os.environ.copy(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not docker_api.containers(filters={"name": name, "status": "running"}):
            assert worker.poll() is None, "the worker ended before its case started"
            time.sleep(0.2)
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        scope = {"org.fleetbench.test": token}
        orphan = docker_api.containers(filters={"label": "org.fleetbench.test=" + token})
        assert [c["State"] for c in orphan] == ["running"]  # nobody stopped it

        early = clean_engine(docker_api, scope=scope, orphan_grace_s=60)
        assert early.removed_containers == [] and "container is running" in early.kept[0]["reason"]
        time.sleep(4)  # past its timeout of 3 s (grace 0 below)
        report = clean_engine(docker_api, scope=scope, orphan_grace_s=0)
        assert [c["name"] for c in report.removed_containers] == [name], report
        assert "past its timeout of 3 s" in report.removed_containers[0]["reason"] and report.errors == []
        assert docker_api.containers(all=True, filters={"label": "org.fleetbench.test=" + token}) == []
    finally:
        if worker.poll() is None:
            worker.kill()
        for c in docker_api.containers(all=True, filters={"label": "org.fleetbench.test=" + token}):
            docker_api.remove_container(c["Id"], force=True)
