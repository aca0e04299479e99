"""Host validation for real: this machine (no GPU) locally and over SSH to the test sshd on 127.0.0.1:2222.

The sshd (scripts/ensure-sshd.sh) runs on this same machine, so facts gathered over SSH must equal
the local ones. Airflow SSH connections are defined per test with AIRFLOW_CONN_* variables, and
HOME points at an empty folder so no personal ~/.ssh/known_hosts or config takes part.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetbench.hosts import HostNeeds, LocalRunner, evaluate, facts_from_dir, gather, verdict
from fleetbench.hosts.probes import GPU_SMOKE_LABEL, Probe

pytestmark = pytest.mark.integration

VENV_BIN = Path(sys.executable).parent
SSHD_DIR = Path("/var/lib/fleetbench/sshd")
SSHD_PORT = 2222
GPU_SMOKE_IMAGE = "fleetbench/base:bookworm"
CONTRACT_FACTS = {"kernel", "driver_version", "cuda_driver_version", "gpus", "docker_version", "nvidia_runtime",
                  "default_runtime"}
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"


def server_host_key() -> str:
    """'ssh-ed25519 AAAA...' of the test sshd, from its known_hosts entry ('[127.0.0.1]:2222 ssh-ed25519 AAAA...')."""
    return " ".join((SSHD_DIR / "known_hosts").read_text().split()[1:3])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def sshd() -> None:
    try:
        socket.create_connection(("127.0.0.1", SSHD_PORT), timeout=2).close()
    except OSError as exc:
        pytest.fail(f"no sshd on 127.0.0.1:{SSHD_PORT} ({exc}); run `bash scripts/ensure-sshd.sh`")


@pytest.fixture()
def ssh_conn(sshd, monkeypatch, tmp_path):
    """Define an Airflow SSH connection (key auth as root) and return its id; extras override the defaults."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))

    def define(conn_id: str = "fleet_ssh", port: int = SSHD_PORT, **extra) -> str:
        extra = {"key_file": str(SSHD_DIR / "client_key"), "no_host_key_check": False, **extra}
        extra = {k: v for k, v in extra.items() if v is not None}
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(
            {"conn_type": "ssh", "host": "127.0.0.1", "port": port, "login": "root", "extra": extra}))
        return conn_id

    return define


def fleetbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "fleetbench"), *args], capture_output=True, text=True, timeout=120,
                          env=os.environ.copy())


def ssh_gather(conn_id: str, folder: Path, **kwargs) -> float:
    """Gather over SSH; returns the seconds it took (the provider is imported before the clock starts)."""
    import airflow.providers.ssh.hooks.ssh  # noqa: F401

    from fleetbench.hosts.ssh import SSHRunner

    start = time.monotonic()
    gather(SSHRunner(conn_id), folder, **kwargs)
    return time.monotonic() - start


# -- local ---------------------------------------------------------------------------------------------
def test_local_host_is_ready_for_cpu_cases(docker_api, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where its probe outputs go without --save
    proc = fleetbench("host-check", "--local")
    assert proc.returncode == 0, proc.stderr
    assert list(tmp_path.iterdir()) == []  # and are gone after it (they were left in /tmp on every run)
    result = json.loads(proc.stdout)
    assert result["verdict"] == "ready", result["checks"]
    facts = result["facts"]
    assert set(facts) == CONTRACT_FACTS
    assert facts["kernel"] == os.uname().release
    assert facts["docker_version"] == docker_api.version()["Version"]
    assert facts["default_runtime"] == docker_api.info()["DefaultRuntime"]
    assert (facts["gpus"], facts["driver_version"], facts["nvidia_runtime"]) == ([], None, False)
    assert [c["name"] for c in result["checks"]] == ["reachable", "kernel", "docker", "disk"]


def test_local_host_is_unfit_for_gpu_cases_and_the_smoke_container_fails_for_real(docker_api, tmp_path):
    try:
        docker_api.inspect_image(GPU_SMOKE_IMAGE)
    except Exception as exc:
        pytest.fail(f"{GPU_SMOKE_IMAGE} is missing ({exc}); run `make test`, which builds it")
    saved = tmp_path / "facts"
    proc = fleetbench("host-check", "--local", "--gpus", "1", "--image-cuda", "12.1",
                      "--gpu-smoke-image", GPU_SMOKE_IMAGE, "--save", str(saved))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    checks = {c["name"]: c for c in result["checks"]}
    assert result["verdict"] == "unfit"
    assert checks["nvidia_driver"]["detail"] == "no NVIDIA driver: nvidia-smi not found"
    assert checks["gpu_smoke"]["status"] == "fail"
    assert 'could not select device driver "" with capabilities: [[gpu]]' in checks["gpu_smoke"]["detail"]
    assert 'could not select device driver "" with capabilities: [[gpu]]' in (saved / "gpu-smoke.txt").read_text()
    smoke = next(p for p in json.loads((saved / "probes.json").read_text())["probes"]
                 if p["filename"] == "gpu-smoke.txt")
    assert smoke["exit_code"] == 125 and "--gpus" in smoke["command"] and GPU_SMOKE_IMAGE in smoke["command"]
    assert docker_api.containers(all=True, filters={"label": GPU_SMOKE_LABEL}) == []
    # the saved folder is evaluated offline to the same answer
    again = fleetbench("host-check", "--facts", str(saved), "--gpus", "1", "--image-cuda", "12.1")
    assert json.loads(again.stdout) == result


def test_a_docker_engine_that_is_gone_is_named(tmp_path):
    gather(LocalRunner(env={**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}), tmp_path)
    checks = {c.name: c for c in evaluate(facts_from_dir(tmp_path), HostNeeds())}
    assert checks["docker"].status == "fail"
    assert checks["docker"].detail.startswith(
        "Docker engine not reachable: docker-info.json: Cannot connect to the Docker daemon")


def test_a_probe_that_hangs_is_cut_off_and_its_fact_is_unknown(tmp_path):
    start = time.monotonic()
    gather(LocalRunner(), tmp_path, timeout_s=0.5, probes=(Probe("uname-r.txt", ("sh", "-c", "sleep 10")),))
    assert time.monotonic() - start < 3
    assert facts_from_dir(tmp_path).unknown["kernel"] == "uname-r.txt: timed out after 0.5 s"


def test_pipeline_validates_a_gpu_host_here_as_unfit_with_the_real_smoke_container(data_dir, smoke_image, docker_api,
                                                                                    tmp_path):
    """validate_host as the DAG calls it, on a plan from a config: GPU cases -> smoke container with the case's
    image."""
    from fleet_configs import smoke_config, write_config
    from fleetbench.airflow.pipeline import make_plan, validate_host

    cfg = smoke_config(smoke_image, models=("trivial",), batch_sizes=(8,), device="gpu", num_gpus=[1])
    cfg["images"][0]["cuda"] = "12.1"
    cfg["hosts"][0]["min_free_gb"] = 1.5
    run = {"dag_id": "fleet_benchmark", "run_id": "validate_test", "logical_date": None, "run_type": "manual"}
    plan = make_plan(run, str(write_config(tmp_path / "fleet.yaml", cfg)))
    host = plan["hosts"][0]
    assert host["needs"] == {"gpus": 1, "image_cuda": "12.1", "whole_gpus": 1, "fewest_whole_gpus": 1, "mig": {}}
    result = validate_host(host, plan["run"])
    checks = {c["name"]: c for c in result["checks"]}
    assert result["verdict"] == "unfit"
    assert result["reasons"].startswith("nvidia_driver: no NVIDIA driver: nvidia-smi not found")
    assert checks["gpu_smoke"]["status"] == "fail" and "[[gpu]]" in checks["gpu_smoke"]["detail"]
    assert checks["driver_cuda"]["detail"] == "driver version unknown; CUDA 12.1 needs >= 530.30.02"
    folder = Path(result["facts_dir"])
    smoke = next(p for p in json.loads((folder / "probes.json").read_text())["probes"]
                 if p["filename"] == "gpu-smoke.txt")
    assert smoke_image in smoke["command"]
    assert docker_api.containers(all=True, filters={"label": GPU_SMOKE_LABEL}) == []


# -- over SSH ------------------------------------------------------------------------------------------
def test_ssh_probe_timeout_keeps_the_connection(ssh_conn):
    from fleetbench.hosts.ssh import SSHRunner

    runner = SSHRunner(ssh_conn(host_key=server_host_key()))
    try:
        start = time.monotonic()
        assert runner.run(("sh", "-c", "sleep 60"), 1) == (None, b"", b"SSH command timed out after 1 s")
        assert time.monotonic() - start < 30  # it gave up on the command, not waited for it (not a speed bound)
        assert runner.run(("uname", "-r"), 5) == (0, f"{os.uname().release}\n".encode(), b"")
    finally:
        runner.close()


def test_ssh_gives_the_same_facts_as_local(ssh_conn, tmp_path):
    conn_id = ssh_conn(host_key=server_host_key())
    gather(LocalRunner(), tmp_path / "local", gpu_smoke_image=GPU_SMOKE_IMAGE)
    seconds = ssh_gather(conn_id, tmp_path / "ssh", gpu_smoke_image=GPU_SMOKE_IMAGE)
    local, remote = facts_from_dir(tmp_path / "local"), facts_from_dir(tmp_path / "ssh")
    assert remote.public() == local.public()
    assert remote.kernel == os.uname().release and remote.docker_version
    assert (remote.driver_state, remote.gpu_smoke) == (local.driver_state, local.gpu_smoke) == ("not_installed", "fail")
    assert remote.runner == "ssh:fleet_ssh" and remote.unreachable is None
    assert (sorted(p.name for p in (tmp_path / "ssh").iterdir())
            == sorted(p.name for p in (tmp_path / "local").iterdir()))
    # the remote shell said it
    assert "nvidia-smi: command not found" in (tmp_path / "ssh" / "nvidia-smi.txt").read_text()
    checks = evaluate(remote, HostNeeds(gpus=0))
    assert verdict(checks) == "ready" and checks[0].detail == "probes ran (ssh:fleet_ssh)"
    assert seconds < 30


def test_a_connection_in_the_airflow_database_is_found(airflow_db, sshd, monkeypatch, tmp_path):
    """README's first GPU host: `airflow connections add`, then `fleetbench host-check --ssh ID`. Outside a task the
    SDK read only AIRFLOW_CONN_* variables: the host was 'unfit: connection ... isn't defined', exit 0."""
    import uuid

    from ssh_hosts import ssh_connection

    monkeypatch.setenv("HOME", str(tmp_path))
    conn_id = f"fleet_db_{uuid.uuid4().hex[:8]}"
    conn = ssh_connection()
    add = subprocess.run([str(VENV_BIN / "airflow"), "connections", "add", conn_id, "--conn-type", "ssh",
                          "--conn-host", conn["host"], "--conn-port", str(conn["port"]), "--conn-login",
                          conn["login"], "--conn-extra", json.dumps(conn["extra"])],
                         capture_output=True, text=True, env=os.environ.copy(), timeout=120)
    assert add.returncode == 0, add.stderr[-2000:]
    try:
        proc = fleetbench("host-check", "--ssh", conn_id, "--format", "table")
        assert proc.returncode == 0, proc.stderr
        assert f"probes ran (ssh:{conn_id})" in proc.stdout and "isn't defined" not in proc.stdout
    finally:
        subprocess.run([str(VENV_BIN / "airflow"), "connections", "delete", conn_id], capture_output=True,
                       env=os.environ.copy(), timeout=120)


def test_ssh_host_key_from_known_hosts_file(ssh_conn, tmp_path):
    conn_id = ssh_conn()
    ssh_dir = Path(os.environ["HOME"]) / ".ssh"
    ssh_dir.mkdir()
    (ssh_dir / "known_hosts").write_text((SSHD_DIR / "known_hosts").read_text())
    ssh_gather(conn_id, tmp_path)
    assert facts_from_dir(tmp_path).kernel == os.uname().release


def test_unknown_host_key_is_refused(ssh_conn, tmp_path):
    conn_id = ssh_conn()  # no host_key extra, no known_hosts file
    ssh_gather(conn_id, tmp_path / "facts")
    facts = facts_from_dir(tmp_path / "facts")
    assert facts.unreachable.startswith("host key for 127.0.0.1:2222 is unknown")
    assert "refusing to connect" in facts.unreachable
    assert sorted(p.name for p in (tmp_path / "facts").iterdir()) == ["probes.json"]  # nothing ran


@pytest.mark.parametrize("where", ["host_key extra", "known_hosts file"])
def test_changed_host_key_is_refused(ssh_conn, tmp_path, where):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    wrong = " ".join(other.with_suffix(".pub").read_text().split()[:2])
    if where == "host_key extra":
        conn_id = ssh_conn(host_key=wrong)
    else:
        conn_id = ssh_conn()
        (Path(os.environ["HOME"]) / ".ssh").mkdir()
        (Path(os.environ["HOME"]) / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{SSHD_PORT} {wrong}\n")
    ssh_gather(conn_id, tmp_path / "facts")
    facts = facts_from_dir(tmp_path / "facts")
    assert facts.unreachable.startswith("host key for 127.0.0.1:2222 does not match known_hosts")
    assert "refusing to connect" in facts.unreachable
    result = evaluate(facts, HostNeeds())
    assert [(c.name, c.status) for c in result] == [("reachable", "fail")]


def test_host_key_check_is_skipped_only_when_the_connection_says_so(ssh_conn, tmp_path):
    conn_id = ssh_conn(no_host_key_check=True)
    ssh_gather(conn_id, tmp_path)
    assert facts_from_dir(tmp_path).unreachable is None


def test_closed_port_is_unfit_unreachable_within_seconds(ssh_conn, tmp_path):
    conn_id = ssh_conn(conn_id="fleet_closed", port=free_port(), host_key=server_host_key())
    seconds = ssh_gather(conn_id, tmp_path)
    assert seconds < 5  # refused at once; a silent host would hit the 5 s connect timeout
    facts = facts_from_dir(tmp_path)
    assert facts.unreachable.startswith("unreachable: 127.0.0.1:") and facts.unreachable.endswith("connection refused")
    proc = fleetbench("host-check", "--ssh", conn_id, "--gpus", "1")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # stdout is the JSON only, even with the SSH provider logging
    assert result["verdict"] == "unfit"
    assert [(c["name"], c["status"]) for c in result["checks"]] == [("reachable", "fail")]
    assert "connection refused" in result["checks"][0]["detail"]


def test_a_host_that_never_answers_is_cut_off_by_the_connect_timeout(ssh_conn, tmp_path):
    """A TCP listener that accepts but never speaks SSH (a hung sshd, a half-dead host): bounded, not stuck."""
    import airflow.providers.ssh.hooks.ssh  # noqa: F401  (imported before the clock starts)

    from fleetbench.hosts.ssh import SSHRunner

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        conn_id = ssh_conn(conn_id="fleet_silent", port=port, host_key=server_host_key())
        start = time.monotonic()
        gather(SSHRunner(conn_id, connect_timeout_s=1), tmp_path)
        assert time.monotonic() - start < 4
    reason = facts_from_dir(tmp_path).unreachable
    assert reason == f"unreachable: 127.0.0.1:{port}: no SSH answer within 1 s"


def test_an_undefined_connection_is_unfit_not_a_crash(tmp_path):
    ssh_gather("no_such_connection", tmp_path)
    assert "no_such_connection" in facts_from_dir(tmp_path).unreachable


# -- the CLI contract ------------------------------------------------------------------------------------
def test_cli_facts_folder_contract():
    proc = fleetbench("host-check", "--facts", str(FIXTURES / "h100-590-cuda13.1"), "--image-cuda", "13.0",
                      "--gpus", "1")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert set(result) == {"verdict", "facts", "checks"} and set(result["facts"]) == CONTRACT_FACTS
    assert result["facts"]["gpus"] == [{"index": 0, "name": "NVIDIA H100 80GB HBM3",
                                        "uuid": "GPU-00000000-0000-0000-0000-000000000000", "memory_total_mib": 81559}]
    assert result["verdict"] == "degraded"


@pytest.mark.parametrize("args, message", [
    (["--facts", "/nonexistent/facts"], "not a folder"),
    (["--facts", "{empty}"], "no probe outputs"),
    (["--facts", "{fixture}", "--image-cuda", "12"], "--image-cuda must look like 12.1"),
    (["--facts", "{fixture}", "--gpus", "-1"], "--gpus must be >= 0"),
    (["--local", "--gpu-smoke-image", "--privileged"], "--gpu-smoke-image"),
    (["--local", "--gpu-smoke-image", "Bad Image"], "not an image reference"),
])
def test_cli_unusable_arguments_exit_2(tmp_path, args, message):
    args = [a.replace("{empty}", str(tmp_path)).replace("{fixture}", str(FIXTURES / "local-vm-nogpu")) for a in args]
    proc = fleetbench("host-check", *args)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_a_probe_container_that_outlives_its_timeout_is_removed_by_name(tmp_path, docker_api):
    """What the GPU smoke probe does when its `nvidia-smi` hangs, with a container that sleeps instead (there is no GPU
    here): killing the docker CLI at the timeout leaves the container to the engine, so the probe removes it by its
    name. Before, it ran on, holding the host's GPUs, and every night's check added one."""
    import uuid

    name = f"fleetbench-gpu-smoke-test{uuid.uuid4().hex[:8]}"
    hang = Probe("hang.txt", ("docker", "run", "--rm", "--name", name, "--network", "none", "--label",
                              GPU_SMOKE_LABEL, GPU_SMOKE_IMAGE, "sleep", "120"), timeout_s=3,
                 on_timeout=("docker", "rm", "-f", name))
    [result] = gather(LocalRunner(), tmp_path, probes=(hang,))
    assert result.exit_code is None and "timed out after 3 s" in result.error
    assert docker_api.containers(all=True, filters={"name": name}) == []
