"""Image references and registry hosts, normalised the way Docker does, so credentials go only where they belong.

Docker sends a registry's credentials to the host named by the image reference it pulls; docker-py's
`auth_config` is handed to whatever registry the reference names. So before credentials leave this
process, the reference's registry must be the registry the credentials are for:

- `registry_of("ubuntu:22.04")` and `registry_of("index.docker.io/library/ubuntu")` are both `docker.io`
  (Docker Hub's aliases); `registry_of("127.0.0.1:5000/a/b:1")` is `127.0.0.1:5000`. A first path
  component is a registry when it holds a `.` or a `:` or is `localhost` (distribution/reference's rule).
- `server_host("https://Registry.example:5000/v2/")` is `registry.example:5000` (scheme and path dropped,
  host lower-cased, as Docker's `ConvertToHostname`); the port is part of the identity, as in Docker.
- `repository_of("ubuntu")` is `docker.io/library/ubuntu`: two references name the same repository
  exactly when their normalised repositories are equal.

Nothing here imports Airflow or Docker.
"""

from __future__ import annotations

DOCKER_HUB = "docker.io"
_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com"})


def _split(ref: str) -> tuple[str, str]:
    """(registry, path) of a reference without its tag or digest; registry not yet normalised."""
    name = ref.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.rsplit(":", 1)[0]
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first, rest
    return DOCKER_HUB, name


def _host(host: str) -> str:
    host = host.lower()
    return DOCKER_HUB if host in _HUB_ALIASES else host


def registry_of(ref: str) -> str:
    """The registry host[:port] a reference is pulled from (`docker.io` for Docker Hub)."""
    return _host(_split(ref)[0])


def repository_of(ref: str) -> str:
    """The fully qualified repository of a reference: `registry/path`, `library/` added for Docker Hub's
    official images."""
    registry, path = _split(ref)
    registry = _host(registry)
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    return f"{registry}/{path}"


def server_host(server: str) -> str:
    """A registry server as written in a connection or an auth config (`https://host:port/v1/`) -> `host:port`."""
    for scheme in ("https://", "http://"):
        if server.lower().startswith(scheme):
            server = server[len(scheme):]
            break
    return _host(server.split("/", 1)[0])


def credentials_apply(server: str | None, registry: str) -> bool:
    """Whether credentials for `server` (a connection's host[:port]) may be sent to `registry` (a normalised
    host[:port], e.g. `registry_of(ref)`): only when both name the same host and port. A connection without
    a host is taken to be for the registry it is used with."""
    return server is None or server_host(server) == registry
