"""A distributed Airflow deployment for tests, as local processes: the CeleryExecutor on a fresh
PostgreSQL metadata database and a private Redis broker, api-server + scheduler + dag-processor
(from `airflow_cluster.LocalAirflow`) and Celery workers on named queues, all from this venv.

It is docker-compose.yaml without containers (no image can be pulled here): the same settings
(executor, broker, shared JWT secret and Fernet key, execution API URL), the same commands.

Also here: a Docker engine "remote over TLS" for fleet topology (a): a mutual-TLS proxy in front of
the local engine's socket (`DockerTLSProxy`), with a CA, server and client certificates made by
`make_tls_material`. Clients must present a certificate signed by the CA; the proxy records the
subject of every client it let in.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

from airflow_cluster import AIRFLOW, RestAirflow, free_port, stop_processes

TESTS = Path(__file__).resolve().parent


def worker_hostname() -> str:
    """`[core] hostname_callable` of the test's Celery workers: the worker's name, recorded as each task
    instance's `hostname`. (Two workers on one machine share its hostname; on a fleet each GPU host's
    worker reports its own machine's name with the default callable.)"""
    return os.environ.get("FLEETBENCH_WORKER_NAME") or socket.getfqdn()


# -- Redis ------------------------------------------------------------------------------------
class RedisServer:
    """A private redis-server on a free loopback port (the binary from scripts/ensure-redis.sh)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def __enter__(self) -> "RedisServer":
        binary = shutil.which("redis-server")
        if not binary:
            raise RuntimeError("redis-server not found: run `bash scripts/ensure-redis.sh` "
                               "(Debian: apt-get install redis-server)")
        self.folder.mkdir(parents=True, exist_ok=True)
        log = open(self.folder / "redis.log", "w")
        self.proc = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                                      "--appendonly", "no", "--dir", str(self.folder)],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 15
        while not self.ping():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"redis-server did not answer on {self.port}: "
                                   f"{(self.folder / 'redis.log').read_text()[-2000:]}")
            time.sleep(0.2)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


# -- Airflow with the CeleryExecutor ----------------------------------------------------------
class CeleryAirflow(RestAirflow):
    """RestAirflow with the CeleryExecutor and one Celery worker per entry of `workers` ({name: queues}).

    Every process shares one JWT secret and one Fernet key (RestAirflow makes them) and the broker. Each
    worker runs with `--concurrency 1 --celery-hostname <name>@%h` and records `<name>` as the hostname
    of the task instances it runs (`worker_hostname`); its log is `<home>/worker-<name>.log`.
    """

    def __init__(self, home: Path, pg_url: str, broker_url: str, workers: dict[str, list[str]],
                 env: dict[str, str] | None = None, parallelism: int = 8):
        self.workers = workers
        celery_env = {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CELERY__BROKER_URL": broker_url,
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "1",
            "AIRFLOW__OPERATORS__DEFAULT_QUEUE": "default",
            **(env or {}),
        }
        super().__init__(home, pg_url, env=celery_env, parallelism=parallelism)
        # The result backend: the metadata database (Celery's SQLAlchemy backend), as in the official compose file.
        self.env.setdefault("AIRFLOW__CELERY__RESULT_BACKEND", "db+" + self.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
        self.worker_procs: dict[str, subprocess.Popen] = {}

    def __enter__(self) -> "CeleryAirflow":
        super().__enter__()
        try:
            for name, queues in self.workers.items():
                self.start_worker(name, queues)
            self.wait_for_workers()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def start_worker(self, name: str, queues: list[str]) -> None:
        env = {**self.env, "FLEETBENCH_WORKER_NAME": name,
               "AIRFLOW__CORE__HOSTNAME_CALLABLE": "celery_cluster.worker_hostname",
               "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)}
        log = open(self.home / f"worker-{name}.log", "w")
        proc = subprocess.Popen([AIRFLOW, "celery", "worker", "--queues", ",".join(queues), "--concurrency", "1",
                                 "--celery-hostname", f"{name}@%h", "--skip-serve-logs", "--without-mingle",
                                 "--without-gossip"],
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        self.worker_procs[name] = proc

    def wait_for_workers(self, timeout: float = 120) -> None:
        """Until every worker logged that it is ready (connected to the broker, consuming its queues)."""
        deadline = time.monotonic() + timeout
        pending = set(self.worker_procs)
        while pending and time.monotonic() < deadline:
            for name in list(pending):
                if self.worker_procs[name].poll() is not None:
                    raise RuntimeError(f"Celery worker {name} exited early:\n{self.logs()}")
                if " ready." in (self.home / f"worker-{name}.log").read_text(errors="replace"):
                    pending.discard(name)
            time.sleep(1)
        if pending:
            raise TimeoutError(f"Celery workers {sorted(pending)} not ready in {timeout} s:\n{self.logs()}")

    def __exit__(self, *exc) -> None:
        # Workers first (a warm shutdown: SIGTERM lets a running task finish or fail cleanly), then the rest.
        stop_processes(list(self.worker_procs.values()), grace_s=60)
        super().__exit__(*exc)


# -- a Docker engine behind mutual TLS (fleet topology a) -------------------------------------
def make_tls_material(folder: Path, client_cn: str = "fleetbench-central-worker") -> dict[str, Path]:
    """A CA; a server certificate for 127.0.0.1/localhost; a client certificate (clientAuth) signed by
    the CA; and a second client certificate from another CA (`rogue_*`), which the engine must refuse."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def cert(subject: str, key, issuer: str, issuer_key, ca: bool = False, server: bool = False):
        b = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name(issuer))
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if ca:
            b = b.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                              content_commitment=False, key_encipherment=False, data_encipherment=False,
                                              key_agreement=False, encipher_only=False, decipher_only=False),
                                critical=True)
        elif server:
            b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                             x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                critical=False)
            b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        else:
            b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    def write(stem: str, certificate, key) -> None:
        (folder / f"{stem}.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        key_path = folder / f"{stem}-key.pem"
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        key_path.chmod(0o600)

    ca_key, rogue_ca_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    write("ca", cert("fleetbench test CA", ca_key, "fleetbench test CA", ca_key, ca=True), ca_key)
    server_key, client_key, rogue_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    write("server", cert("127.0.0.1", server_key, "fleetbench test CA", ca_key, server=True), server_key)
    write("client", cert(client_cn, client_key, "fleetbench test CA", ca_key), client_key)
    write("rogue", cert(client_cn, rogue_key, "another CA", rogue_ca_key), rogue_key)
    return {"ca_cert": folder / "ca.pem", "server_cert": folder / "server.pem", "server_key": folder / "server-key.pem",
            "client_cert": folder / "client.pem", "client_key": folder / "client-key.pem",
            "rogue_cert": folder / "rogue.pem", "rogue_key": folder / "rogue-key.pem"}


class DockerTLSProxy:
    """`tcp://127.0.0.1:<port>` with mutual TLS in front of the local engine's unix socket, as `dockerd
    --tlsverify --tlscacert ca.pem --tlscert server.pem --tlskey server-key.pem -H tcp://0.0.0.0:2376`
    would be. asyncio in a thread of the test process; TLS needs a client certificate from the CA."""

    def __init__(self, certs: dict[str, Path], upstream: str = "/var/run/docker.sock"):
        self.upstream = upstream
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(certs["ca_cert"]))
        self.context.verify_mode = ssl.CERT_REQUIRED
        self.context.load_cert_chain(str(certs["server_cert"]), str(certs["server_key"]))
        self.clients: list[str] = []  # common names of the clients let in, one per connection
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.context,
                                                                    ssl_handshake_timeout=10))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            pending = asyncio.all_tasks(self._loop)  # connections clients kept open
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.run_until_complete(server.wait_closed())
            self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        subject = dict(x[0] for x in (writer.get_extra_info("peercert") or {}).get("subject", ()))
        self.clients.append(subject.get("commonName", "?"))
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self.upstream)
        except OSError:
            writer.close()
            return

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, half_close: bool) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, ssl.SSLError, OSError):
                pass
            finally:
                try:
                    if half_close and dst.can_write_eof():
                        dst.write_eof()  # the client finished sending: tell the engine, keep reading its answer
                    else:
                        dst.close()
                except OSError:  # the other side is gone already
                    pass

        try:
            await asyncio.gather(pump(reader, up_writer, True), pump(up_reader, writer, False))
        except asyncio.CancelledError:  # the proxy is shutting down with the connection still open
            writer.close()
        finally:
            up_writer.close()

    def __enter__(self) -> "DockerTLSProxy":
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the TLS proxy did not start")
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def tls_connection_json(certs: dict[str, Path], client: str = "client", inline: bool = True) -> str:
    """An Airflow Connection (JSON) for `docker_tls_conn_id`: the PEMs inline in its extra, or their paths."""
    def value(path: Path) -> str:
        return path.read_text() if inline else str(path)

    return json.dumps({"conn_type": "docker", "description": "fleetbench: TLS client for a remote Docker engine",
                       "extra": {"ca_cert": value(certs["ca_cert"]), "client_cert": value(certs[f"{client}_cert"]),
                                 "client_key": value(certs[f"{client}_key"])}})


__all__ = ["CeleryAirflow", "DockerTLSProxy", "RedisServer", "make_tls_material", "tls_connection_json",
           "worker_hostname"]
