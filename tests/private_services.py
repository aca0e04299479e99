"""Private instances of the shared services, for tests that stop, restart or starve them.

Each is a real process of the same software the suite shares (Debian's docker-registry, PostgreSQL,
dockerd), started on its own loopback port or socket with its own storage, so a fault produced on it
cannot touch the shared registry on 127.0.0.1:5000, the PostgreSQL on 5432 or the engine other tests
use. Every class is a context manager that stops its process (by its pid) and deletes its storage.

`ThrottledRelay` sits between a client and one of them: a slow link, so a transfer that takes a
fraction of a second over loopback lasts long enough for a fault to land in the middle of it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def _stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, wait_s: float = 30) -> None:
    """Stop one process this module started: `sig`, then SIGKILL if it is still there after `wait_s`."""
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


# -- a slow link --------------------------------------------------------------------------------
class ThrottledRelay:
    """`127.0.0.1:<port>` forwarding to `127.0.0.1:<upstream_port>`, the upstream's answers at `bytes_per_s`.

    `forwarded` counts the answer bytes passed on so far. `close()` drops the listener and every
    connection at once: with the upstream process killed too, the address answers nothing, as a
    registry host that went down looks to its clients (their next connect is refused).
    """

    CHUNK = 16384

    def __init__(self, upstream_port: int, bytes_per_s: float):
        self.upstream_port, self.bytes_per_s = upstream_port, bytes_per_s
        self.forwarded = 0
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            self._sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, throttled: bool) -> None:
        try:
            while data := src.recv(self.CHUNK):
                dst.sendall(data)
                if throttled:
                    self.forwarded += len(data)
                    time.sleep(len(data) / self.bytes_per_s)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def wait_forwarded(self, at_least: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.forwarded >= at_least:
                return True
            time.sleep(0.02)
        return False

    def close(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() in the other thread
        except OSError:
            pass
        self._listener.close()
        for s in self._sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


# -- docker-registry ----------------------------------------------------------------------------
class PrivateRegistry:
    """Debian's `docker-registry` on a free loopback port, its storage under `root` (deleted on exit)."""

    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "PrivateRegistry":
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "config.yml"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "version": 0.1, "log": {"level": "warn"},
            "storage": {"filesystem": {"rootdirectory": str(self.root / "storage")}, "delete": {"enabled": True}},
            "http": {"addr": self.address},
        }))
        with open(self.root / "registry.log", "wb") as log:
            self.proc = subprocess.Popen([shutil.which("docker-registry") or "docker-registry", "serve", str(config)],
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if requests.get(f"http://{self.address}/v2/", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.2)
        self.__exit__(None, None, None)
        raise RuntimeError(f"docker-registry did not answer on {self.address}: {_tail(self.root / 'registry.log')}")

    def kill(self) -> None:
        """The registry process dies at once (SIGKILL), as on a crash or a pulled plug."""
        if self.proc is not None:
            _stop(self.proc, signal.SIGKILL)

    def __exit__(self, *exc) -> None:
        self.kill()
        shutil.rmtree(self.root / "storage", ignore_errors=True)


# -- PostgreSQL ---------------------------------------------------------------------------------
def _pg_bin() -> Path:
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    if not versions:
        raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql (Debian package postgresql)")
    return versions[-1].parent


class PrivatePostgres:
    """A PostgreSQL cluster of its own (`initdb` in a temp folder, trust auth on 127.0.0.1, a free port),
    run as the `postgres` user when the tests run as root; `url` names its database `fleetbench`.
    `restart()` is `pg_ctl restart` (fast shutdown by default: open transactions are rolled back,
    their sessions ended)."""

    def __init__(self):
        self.bin = _pg_bin()
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="fb-pg-"))  # short, and outside root's private pytest folder
        self.data = self.dir / "data"
        self.url = f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/fleetbench"
        self._as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *args: str, timeout: float = 120) -> None:
        proc = subprocess.run([*self._as_owner, *args], capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stdout[-1500:]}"
                               f"{proc.stderr[-1500:]}\n{_tail(self.dir / 'postgres.log')}")

    def _pg_ctl(self, action: str, mode: str = "fast") -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "postgres.log"), "-m", mode,
                  "-w", "-t", "60", "-o", options, action)

    def __enter__(self) -> "PrivatePostgres":
        if self._as_owner:
            shutil.chown(self.dir, "postgres")
        try:
            self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                      "--no-sync")
            self._pg_ctl("start")
            self._psql("CREATE DATABASE fleetbench")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _psql(self, sql: str) -> None:
        self._run(str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", "postgres",
                  "-v", "ON_ERROR_STOP=1", "-qc", sql)

    def restart(self, mode: str = "fast") -> None:
        self._pg_ctl("restart", mode)

    def answers(self) -> bool:
        from sqlalchemy import create_engine, text

        engine = create_engine(self.url)
        try:
            with engine.connect() as conn:
                return conn.execute(text("select 1")).scalar() == 1
        except Exception:
            return False
        finally:
            engine.dispose()

    def __exit__(self, *exc) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._pg_ctl("stop", "immediate")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


# -- dockerd ------------------------------------------------------------------------------------
# What the shared engine runs with (no bridge network, nothing touching the host's iptables).
DOCKERD_FLAGS = ["--bridge=none", "--iptables=false", "--ip-forward=false", "--ip-masq=false"]


class PrivateDockerd:
    """A second Docker engine whose data root is a tmpfs of `size_mb` MB: a disk that really fills up.

    Its own unix socket, exec root (with its own managed containerd), pidfile and (empty) daemon.json
    under a temp folder; the shared engine's no-bridge flags; overlay2 on the tmpfs. On exit dockerd
    is stopped (SIGTERM, by pid), the tmpfs unmounted and the folder removed. Needs root (mount, dockerd).
    """

    def __init__(self, size_mb: int = 150, storage_driver: str = "overlay2"):
        self.size_mb, self.storage_driver = size_mb, storage_driver
        self.dir = Path(tempfile.mkdtemp(prefix="fb-dockerd-"))  # a unix socket path must stay under 108 bytes
        self.data_root = self.dir / "data"
        self.socket = self.dir / "docker.sock"
        self.url = f"unix://{self.socket}"
        self.log = self.dir / "dockerd.log"
        self.proc: subprocess.Popen | None = None
        self.mounted = False
        self.api = None

    def __enter__(self) -> "PrivateDockerd":
        import docker

        try:
            self.data_root.mkdir()
            (self.dir / "exec").mkdir()
            (self.dir / "daemon.json").write_text("{}")
            self._check(["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "fb-test-tmpfs", str(self.data_root)])
            self.mounted = True
            with open(self.log, "wb") as log:
                self.proc = subprocess.Popen(
                    ["dockerd", *DOCKERD_FLAGS, "--config-file", str(self.dir / "daemon.json"),
                     "--data-root", str(self.data_root), "--exec-root", str(self.dir / "exec"),
                     "--pidfile", str(self.dir / "docker.pid"), "--host", self.url,
                     "--storage-driver", self.storage_driver, "--log-level", "warn"],
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and self.proc.poll() is None:
                if self.socket.exists():
                    try:
                        api = docker.APIClient(base_url=self.url, version="auto", timeout=60)
                        api.ping()
                        self.api = api
                        return self
                    except Exception:
                        pass
                time.sleep(0.3)
            raise RuntimeError(f"the second dockerd did not answer on {self.url} (exit {self.proc.poll()}): "
                               f"{_tail(self.log)}")
        except BaseException:
            self.__exit__(None, None, None)
            raise

    @staticmethod
    def _check(argv: list[str]) -> None:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")

    def __exit__(self, *exc) -> None:
        if self.api is not None:
            self.api.close()
        if self.proc is not None:
            _stop(self.proc, signal.SIGTERM, wait_s=30)
        if self.mounted:
            for attempt in range(10):  # busy for a moment while dockerd's containerd exits
                if subprocess.run(["umount", str(self.data_root)], capture_output=True).returncode == 0:
                    self.mounted = False
                    break
                time.sleep(0.5)
            else:
                subprocess.run(["umount", "-l", str(self.data_root)], capture_output=True)
                self.mounted = False
        shutil.rmtree(self.dir, ignore_errors=True)

    def still_mounted(self) -> bool:
        return str(self.data_root) in Path("/proc/mounts").read_text()
