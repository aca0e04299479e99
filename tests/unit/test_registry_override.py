"""Registry credentials stay with their registry: reference normalisation as Docker does it, and what a
manual run's `image` parameter may replace (`images[].allow_override`)."""

from __future__ import annotations

import pytest

from fleetbench.config import ConfigError, parse_config
from fleetbench.params import apply_params
from fleetbench.registry import credentials_apply, registry_of, repository_of, server_host

CONFIGURED = "127.0.0.1:5001/fleet/tf:23.03"


@pytest.mark.parametrize("ref, registry, repository", [
    ("ubuntu", "docker.io", "docker.io/library/ubuntu"),
    ("ubuntu:22.04", "docker.io", "docker.io/library/ubuntu"),
    ("library/ubuntu@sha256:" + "a" * 64, "docker.io", "docker.io/library/ubuntu"),
    ("index.docker.io/library/ubuntu:1", "docker.io", "docker.io/library/ubuntu"),
    ("registry-1.docker.io/nvidia/cuda:12", "docker.io", "docker.io/nvidia/cuda"),
    ("nvidia/cuda:12.1.0-base", "docker.io", "docker.io/nvidia/cuda"),
    ("nvcr.io/nvidia/tensorflow:23.03-tf1-py3", "nvcr.io", "nvcr.io/nvidia/tensorflow"),
    ("127.0.0.1:5000/fleetbench/cpu-smoke:latest", "127.0.0.1:5000", "127.0.0.1:5000/fleetbench/cpu-smoke"),
    ("127.0.0.1:5998/evil/x:1", "127.0.0.1:5998", "127.0.0.1:5998/evil/x"),
    ("localhost/a/b", "localhost", "localhost/a/b"),
    ("Registry.Example:443/a/b:c@sha256:" + "b" * 64, "registry.example:443", "registry.example:443/a/b"),
])
def test_references_are_normalised_as_docker_does(ref, registry, repository):
    assert (registry_of(ref), repository_of(ref)) == (registry, repository)


@pytest.mark.parametrize("server, host", [
    ("127.0.0.1:5001", "127.0.0.1:5001"),
    ("https://Registry.Example:5000/v2/", "registry.example:5000"),
    ("http://127.0.0.1:5001", "127.0.0.1:5001"),
    ("https://index.docker.io/v1/", "docker.io"),
    ("registry.example", "registry.example"),
])
def test_connection_hosts_are_normalised(server, host):
    assert server_host(server) == host


def test_credentials_apply_only_to_their_registry_host_and_port():
    assert credentials_apply("127.0.0.1:5001", registry_of(CONFIGURED))
    assert credentials_apply("https://127.0.0.1:5001/", registry_of(CONFIGURED))
    assert not credentials_apply("127.0.0.1:5001", registry_of("127.0.0.1:5998/evil/x:1"))
    assert not credentials_apply("127.0.0.1:5001", registry_of("127.0.0.1/fleet/tf:1"))  # another port
    assert not credentials_apply("127.0.0.1:5001", registry_of("fleet/tf:1"))  # Docker Hub
    assert not credentials_apply("nvcr.io", registry_of("nvcr.io.evil.example/nvidia/tensorflow:1"))
    assert credentials_apply(None, registry_of("127.0.0.1:5998/evil/x:1"))  # no host: for the registry it is used with


def fleet(**image) -> dict:
    return {
        "hosts": [{"name": "gpu-01"}],
        "images": [{"name": "tf1", "ref": CONFIGURED, "command": ["python", "tf_cnn_benchmarks.py"],
                    "credentials_conn_id": "fleet_registry",
                    "bake": {"run": ["true"], "push_to": "127.0.0.1:5001", "push_conn_id": "fleet_push"}, **image}],
        "benchmarks": [{"name": "cnn", "image": "tf1", "models": ["resnet50"], "batch_sizes": [32]}],
    }


def test_default_policy_refuses_another_repository_naming_both():
    with pytest.raises(ConfigError) as err:
        apply_params(parse_config(fleet()), {"image": "127.0.0.1:5998/evil/x:1"})
    text = str(err.value)
    assert "images[0] (tf1" in text and "same_repository" in text
    assert "127.0.0.1:5998/evil/x" in text and "127.0.0.1:5001/fleet/tf" in text


def test_default_policy_refuses_the_same_path_on_another_registry():
    with pytest.raises(ConfigError, match="same_repository"):
        apply_params(parse_config(fleet()), {"image": "127.0.0.1:5998/fleet/tf:23.03"})


def test_same_repository_override_keeps_credentials_and_drops_the_bake():
    image = apply_params(parse_config(fleet()), {"image": "127.0.0.1:5001/fleet/tf:23.05"}).images[0]
    assert ((image.ref, image.credentials_conn_id, image.bake)
            == ("127.0.0.1:5001/fleet/tf:23.05", "fleet_registry", None))


def test_none_policy_refuses_every_override():
    with pytest.raises(ConfigError, match="allow_override is 'none'"):
        apply_params(parse_config(fleet(allow_override="none")), {"image": "127.0.0.1:5001/fleet/tf:23.05"})


def test_any_policy_pulls_another_registry_anonymously_and_never_bakes():
    image = apply_params(parse_config(fleet(allow_override="any")), {"image": "127.0.0.1:5998/evil/x:1"}).images[0]
    assert (image.ref, image.credentials_conn_id, image.bake) == ("127.0.0.1:5998/evil/x:1", None, None)


def test_without_an_override_nothing_changes():
    image = apply_params(parse_config(fleet()), {}).images[0]
    assert image.credentials_conn_id == "fleet_registry" and image.bake is not None


def test_allow_override_is_checked_in_config():
    with pytest.raises(ConfigError, match=r"images\[0\]\.allow_override: must be one of"):
        parse_config(fleet(allow_override="sometimes"))


def test_an_override_drops_the_configured_images_cuda_and_says_so(caplog):
    """`cuda` is the configured ref's CUDA: kept for another tag, the driver check judged the override by it (a newer
    release passed on an old driver, an older one was skipped as driver_too_old). Dropped, with a warning."""
    import logging

    config = parse_config(fleet(cuda="12.1"))
    with caplog.at_level(logging.WARNING, logger="fleetbench.params"):
        image = apply_params(config, {"image": "127.0.0.1:5001/fleet/tf:24.01"}).images[0]
    assert image.cuda is None
    assert "the CUDA version of 127.0.0.1:5001/fleet/tf:24.01 is not known (images[0].cuda 12.1" in caplog.text
    assert apply_params(config, {}).images[0].cuda == "12.1"

