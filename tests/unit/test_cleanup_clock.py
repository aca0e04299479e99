"""Maintenance judges a case container's age on the engine's own clock: a GPU host whose clock is behind the
maintenance worker's made a live case look past its timeout, and maintenance stopped and removed it."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from fleetbench import cleanup

LABELS = {"org.fleetbench.managed": "true", "org.fleetbench.run_id": "scheduled__x",
          "org.fleetbench.dag_id": "fleet_benchmark", "org.fleetbench.host": "gpu-01",
          "org.fleetbench.case_key": "cnn.resnet50.bs64.g8.replicated", "org.fleetbench.timeout_s": "600"}


class Engine:
    """One running case container, started `ran_s` ago by the engine's clock, which is `skew_s` off this one's."""

    def __init__(self, skew_s: float, ran_s: float, system_time: bool = True):
        self.now = time.time() + skew_s
        self.started = datetime.fromtimestamp(self.now - ran_s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        self.system_time, self.calls = system_time, []

    def info(self):
        stamp = datetime.fromtimestamp(self.now, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"
        return {"SystemTime": stamp} if self.system_time else {}

    def containers(self, all=False):
        return [{"Id": "c" * 64, "Names": ["/fb-live"], "State": "running", "Labels": LABELS, "ImageID": "sha256:i",
                 "Created": int(self.now - 61)}]

    def inspect_image(self, image):
        return {"Config": {"Labels": {}}}

    def inspect_container(self, cid):
        return {"State": {"Running": True, "StartedAt": self.started, "FinishedAt": "0001-01-01T00:00:00Z"}}

    def images(self, filters=None):
        return []

    def volumes(self, filters=None):
        return {"Volumes": []}

    def stop(self, cid, timeout=None):
        self.calls.append("stop")

    def remove_container(self, cid, v=False, force=False):
        self.calls.append("remove")


@pytest.mark.parametrize("skew_s", [-900, 0, 900])
def test_a_live_case_is_not_overdue_whatever_the_engines_clock_says(skew_s):
    engine = Engine(skew_s, ran_s=60)
    report = cleanup.clean_engine(engine)
    assert report.removed_containers == [] and engine.calls == []


def test_a_case_past_its_timeout_on_the_engines_clock_is_removed():
    engine = Engine(-900, ran_s=1000)  # 600 s + the 300 s grace passed on the engine's clock
    report = cleanup.clean_engine(engine)
    assert [c["name"] for c in report.removed_containers] == ["fb-live"] and "remove" in engine.calls
    assert abs(cleanup._engine_now(Engine(0, 0, system_time=False)) - time.time()) < 5  # no SystemTime: this clock
