"""Hosts reached over SSH in tests: the test sshd on this same machine (127.0.0.1:2222, key auth, files in
/var/lib/fleetbench/sshd from scripts/ensure-sshd.sh) and Airflow SSH connections to it.

Its docker CLI talks to this machine's engine, so a "remote" host over SSH sees the same engine as the
local socket (and as the TLS proxy of `celery_cluster.DockerTLSProxy`, which fronts that socket).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

SSHD_DIR = Path("/var/lib/fleetbench/sshd")
SSHD_PORT = 2222


def ssh_connection(port: int = SSHD_PORT) -> dict:
    """An Airflow SSH connection (conn_type, host, port, login, extra) to the test sshd: the client key as a
    file, the server's host key pinned in the extra and checked (`no_host_key_check` false)."""
    host_key = " ".join((SSHD_DIR / "known_hosts").read_text().split()[1:3])
    return {"conn_type": "ssh", "host": "127.0.0.1", "port": port, "login": "root",
            "extra": {"key_file": str(SSHD_DIR / "client_key"), "host_key": host_key, "no_host_key_check": False}}


def define_ssh_connection(monkeypatch, conn_id: str, port: int = SSHD_PORT) -> str:
    """Define `conn_id` for this process (AIRFLOW_CONN_<ID>, what dag.test and the pipeline steps read)."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(ssh_connection(port)))
    return conn_id


@pytest.fixture()
def sshd(monkeypatch, tmp_path):
    """The test sshd answers; HOME is a fresh folder, so no personal known_hosts takes part."""
    try:
        socket.create_connection(("127.0.0.1", SSHD_PORT), timeout=2).close()
    except OSError as exc:
        pytest.fail(f"no sshd on 127.0.0.1:{SSHD_PORT} ({exc}); run `bash scripts/ensure-sshd.sh`")
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


__all__ = ["SSHD_DIR", "SSHD_PORT", "define_ssh_connection", "ssh_connection", "sshd"]
