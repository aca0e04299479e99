"""Airflow Connections -> what fleetbench's steps need: a Docker engine's TLS files and a registry's credentials.

The secrets live only in Airflow Connections; here they become a private temporary folder of PEM
files (removed when the block ends) or a Docker `auth_config` for one registry, never logged.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

TLS_FILES = {"ca_cert": "ca.pem", "client_cert": "cert.pem", "client_key": "key.pem"}  # DOCKER_CERT_PATH layout


@contextmanager
def docker_tls_files(conn_id: str | None) -> Iterator[dict | None]:
    """The CA, client certificate and key of the Airflow Connection `conn_id` as files, while the block runs.

    The connection's extra holds `ca_cert`, `client_cert` and `client_key`, each a PEM string or the
    path of a PEM file on the worker, and optionally `verify` (default true: the engine's certificate
    must be signed by `ca_cert` and name the host of `docker_url`). They are copied into a private
    temporary folder (0700, files 0600) named like Docker's DOCKER_CERT_PATH (ca.pem, cert.pem,
    key.pem), so docker-py and the docker CLI use the same files; the folder is removed afterwards.
    Yields None without a conn_id, else {"cert_path", "ca_cert", "client_cert", "client_key", "verify"}.
    A missing connection or field raises ValueError naming the connection and the field, never a value.
    """
    if not conn_id:
        yield None
        return
    from airflow.sdk import BaseHook

    extra = BaseHook.get_connection(conn_id).extra_dejson
    missing = [k for k in TLS_FILES if not extra.get(k)]
    if missing:
        raise ValueError(f"Airflow connection {conn_id!r} lacks {', '.join(missing)} in its extra "
                         f"(PEM text or a file path each) for a TLS Docker engine")
    folder = Path(tempfile.mkdtemp(prefix="fleetbench-tls-"))  # mkdtemp: mode 0700
    try:
        for key, name in TLS_FILES.items():
            value = str(extra[key])
            if "-----BEGIN" in value:
                if key == "client_key":
                    _mask(value)
                pem = value
            else:
                try:
                    pem = Path(value).read_text()
                except OSError as exc:
                    raise ValueError(f"Airflow connection {conn_id!r}: {key} file cannot be read: "
                                     f"{exc.strerror or exc}") from None
            path = folder / name
            path.touch(mode=0o600)
            path.write_text(pem if pem.endswith("\n") else pem + "\n")
        verify = str(extra.get("verify", True)).lower() not in ("false", "0", "no", "off")
        yield {"cert_path": str(folder), "verify": verify, **{k: str(folder / n) for k, n in TLS_FILES.items()}}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def registry_auth(conn_id: str | None, registry: str) -> dict | None:
    """A Docker `auth_config` from an Airflow Connection (login, password, host[:port]) for `registry` (a
    normalised host[:port], `fleetbench.registry`); never logged. None when the connection names another
    registry: credentials go only to the registry host and port of their connection, compared as Docker
    does, whatever reference a run pulls."""
    if not conn_id:
        return None
    from airflow.sdk import BaseHook

    from fleetbench.registry import credentials_apply

    conn = BaseHook.get_connection(conn_id)
    server = f"{conn.host}:{conn.port}" if conn.host and conn.port else conn.host
    if not credentials_apply(server, registry):
        log.warning("connection %s is for registry %s, not %s: its credentials are not sent there",
                    conn_id, server, registry)
        return None
    return {"username": conn.login, "password": conn.password, **({"serveraddress": server} if server else {})}


def _mask(secret: str) -> None:
    """Keep a secret out of task logs (best effort outside a task)."""
    try:
        from airflow.sdk.log import mask_secret

        mask_secret(secret)
    except Exception:  # noqa: BLE001 - masking must never break the step
        pass
