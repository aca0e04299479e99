"""A container's peak memory on the real engine: from its cgroup (an engine on this machine) and from the
engine's stats stream (what a remote engine gives), for the same allocation."""

from __future__ import annotations

import pytest

from fleetbench.telemetry.container_memory import PeakMemory

pytestmark = pytest.mark.integration

# Holds ~80 MiB for 3 s (the stats stream samples once a second), then exits.
ALLOCATE = ["python3", "-c", "import time; b = bytearray(80 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); "
            "time.sleep(3)"]


@pytest.mark.parametrize("local, sources", [(True, {"cgroup_v1", "cgroup_v2"}), (False, {"engine_stats"})])
def test_peak_memory_of_a_real_container(docker_api, smoke_image, local, sources):
    cid = docker_api.create_container(smoke_image, command=ALLOCATE, host_config=docker_api.create_host_config(
        network_mode="none", mem_limit="256m"), labels={"org.fleetbench.test": "container_memory"})["Id"]
    try:
        docker_api.start(cid)
        sampler = PeakMemory(docker_api, cid, local=local).start()
        assert docker_api.wait(cid, timeout=60)["StatusCode"] == 0
        peak, source = sampler.stop()
    finally:
        docker_api.remove_container(cid, force=True)
    assert source in sources
    assert 80 <= peak < 256, peak  # the allocation, plus an interpreter, under the limit
