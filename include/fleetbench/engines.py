"""Docker engines: one place that turns a host's `docker_url` (and TLS certificates) into a client.

Shaped like the docker provider's DockerHook: `engine_client(docker_url, tls_conn_id)` opens the
engine the way every step uses it (image preparation, the cases, maintenance, the CLI): the URL as
is, or over mutual TLS with the certificates of an Airflow Connection (`fleetbench.airflow.connections`
writes them to a private folder for as long as the client is open). Host probes do not use it: they
run the docker CLI on the host itself (locally, or over the host's SSH connection).
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

_SYSTEM_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.\d{1,9})?(Z|[+-]\d\d:\d\d)?$")


def engine_now(api) -> float:
    """The engine's clock (`docker info`'s SystemTime, RFC 3339 with nanoseconds), else this machine's: what
    stamps and ages the engine's objects (a superseded bake, a stopped container), whichever worker reads them."""
    import docker
    import requests

    try:
        found = _SYSTEM_TIME.match(str(api.info().get("SystemTime") or ""))
    except (docker.errors.DockerException, requests.RequestException):
        found = None
    if found is None:
        return time.time()
    zone = found.group(2) or "Z"
    return datetime.fromisoformat(found.group(1) + ("+00:00" if zone == "Z" else zone)).timestamp()


# The engine's refusal of a client's API version: "client version 1.45 is too new. Maximum supported API version is
# 1.41", or "... is too old. Minimum supported API version is 1.24, please upgrade your client ..."
_VERSION_REFUSED = re.compile(r"client version \S+ is too (new|old)", re.IGNORECASE)


_API_VERSION = re.compile(r"\d{1,3}\.\d{1,3}")


def api_version_of(api) -> str | None:
    """The API version a client settled on with its engine (`auto`: the engine's `ApiVersion`), for the clients of the
    same engine to use; None (they ask the engine themselves) unless it reads as one (MAJOR.MINOR): it becomes part of
    every request's path, and an XCom."""
    version = getattr(api, "api_version", None)
    return version if isinstance(version, str) and _API_VERSION.fullmatch(version) else None


def version_refused(exc) -> bool:
    """The engine refused the API version the client asked for (a 400 naming it), not the request itself."""
    return getattr(exc, "status_code", None) == 400 and bool(_VERSION_REFUSED.search(str(exc)))


def docker_tls_config(tls: dict | None):
    """docker-py's TLSConfig for the files of `docker_tls_files` (False without TLS: plain socket or tcp)."""
    if not tls:
        return False
    from docker.tls import TLSConfig

    return TLSConfig(client_cert=(tls["client_cert"], tls["client_key"]), ca_cert=tls["ca_cert"], verify=tls["verify"])


def docker_api_client(docker_url: str, tls: dict | None, timeout: int = 600, version: str | None = "auto"):
    """docker-py's APIClient for a host's engine: its URL as is, or over TLS with the files of `docker_tls_files`.

    Over TLS the client ignores REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE and proxy variables: requests lets
    them override the session's `verify`, so the engine's private CA would be replaced by the system
    bundle on workers that set them ("self-signed certificate in certificate chain").
    """
    import docker

    if not tls:
        return without_environment(docker.APIClient(base_url=docker_url, version=version or "auto", timeout=timeout))
    return _engine_tls_client()(base_url=docker_url, version=version or "auto", timeout=timeout,
                                tls=docker_tls_config(tls))


def without_environment(api):
    """A client whose transport is docker-py's own (`http+docker://` base URLs: a unix socket, a named pipe, ssh://)
    reads no proxy, CA bundle or netrc from the environment: none applies to those transports, and requests looked for
    them on every call, through the whole environment (~0.25 ms a call in an Airflow task's, a dozen calls a case).
    Other clients are left as they are (plain tcp:// honours the proxy variables, as before)."""
    if str(getattr(api, "base_url", "")).startswith("http+docker://"):
        api.trust_env = False
    return api


@functools.cache
def _engine_tls_client():
    import docker

    class EngineTLSClient(docker.APIClient):
        trust_env = property(lambda self: False, lambda self, value: None)  # requests.Session sets True in __init__

    return EngineTLSClient


@contextmanager
def engine_client(docker_url: str, tls_conn_id: str | None = None, timeout: int = 600) -> Iterator:
    """An APIClient for the engine at `docker_url` (over TLS with `tls_conn_id`'s certificates), closed afterwards.

    Raises ValueError for a missing or incomplete TLS connection, docker's DockerException when the
    engine does not answer."""
    from fleetbench.airflow.connections import docker_tls_files

    with docker_tls_files(tls_conn_id) as tls:
        api = docker_api_client(docker_url, tls, timeout=timeout)
        try:
            yield api
        finally:
            api.close()
