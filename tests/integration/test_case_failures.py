"""Every way a case can end, produced for real on the local Docker engine: the outcome is classified,
the log is kept, and no container is left behind."""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import pytest
from airflow.sdk.exceptions import AirflowException
from docker.errors import NotFound

from engine_proxy import EngineProxy
from fleetbench.airflow.operators import BenchmarkCaseOperator
from fleetbench.measure import measure

pytestmark = pytest.mark.integration

BASE = "fleetbench/base:bookworm"
HARNESS = ["python3", "/opt/fleetbench/tf_cnn_benchmarks.py", "--model=trivial", "--batch_size=8",
           "--num_batches=5", "--num_warmup_batches=1", "--device=cpu", "--num_gpus=1"]


@pytest.fixture()
def case_run(tmp_path, docker_api):
    """Run one case through BenchmarkCaseOperator; afterwards assert no labelled container is left."""
    token = uuid.uuid4().hex[:10]

    def build(command, image=BASE, **kwargs) -> BenchmarkCaseOperator:
        case_key = f"test.{kwargs.pop('case_key', 'case')}.{token}"
        return BenchmarkCaseOperator(
            task_id=f"run_{token}", image=image, command=command, container_name=f"fbtest-{token}-{case_key}",
            labels={"org.fleetbench.managed": "true", "org.fleetbench.test": token},
            case={"host": "localhost", "case_key": case_key}, log_dir=str(tmp_path), **kwargs)

    def run(command, image=BASE, **kwargs):
        op = build(command, image, **kwargs)
        outcome = op.execute({})
        fields, steps = measure({"command": command}, outcome)
        return outcome, fields

    run.build = build
    yield run
    left = docker_api.containers(all=True, filters={"label": f"org.fleetbench.test={token}"})
    assert left == [], f"containers left behind: {[c['Names'] for c in left]}"


def test_ok(case_run, smoke_image):
    outcome, fields = case_run(HARNESS, image=smoke_image)
    assert (fields["status"], fields["failure_class"], outcome["exit_code"]) == ("ok", None, 0)
    assert fields["images_per_sec"] > 0
    assert "total images/sec" in Path(outcome["log_path"]).read_text()
    assert outcome["started_at"] < outcome["finished_at"]
    saved = json.loads(Path(outcome["log_path"]).with_suffix(".outcome.json").read_text())
    assert saved == outcome


@pytest.mark.parametrize("pinned", ["the engine's", "9.99"])
def test_a_case_speaks_the_lanes_api_version_and_asks_the_engine_only_when_it_is_refused(case_run, smoke_image,
                                                                                          docker_api, monkeypatch,
                                                                                          pinned):
    """`api_version` (the engine's, from the lane's images step) spares each case the engine's `GET /version`; an
    engine that refuses it (downgraded since the lane's check: 9.99 here) gets a client that asks, and the case runs."""
    from docker.api.client import APIClient

    asked = []
    ask = APIClient._retrieve_server_version
    monkeypatch.setattr(APIClient, "_retrieve_server_version", lambda self: asked.append(self.base_url) or ask(self))
    version = docker_api.api_version if pinned == "the engine's" else pinned
    op = case_run.build(HARNESS, image=smoke_image, api_version=version, case_key="pinned")
    outcome = op.execute({})
    assert (outcome["exit_code"], outcome["start_error_class"], outcome.get("engine_unreachable")) == (0, None, None)
    assert "total images/sec" in Path(outcome["log_path"]).read_text()
    assert len(asked) == (0 if pinned == "the engine's" else 1)
    assert (op.cli.api_version, op.api_version) == (docker_api.api_version, None if asked else version)


def test_oom_killed_by_memory_limit(case_run):
    outcome, fields = case_run(["python3", "-c", "import numpy; a = numpy.ones(100_000_000); print(a.sum())"],
                               mem_limit="64m")
    assert outcome["oom_killed"] is True and outcome["exit_code"] == 137
    assert fields["failure_class"] == "oom_killed"


def test_oom_event_names_an_oom_kill_that_the_container_state_missed(case_run, docker_api):
    """Docker 20.10 sets State.OOMKilled from whichever notification comes last (seen here: a 256 MiB case
    OOM-killed with OOMKilled false, exit 137); the engine's event log keeps the `oom` either way."""
    op = case_run.build(["true"])
    ids = []
    try:
        for command, mem in ((["python3", "-c", "import numpy; a = numpy.ones(100_000_000); print(a.sum())"], "64m"),
                             (["sh", "-c", "sleep 30 & pid=$!; kill -KILL $pid; wait $pid"], None)):
            ids.append(docker_api.create_container(BASE, command=command, labels=op.labels,
                                                   host_config=docker_api.create_host_config(
                                                       network_mode="none", mem_limit=mem))["Id"])
            docker_api.start(ids[-1])
            assert docker_api.wait(ids[-1], timeout=60)["StatusCode"] == 137
        assert [op._oom_event(cid, docker_api.inspect_container(cid)["State"]) for cid in ids] == [True, False]
    finally:
        for cid in ids:
            docker_api.remove_container(cid, force=True)


def test_core_dump(case_run):
    outcome, fields = case_run(["sh", "-c", "python3 -c 'import os; os.abort()'"])
    assert outcome["exit_code"] == 134
    assert fields["failure_class"] == "core_dump"


def test_killed_without_oom(case_run):
    outcome, fields = case_run(["sh", "-c", "sleep 30 & pid=$!; kill -KILL $pid; wait $pid"])
    assert (outcome["exit_code"], outcome["oom_killed"]) == (137, False)
    assert fields["failure_class"] == "killed"


def test_nonzero_exit_keeps_the_log(case_run):
    outcome, fields = case_run(["sh", "-c", "echo 'harness: bad flag --frobnicate' >&2; exit 3"])
    assert (fields["status"], fields["failure_class"], outcome["exit_code"]) == ("failed", "nonzero_exit", 3)
    assert "bad flag --frobnicate" in fields["failure_detail"]
    assert "bad flag --frobnicate" in Path(outcome["log_path"]).read_text()


def test_framework_oom_in_the_log(case_run):
    message = ("tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor "
               "with shape[64,512,28,28] and type float on /job:localhost/replica:0/task:0/device:GPU:0")
    outcome, fields = case_run(["sh", "-c", f"echo 'Model:       vgg16'; echo '{message}' >&2; exit 1"])
    assert fields["failure_class"] == "gpu_oom"
    assert "OOM when allocating tensor" in fields["failure_detail"]


def test_exit_zero_without_a_result(case_run):
    outcome, fields = case_run(["sh", "-c", "echo 'Model: resnet50'; echo done"])
    assert (outcome["exit_code"], fields["failure_class"]) == (0, "no_result")


def test_timeout_stops_and_removes_the_container(case_run):
    start = time.monotonic()
    outcome, fields = case_run(["sleep", "60"], timeout_s=2)
    assert time.monotonic() - start < 30
    assert outcome["timed_out"] is True
    assert fields["failure_class"] == "timeout"


def test_gpu_request_on_an_engine_without_nvidia_runtime(case_run):
    outcome, fields = case_run(["nvidia-smi", "-L"], num_gpus=1)
    assert fields["failure_class"] == "no_gpu_runtime"
    assert "could not select device driver" in outcome["error"]


def test_missing_image(case_run):
    outcome, fields = case_run(["true"], image=f"fleetbench/not-there:{uuid.uuid4().hex[:8]}")
    assert fields["failure_class"] == "image_not_found"


def test_container_config_refused(case_run):
    # An open-files limit above the kernel's nr_open is refused at container start on every Linux host.
    outcome, fields = case_run(["true"], ulimit_map={"nofile": 2**31})
    assert fields["failure_class"] == "container_config"
    assert "rlimit" in outcome["error"].lower() or "nofile" in outcome["error"].lower()


def test_container_settings_reach_the_container(case_run):
    script = ("ulimit -s; df -k /dev/shm | tail -n 1 | awk '{print $2}'; echo \"$BENCH_MODE\"; "
              "cat /proc/self/cgroup >/dev/null; ls /harness")
    outcome, fields = case_run(["sh", "-c", script], ulimit_map={"stack": 67108864}, shm_size="256m",
                               environment={"BENCH_MODE": "nightly"}, cpu_limit=1.5,
                               mounts=[{"source": str(Path(__file__).parent), "target": "/harness", "type": "bind",
                                        "read_only": True}])
    lines = Path(outcome["log_path"]).read_text().split()
    assert lines[0] == str(67108864 // 1024)  # ulimit -s prints KiB
    assert lines[1] == str(256 * 1024)
    assert lines[2] == "nightly"
    assert Path(__file__).name in lines


def test_retry_removes_the_container_of_an_earlier_try(case_run, docker_api):
    op = case_run.build(["sh", "-c", "echo second try"])
    stale = docker_api.create_container(BASE, ["true"], name=op.container_name, labels=op.labels)
    outcome = op.execute({})
    assert outcome["exit_code"] == 0
    with pytest.raises(Exception):
        docker_api.inspect_container(stale["Id"])


def test_a_dead_tasks_container_of_the_same_run_and_host_is_removed_before_the_next_case(case_run, docker_api):
    """A worker SIGKILLed mid-case leaves its container running and its task up for retry; Airflow starts the lane's
    next case meanwhile. That case removes the orphan first (it would share the GPUs); another run's container stays."""
    op = case_run.build(["sh", "-c", "echo next case"])
    run = {"org.fleetbench.dag_id": "fleet_benchmark", "org.fleetbench.run_id": f"r-{op.container_name}",
           "org.fleetbench.host": "localhost"}
    op.labels.update({**run, "org.fleetbench.case_key": op.case["case_key"]})
    orphan = docker_api.create_container(BASE, ["sleep", "60"], name=f"{op.container_name}-orphan",
                                         labels={**op.labels, "org.fleetbench.case_key": "an.earlier.case"})
    docker_api.start(orphan["Id"])
    other_run = docker_api.create_container(BASE, ["sleep", "60"], name=f"{op.container_name}-other-run",
                                            labels={**op.labels, "org.fleetbench.run_id": "another-run",
                                                    "org.fleetbench.case_key": "an.earlier.case"})
    try:
        outcome = op.execute({})
        assert outcome["exit_code"] == 0
        with pytest.raises(NotFound):
            docker_api.inspect_container(orphan["Id"])
        assert docker_api.inspect_container(other_run["Id"])["Id"] == other_run["Id"]
    finally:
        docker_api.remove_container(other_run["Id"], force=True)


def test_kill_from_airflow_stops_removes_and_records_killed(case_run, docker_api):
    op = case_run.build(["sleep", "60"])
    errors: list[BaseException] = []

    def run():
        try:
            op.execute({})
        except BaseException as exc:  # the killed task's run loop ends with an error: expected
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not docker_api.containers(filters={"name": op.container_name}):
        time.sleep(0.1)
    assert docker_api.containers(filters={"name": op.container_name}), "the case container never started"
    op.on_kill()
    worker.join(30)
    assert not worker.is_alive()
    outcome = json.loads((Path(op.log_dir) / f"{op.case['case_key']}.outcome.json").read_text())
    fields, _ = measure({"command": ["sleep"]}, outcome)
    assert (fields["status"], fields["failure_class"]) == ("failed", "killed")
    assert outcome["measurement"]["fields"]["failure_class"] == "killed"  # measured once, by the case's task


def test_a_kill_removes_the_container_before_measuring_and_leaves_no_earlier_log(case_run, docker_api):
    """Airflow SIGKILLs 5 s after its SIGTERM and measuring a log of ~100 MB takes longer: on_kill writes the
    outcome (unmeasured), removes the container, and only then measures. A log an earlier execution left in the
    run's folder is not this case's: the killed row reads what this try printed."""
    op = case_run.build(["sh", "-c", "echo this try; sleep 60"])
    log_path, outcome_path = op._paths()
    log_path.write_text("an earlier execution's log\n" + "10\timages/sec: 100.0 +/- 0.0 (jitter = 0.0)\t7.0\n")
    seen: dict = {}
    remove, finish = op._remove, op._finish

    def checked_remove(cid, stop_first=True):
        seen["outcome on disk"] = json.loads(outcome_path.read_text()).get("killed_by_airflow")
        return remove(cid, stop_first=stop_first)

    def checked_finish(outcome):
        seen["left when measured"] = docker_api.containers(all=True, filters={"name": op.container_name})
        return finish(outcome)

    op._remove, op._finish = checked_remove, checked_finish
    worker = threading.Thread(target=lambda: pytest.raises(BaseException, op.execute, {}))
    worker.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not docker_api.containers(filters={"name": op.container_name}):
        time.sleep(0.1)
    time.sleep(0.5)  # it printed its line
    op.on_kill()
    worker.join(30)
    assert not worker.is_alive()
    assert seen == {"outcome on disk": True, "left when measured": []}
    assert "this try" in log_path.read_text() and "earlier execution" not in log_path.read_text()
    outcome = json.loads(outcome_path.read_text())
    assert outcome["measurement"]["fields"]["failure_class"] == "killed"
    assert outcome["measurement"]["fields"]["step_count"] == 0


@pytest.mark.parametrize("when", ["while its container is created", "before its container starts"])
def test_a_kill_before_the_case_runs_leaves_no_container(case_run, when):
    """Airflow's SIGTERM handler calls on_kill and returns to the task's code; SIGKILL follows 5 s later. A kill
    that came before the container existed, or before it started, left it to be created and started and then
    run on after the process died (the fixture checks that no container is left)."""
    op = case_run.build(["sleep", "5"])
    if when == "while its container is created":
        create = op._create_container

        def killed_during_create():
            op.on_kill()  # the container does not exist yet: nothing for on_kill to remove
            return create()

        op._create_container = killed_during_create
    else:
        rapl_start = op._rapl_start

        def killed_before_start(outcome):
            op.on_kill()  # removes the created container: start then finds none
            return rapl_start(outcome)

        op._rapl_start = killed_before_start
    started = time.monotonic()
    with pytest.raises(AirflowException, match="was killed from Airflow"):
        op.execute({})
    assert time.monotonic() - started < 5  # it did not run the case
    outcome = json.loads((Path(op.log_dir) / f"{op.case['case_key']}.outcome.json").read_text())
    assert outcome["killed_by_airflow"] is True and outcome["measurement"]["fields"]["failure_class"] == "killed"


def test_telemetry_wrapper_passes_everything_through(case_run, smoke_image):
    outcome, fields = case_run(HARNESS, image=smoke_image, telemetry_period_s=0.2)
    log = Path(outcome["log_path"]).read_text()
    assert (fields["status"], outcome["exit_code"]) == ("ok", 0)
    assert fields["images_per_sec"] > 0
    assert outcome["command"] == HARNESS  # the row keeps the harness command, not the wrapper's
    report = json.loads(fields["telemetry_json"])
    assert report["nvml"] is False and report["reason"] == "a CPU case: GPUs not sampled"
    # the container's CPU time, from its own cgroup; what a CPU case's energy is estimated from
    assert report["cpu"]["source"] == "cgroup" and report["cpu"]["usage_s"] > 0 and report["cpu"]["count"] >= 1
    assert 0 < fields["mean_cpu_util_pct"] <= 100
    if "energy_j" in report["rapl"]:  # a host whose RAPL counters this worker can read
        assert fields["energy_source"] == "measured" and fields["energy_j"] == report["rapl"]["energy_j"]
    else:  # here: no powercap; derive estimates it (tests/integration/test_fleet_benchmark_dag.py)
        assert report["rapl"]["reason"] and (fields["energy_source"], fields["energy_j"]) == ("none", None)
    assert log.rstrip().splitlines()[-1].startswith("FLEETBENCH_TELEMETRY ")


def test_the_shipped_pynvml_imports_in_the_container(case_run, smoke_image):
    """GPU cases' NVML source inside a container: the pynvml shipped with the wrapper imports; no driver here."""
    probe = ["python3", "-c", "import sys; sys.path.insert(0, '/opt/fleetbench-telemetry'); import wrapper\n"
             "try:\n    wrapper.NvmlSource()\nexcept wrapper.NvmlUnavailable as exc:\n    print('unavailable:', exc)"]
    outcome, _ = case_run(probe, image=smoke_image, telemetry_period_s=0.2)
    log = Path(outcome["log_path"]).read_text()
    assert outcome["exit_code"] == 0 and "unavailable: nvmlInit failed" in log, log


def test_the_wrapper_comes_from_one_volume_per_version_with_the_whole_bundle(case_run, smoke_image, docker_api,
                                                                           monkeypatch):
    """Cases mount the bundle's volume read-only instead of each copying it in: the volume is made once (with the
    bundle's exact bytes, and no helper container or image left), reused by later cases, and a new wrapper
    version gets a volume of its own."""
    import io
    import tarfile

    from fleetbench import telemetry

    def gone(name):
        try:
            docker_api.remove_volume(name, force=True)
        except Exception:
            pass

    name = telemetry.volume_name()
    gone(name)
    images_before = {i["Id"] for i in docker_api.images(all=True)}
    outcome, fields = case_run(HARNESS, image=smoke_image, telemetry_period_s=0.2)
    assert fields["status"] == "ok" and json.loads(fields["telemetry_json"])["cpu"]["usage_s"] > 0
    volume = docker_api.inspect_volume(name)
    assert volume["Labels"] == {telemetry.VOLUME_LABEL: name[len(telemetry.VOLUME_PREFIX):]}
    assert {i["Id"] for i in docker_api.images(all=True)} == images_before  # the imported image is gone
    assert docker_api.containers(all=True, filters={"label": telemetry.VOLUME_LABEL}) == []  # so is the helper
    # the volume holds the bundle byte for byte, and a case cannot write to it
    expected = {m.name: tarfile.open(fileobj=io.BytesIO(telemetry.bundle())).extractfile(m).read()
                for m in tarfile.open(fileobj=io.BytesIO(telemetry.bundle())) if m.isfile()}
    probe = ["python3", "-c", "import hashlib, os, sys\nfor root, _, files in os.walk('/opt/fleetbench-telemetry'):\n"
             "    for f in sorted(files):\n        p = os.path.join(root, f)\n"
             "        print(p.lstrip('/'), hashlib.sha256(open(p, 'rb').read()).hexdigest())\n"
             "try:\n    open('/opt/fleetbench-telemetry/x', 'w')\n"
             "except OSError as exc:\n    print('read-only:', exc.errno)"]
    outcome, _ = case_run(probe, image=smoke_image, telemetry_period_s=0.2, case_key="probe")
    lines = Path(outcome["log_path"]).read_text().splitlines()
    listed = dict(line.split() for line in lines if line.startswith("opt/"))
    assert listed == {path: hashlib.sha256(data).hexdigest() for path, data in expected.items()}
    assert "read-only: 30" in lines  # EROFS
    created = volume["CreatedAt"]
    assert docker_api.inspect_volume(name)["CreatedAt"] == created  # the second case reused it

    # two cases on one engine making it at once (two lanes, two DAGs): both get the whole volume, nothing is left
    gone(name)
    clients = [docker.APIClient(version="auto") for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(telemetry.ensure_volume, clients)) == [name] * 4
    assert {i["Id"] for i in docker_api.images(all=True)} == images_before
    assert docker_api.containers(all=True, filters={"label": telemetry.VOLUME_LABEL}) == []
    outcome, _ = case_run(probe, image=smoke_image, telemetry_period_s=0.2, case_key="probe2")
    assert dict(line.split() for line in Path(outcome["log_path"]).read_text().splitlines()
                if line.startswith("opt/")) == listed
    created = docker_api.inspect_volume(name)["CreatedAt"]

    # another wrapper version gets another volume; cleanup removes the other versions' volumes, not the current
    from fleetbench.cleanup import CleanupReport, _clean_telemetry_volumes

    monkeypatch.setattr(telemetry, "bundle", lambda: b"not the same bundle")
    old = telemetry.volume_name()
    assert old != name
    monkeypatch.undo()
    docker_api.create_volume(old, labels={telemetry.VOLUME_LABEL: "old"})
    try:
        dry = CleanupReport(dry_run=True)
        _clean_telemetry_volumes(docker_api, dry, dry_run=True)
        # (volumes of wrappers this machine ran before go too: only these two are the test's)
        assert [v for v in dry.removed_volumes if v["name"] in (old, name)] == [
            {"name": old, "reason": "the telemetry wrapper of another fleetbench version"}]
        assert docker_api.inspect_volume(old)
        report = CleanupReport()
        _clean_telemetry_volumes(docker_api, report, dry_run=False)
        removed = [v["name"] for v in report.removed_volumes]
        assert old in removed and name not in removed and not report.errors
        assert docker_api.volumes(filters={"name": old})["Volumes"] in (None, [])
        assert docker_api.inspect_volume(name)["CreatedAt"] == created
    finally:
        gone(old)


def test_telemetry_wrapper_keeps_crash_and_timeout_classes(case_run):
    outcome, fields = case_run(["python3", "-c", "import os; os.abort()"], telemetry_period_s=0.5)
    assert (outcome["exit_code"], fields["failure_class"]) == (134, "core_dump")
    start = time.monotonic()
    outcome, fields = case_run(["sleep", "60"], telemetry_period_s=0.5, timeout_s=2, case_key="slow")
    assert fields["failure_class"] == "timeout"
    assert time.monotonic() - start < 9  # SIGTERM reached the child through the wrapper: no 10 s kill grace



def test_an_image_without_python3_names_telemetry_period_s(case_run):
    """The wrapper's python3 is missing (the base image with PATH pointing nowhere): the case fails at start, and
    its detail says which setting runs it without the wrapper. With telemetry off the same image runs it."""
    no_path = {"environment": {"PATH": "/nonexistent"}}
    outcome, fields = case_run(["/bin/true"], telemetry_period_s=0.5, **no_path)
    assert (fields["status"], fields["failure_class"]) == ("failed", "container_config")
    assert "telemetry wrapper needs python3" in fields["failure_detail"]
    assert "benchmarks[].telemetry_period_s: 0" in fields["failure_detail"]
    outcome, fields = case_run(["/bin/true"], telemetry_period_s=0, case_key="off", **no_path)
    assert (outcome["start_error_class"], outcome["exit_code"]) == (None, 0)  # it ran (printing no result)

def test_engine_lost_mid_case_is_engine_unreachable_not_a_timeout(case_run, docker_api):
    """The engine stops answering 2 s into a case with a 600 s timeout: the case ends at once as
    `engine_unreachable` (not `timeout`), the task still returns its outcome (and the outcome file),
    the log keeps what the case printed until then, and the failed removal is logged, not raised. The
    container is left on the engine the worker lost; it is removed here directly, as maintenance does once
    the engine answers again."""
    proxy = EngineProxy()
    op = case_run.build(["sh", "-c", "echo case started; sleep 120"], docker_url=proxy.url, timeout_s=600,
                        case_key="engine_lost")
    done: dict = {}
    worker = threading.Thread(target=lambda: done.update(outcome=op.execute({})), daemon=True)
    worker.start()
    live = Path(op.log_dir) / f"{op.case['case_key']}.live.log"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and b"case started" not in (live.read_bytes() if live.exists() else b""):
        time.sleep(0.2)
    time.sleep(2)
    cut_at = time.monotonic()
    proxy.cut()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the case task did not return after its engine went away"
    outcome = done["outcome"]
    assert time.monotonic() - cut_at < 30
    fields, _ = measure({"command": op.command}, outcome)
    assert (fields["status"], fields["failure_class"]) == ("failed", "engine_unreachable")
    assert outcome["timed_out"] is False and proxy.url in fields["failure_detail"]
    text = Path(outcome["log_path"]).read_text()
    assert "case started" in text and "stopped answering" in text
    assert json.loads(Path(outcome["log_path"]).with_suffix(".outcome.json").read_text())["engine_unreachable"] is True
    left = docker_api.containers(all=True, filters={"name": op.container_name})
    assert len(left) == 1  # the engine was not reachable to remove it
    docker_api.remove_container(left[0]["Id"], force=True)


@pytest.mark.parametrize("telemetry", [0, 0.5])
def test_an_engine_that_does_not_answer_before_the_case_is_engine_unreachable(case_run, telemetry):
    """The engine is down when the case starts (dockerd restarting, a socket gone): the task fails, so Airflow
    retries it, and the outcome file says why, which the row takes if the retry cannot reach it either (it was
    task_failed, "see its task log")."""
    op = case_run.build(HARNESS, docker_url="unix:///nonexistent/docker.sock", telemetry_period_s=telemetry,
                        case_key=f"engine_down{telemetry}")
    with pytest.raises(Exception) as info:
        op.execute({})
    assert "Failed to establish connection" in str(info.value)
    saved = json.loads(Path(op.log_dir, f"{op.case['case_key']}.outcome.json").read_text())
    fields, _ = measure({"command": op.command}, saved)
    assert (fields["status"], fields["failure_class"]) == ("failed", "engine_unreachable")
    assert fields["failure_detail"].startswith("the Docker engine at unix:///nonexistent/docker.sock did not answer "
                                               "before the case started")
    assert "did not answer" in Path(saved["log_path"]).read_text()
