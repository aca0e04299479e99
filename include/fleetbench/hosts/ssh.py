"""Run probe commands on a remote host over SSH, through an Airflow SSH connection (one per host).

Host keys are always checked: the connection's `host_key` extra, else the worker user's
`~/.ssh/known_hosts`. An unknown key is refused (paramiko's RejectPolicy, the SSHHook default)
unless the connection itself says otherwise (`no_host_key_check` or `allow_host_key_change`).
Connecting is bounded (a few seconds, one attempt): an unreachable host is found out fast and
becomes `HostUnreachable` with a reason a person can act on, never a traceback.
"""

from __future__ import annotations

import errno
import shlex
import socket

from fleetbench.hosts.probes import HostUnreachable

CONNECT_TIMEOUT_S = 5


class SSHRunner:
    """CommandRunner over `airflow.providers.ssh.hooks.ssh.SSHHook`; connects on first use, once."""

    def __init__(self, conn_id: str, connect_timeout_s: int = CONNECT_TIMEOUT_S):
        self.conn_id = conn_id
        self.name = f"ssh:{conn_id}"
        self.connect_timeout_s = connect_timeout_s
        self._hook = None
        self._client = None

    def run(self, argv: tuple[str, ...], timeout_s: float) -> tuple[int | None, bytes, bytes]:
        import paramiko
        from airflow.providers.common.compat.sdk import AirflowException  # what the hook raises on a timeout

        client = self._connect()
        try:
            return self._hook.exec_ssh_client_command(client, shlex.join(argv), get_pty=False, environment=None,
                                                      timeout=timeout_s)
        except AirflowException as exc:  # "SSH command timed out": this probe is unknown, the host is still there
            return None, b"", f"{exc} after {timeout_s:g} s".encode()
        except (OSError, EOFError, paramiko.SSHException) as exc:  # the connection dropped under us
            self.close()
            raise HostUnreachable(f"unreachable: {self._address()}: connection lost "
                                  f"({exc or type(exc).__name__})") from exc

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _connect(self):
        if self._client is not None:
            return self._client
        import paramiko

        self._hook = self._make_hook()
        try:
            self._client = self._hook.get_conn()
        except paramiko.BadHostKeyException as exc:
            raise HostUnreachable(
                f"host key for {self._address()} does not match known_hosts: the server offered "
                f"{_fingerprint(exc.key)}, expected {_fingerprint(exc.expected_key)}; refusing to connect "
                f"(connection {self.conn_id!r})") from None
        except paramiko.AuthenticationException as exc:
            raise HostUnreachable(f"unreachable: {self._address()}: SSH login as {self._hook.username!r} "
                                  f"refused ({exc})") from None
        except paramiko.SSHException as exc:
            if "not found in known_hosts" in str(exc):
                raise HostUnreachable(
                    f"host key for {self._address()} is unknown: not in known_hosts and connection "
                    f"{self.conn_id!r} has no host_key extra; refusing to connect (add the key, or set "
                    "allow_host_key_change explicitly)") from None
            if "banner" in str(exc) or "No existing session" in str(exc):  # TCP connected, SSH never answered
                raise HostUnreachable(f"unreachable: {self._address()}: no SSH answer within "
                                      f"{self.connect_timeout_s} s") from None
            raise HostUnreachable(f"unreachable: {self._address()}: {exc}") from None
        except (OSError, EOFError) as exc:  # refused, no route, timed out (NoValidConnectionsError is an OSError)
            raise HostUnreachable(f"unreachable: {self._address()}: {_socket_reason(exc)}") from None
        return self._client

    def _make_hook(self):
        from airflow.providers.ssh.hooks.ssh import SSHHook

        try:
            hook = SSHHook(ssh_conn_id=self.conn_id, conn_retry_attempts=1, banner_timeout=self.connect_timeout_s,
                           auth_timeout=self.connect_timeout_s, keepalive_interval=0)
        except Exception as exc:  # unknown connection id, unusable extras (bad host_key, key_file and private_key)
            raise HostUnreachable(f"unreachable: connection {self.conn_id!r} is unusable: {exc}") from None
        if hook.conn_timeout is None:  # the connection's own conn_timeout extra wins
            hook.conn_timeout = self.connect_timeout_s
        return hook

    def _address(self) -> str:
        if self._hook is None:
            return self.conn_id
        return f"{self._hook.remote_host}:{self._hook.port}"


def _socket_reason(exc: BaseException) -> str:
    """"connection refused" rather than paramiko's "[Errno None] Unable to connect to port 1 on 127.0.0.1"."""
    causes = list(getattr(exc, "errors", {}).values()) or [exc]  # NoValidConnectionsError: one error per address
    for cause in causes:
        if isinstance(cause, ConnectionRefusedError) or getattr(cause, "errno", None) == errno.ECONNREFUSED:
            return "connection refused"
        if isinstance(cause, (socket.timeout, TimeoutError)):
            return "connection timed out"
    return str(causes[0]) or type(causes[0]).__name__


def _fingerprint(key) -> str:
    return f"{key.get_name()} {key.fingerprint}" if key is not None else "(none)"
