"""What is judged by time on an engine is judged on the engine's own clock, which can be hours off the worker's:
maintenance's age of a case container (a GPU host whose clock is behind the maintenance worker's made a live case
look past its timeout, and maintenance stopped and removed it), a superseded bake's stamp, a case's OOM event."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from fleetbench import cleanup
from fleetbench.engines import engine_now

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
    assert abs(engine_now(Engine(0, 0, system_time=False)) - time.time()) < 5  # no SystemTime: this clock


class BakeEngine:
    """An engine with one `current` bake, its clock `skew_s` off this machine's: what make_current tags."""

    def __init__(self, skew_s: float):
        self.now, self.tags = time.time() + skew_s, []

    def info(self):
        return {"SystemTime": datetime.fromtimestamp(self.now, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}

    def inspect_image(self, ref):
        return {"Id": "sha256:" + "a" * 64, "RepoTags": ["fleetbench/cnn:current", "fleetbench/cnn:23.03-aaaaaaaaaaaa"]}

    def tag(self, image, repo, tag, force=False):
        self.tags.append(f"{repo}:{tag}")

    def remove_image(self, ref):
        pass


@pytest.mark.parametrize("skew_s", [-3 * 3600, 3 * 3600])
def test_a_superseded_bake_is_stamped_on_the_engines_clock(skew_s):
    """cleanup ages a superseded bake from its stamp on the engine's clock: the stamp was the baking worker's clock,
    so an engine 3 h ahead of it saw a bake superseded a minute ago as 3 h old and removed it under a running night."""
    from fleetbench.bake import make_current

    engine = BakeEngine(skew_s)
    make_current(engine, "fleetbench/cnn", "sha256:" + "b" * 64)
    [stamp, current] = engine.tags
    assert current == "fleetbench/cnn:current" and stamp.startswith("fleetbench/cnn:superseded-")
    stamped = int(stamp.removeprefix("fleetbench/cnn:superseded-").split("-")[0])
    assert abs(stamped - engine.now) < 5


class OomEngine:
    """An engine whose clock is `skew_s` off this one's, with a container OOM-killed a minute ago by its clock; it
    filters its events by its own clock, as Docker does."""

    def __init__(self, skew_s: float):
        self.now = time.time() + skew_s
        self.oom_at = self.now - 60
        self.queries = []

    def events(self, since, until, decode, filters):
        self.queries.append((since, until))
        return _Events([{"status": "oom", "Action": "oom"}] if since <= self.oom_at <= until else [])


class _Events(list):
    def close(self):
        pass


def _stamp_of(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"


@pytest.mark.parametrize("skew_s", [-3 * 3600, 0, 3 * 3600])
def test_an_oom_event_is_found_whatever_the_workers_clock_says(skew_s):
    """A case killed at its memory limit can read OOMKilled false (Docker 20.10): its `oom` event names it. The
    events were asked for from the worker's clock: on an engine hours off, none was found (or the query waited
    until the worker's `until` came on the engine's clock). The window is the container's own start and end now."""
    from fleetbench.airflow.operators import BenchmarkCaseOperator

    engine = OomEngine(skew_s)
    op = BenchmarkCaseOperator(task_id="run_case", image="x", case={"host": "h", "case_key": "k"})
    op.__dict__["cli"] = engine  # the cached client
    state = {"StartedAt": _stamp_of(engine.now - 90), "FinishedAt": _stamp_of(engine.now - 59), "ExitCode": 137}
    assert op._oom_event("c" * 64, state) is True
    [(since, until)] = engine.queries
    assert since <= engine.now - 90 and engine.now - 59 <= until < engine.now  # nothing to wait for
