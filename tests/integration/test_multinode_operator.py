"""MultiNodeCaseOperator against the real engine, with roles that only sleep (the smoke image's python3; the
cluster flags land in sys.argv): a case killed from Airflow and a case past its timeout leave no container
and a row that says so. The real harness's runs are in test_multinode_real_tf.py."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest

from fleetbench import multinode, runs

pytestmark = [pytest.mark.integration]

SLEEP = ["python3", "-c", "import sys, time; print('up', sys.argv[1:], flush=True); time.sleep(600)"]


def operator(image: str, log_dir, run_id: str, timeout_s: int = 120, h2: dict | None = None):
    """Roles worker0 and ps0 on h1, worker1 on h2, both on this machine's engine unless `h2` says otherwise (its
    role's `docker_url`, `image`)."""
    from fleetbench.airflow.multinode import MultiNodeCaseOperator, role_container_name

    case_key = "sleep.n2.h1+h2"
    roles = []
    for i, role in enumerate(multinode.layout(["h1", "h2"], 1, 1, ps_nodes="first")):
        roles.append({**role, "docker_url": "unix:///var/run/docker.sock", "docker_tls_conn_id": None,
                      "address": f"127.0.0.{1 + (role['host'] == 'h2')}", "local": True, "image": image,
                      "container_name": role_container_name("d", run_id, role, case_key),
                      "labels": {**runs.case_labels("d", run_id, role["host"], case_key, timeout_s),
                                 runs.label("role"): multinode.role_name(role)},
                      **((h2 or {}) if role["host"] == "h2" else {})})
    return MultiNodeCaseOperator(
        task_id=f"mn_{i}", case={"host": "h1", "case_key": case_key, "harness": "tf_cnn_benchmarks",
                                 "harness_settings": {}, "hosts": ["h1", "h2"]},
        command=SLEEP, roles=roles, cluster={"base_port": 24700, "rendezvous_timeout_s": 300}, timeout_s=timeout_s,
        log_dir=str(log_dir), container={})


def labelled(docker_api, run_id: str) -> list:
    return docker_api.containers(all=True, filters={"label": f"org.fleetbench.run_id={run_id}"})


def test_a_case_killed_from_airflow_removes_every_container_and_records_killed(smoke_image, docker_api, tmp_path):
    from airflow.sdk.exceptions import AirflowException

    from fleetbench.measure import measure

    run_id = f"mn-kill-{uuid.uuid4().hex[:8]}"
    op = operator(smoke_image, tmp_path, run_id)
    raised: list = []

    def run():
        try:
            op.execute({})
        except AirflowException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while len(docker_api.containers(filters={"label": f"org.fleetbench.run_id={run_id}"})) < 3:
        assert time.monotonic() < deadline, "the case's containers never all ran"
        time.sleep(0.2)
    op.on_kill()
    assert labelled(docker_api, run_id) == []  # gone by the time on_kill returns
    thread.join(timeout=60)
    assert raised and "was killed from Airflow" in str(raised[0])
    # each role's log until the kill is kept (the row's log_path, the chief's, was a file that did not exist)
    for name in ("", ".worker1", ".ps0"):
        assert "up [" in (tmp_path / f"sleep.n2.h1+h2{name}.log").read_text()
    outcome = json.loads((tmp_path / "sleep.n2.h1+h2.outcome.json").read_text())
    assert outcome["killed_by_airflow"] and outcome["measurement"]["fields"]["failure_class"] == "killed"
    fields, _ = measure({"command": SLEEP}, outcome)
    assert (fields["status"], fields["failure_class"]) == ("failed", "killed")
    assert labelled(docker_api, run_id) == []


@pytest.mark.parametrize("when", ["while its first container is created", "before its containers start"])
def test_a_kill_before_the_case_runs_creates_and_starts_nothing_more(smoke_image, docker_api, tmp_path, when):
    """Airflow's SIGTERM handler calls on_kill and returns to the task's code, SIGKILL 5 s later: a kill while the
    roles were created went on to create and start every role (running on the GPUs until the SIGKILL, then
    removed only if the task got that far). Now nothing is started after the kill, and nothing is left."""
    from airflow.sdk.exceptions import AirflowException

    run_id = f"mn-early-{uuid.uuid4().hex[:8]}"
    op = operator(smoke_image, tmp_path, run_id)
    since = time.time()
    if when == "while its first container is created":
        create = op._create

        def killed_during_create(role, command):
            if not op._killed:
                op.on_kill()
            return create(role, command)

        op._create = killed_during_create
    else:
        end_if_killed, calls = op._end_if_killed, []

        def killed_before_start():
            calls.append(1)
            if len(calls) == len(op.roles) + 1:  # every role created, none started
                op.on_kill()
            end_if_killed()

        op._end_if_killed = killed_before_start
    with pytest.raises(AirflowException, match="was killed from Airflow"):
        op.execute({})
    started = {"type": "container", "event": "start", "label": f"org.fleetbench.run_id={run_id}"}
    events = docker_api.events(since=since, until=time.time() + 1, decode=True, filters=started)
    assert list(events) == [] and labelled(docker_api, run_id) == []
    outcome = json.loads((tmp_path / "sleep.n2.h1+h2.outcome.json").read_text())
    assert outcome["killed_by_airflow"] and outcome["measurement"]["fields"]["failure_class"] == "killed"


def test_a_case_past_its_timeout_is_stopped_whole(smoke_image, docker_api, tmp_path):
    run_id = f"mn-timeout-{uuid.uuid4().hex[:8]}"
    outcome = operator(smoke_image, tmp_path, run_id, timeout_s=4).execute({})
    fields = outcome["measurement"]["fields"]
    assert (fields["status"], fields["failure_class"], outcome["timed_out"]) == ("failed", "timeout", True)
    roles = {r["role"]: r for r in json.loads(fields["roles_json"])}
    assert all(r["stopped"] for r in roles.values()) and set(roles) == {"worker0", "worker1", "ps0"}
    # every role got the cluster spec and kept its log
    for name, role in roles.items():
        text = open(role["log_path"]).read()
        assert "--ps_hosts=127.0.0.1:" in text and "127.0.0.2:" in text
        assert f"--job_name={role['job']}" in text and f"--task_index={role['task_index']}" in text
    assert labelled(docker_api, run_id) == []


def test_containers_left_by_an_earlier_try_are_removed_through_a_removal_in_progress(smoke_image, docker_api,
                                                                                     tmp_path):
    """A retried task finds its roles' containers from the try before; the engine answers 409 "removal in
    progress" to the first removal (as it does while an earlier removal runs): the removal is retried and every
    stale container is gone before the new ones are created under the same names."""
    import requests
    from docker.errors import APIError

    run_id = f"mn-stale-{uuid.uuid4().hex[:8]}"
    op = operator(smoke_image, tmp_path, run_id)
    for role in op.roles:
        cid = docker_api.create_container(smoke_image, SLEEP, name=role["container_name"], labels=role["labels"],
                                          host_config=docker_api.create_host_config(network_mode="none"))["Id"]
        docker_api.start(cid)
    assert len(labelled(docker_api, run_id)) == len(op.roles)

    class Busy:  # the real client, but its first removal is refused with a 409
        refused = 0

        def __getattr__(self, name):
            return getattr(docker_api, name)

        def remove_container(self, cid, **kwargs):
            if not Busy.refused:
                Busy.refused += 1
                response = requests.Response()
                response.status_code = 409
                raise APIError("removal of container is already in progress", response=response)
            return docker_api.remove_container(cid, **kwargs)

    op._clients = {role["host"]: Busy() for role in op.roles}
    op._remove_stale()
    assert Busy.refused == 1 and labelled(docker_api, run_id) == []


def test_a_chief_that_prints_a_flood_after_joining_is_not_a_rendezvous_timeout(smoke_image, docker_api, tmp_path):
    """The chief says it joined, then prints thousands of lines before the next look at its log (NCCL_DEBUG=INFO
    ranks do): each look reads what came since the last, so the marker is seen and the case runs to its end. A
    tail of the last 400 lines missed it, and the case was killed at rendezvous_timeout_s."""
    from fleetbench.airflow.multinode import MultiNodeCaseOperator

    run_id = f"mn-flood-{uuid.uuid4().hex[:8]}"
    op = operator(smoke_image, tmp_path, run_id)
    flood = ("import sys, time; time.sleep(0.5); print('Running warm up', flush=True); "
             "[print('NCCL INFO channel', i) for i in range(5000)]; sys.stdout.flush(); time.sleep(6)")
    op = MultiNodeCaseOperator(task_id=op.task_id, case=op.case, command=["python3", "-c", flood], roles=op.roles,
                               cluster={"base_port": 24750, "rendezvous_timeout_s": 3}, timeout_s=60,
                               log_dir=op.log_dir, container={})
    outcome = op.execute({})
    fields = outcome["measurement"]["fields"]
    assert fields["failure_class"] != "rendezvous_timeout", fields["failure_detail"]
    assert outcome["exit_code"] == 0 and fields["failure_class"] == "no_result"  # it ran to its end (no benchmark)
    assert labelled(docker_api, run_id) == []


def test_a_host_that_hangs_mid_case_frees_the_other_hosts_at_once_and_keeps_their_logs(smoke_image, docker_api,
                                                                                        tmp_path, monkeypatch):
    """h2's engine stops answering mid-case (a hung host: every call waits for its timeout). The first call that
    times out marks it lost: h1's containers are killed and removed at once, their logs kept (the chief's is the
    row's), no later call waits on h2, and the row is engine_unreachable naming h2. Before, every role after h2 in
    the layout waited three timeouts of 600 s per removal, and h1's GPUs with them."""
    from engine_proxy import EngineProxy
    from fleetbench.airflow import multinode as operators
    from fleetbench.measure import measure

    monkeypatch.setattr(operators, "CALL_TIMEOUT_S", 3)
    proxy = EngineProxy()
    run_id = f"mn-hang-{uuid.uuid4().hex[:8]}"
    op = operator(smoke_image, tmp_path, run_id, h2={"docker_url": proxy.url})
    done: dict = {}
    thread = threading.Thread(target=lambda: done.update(outcome=op.execute({})), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while len(docker_api.containers(filters={"label": f"org.fleetbench.run_id={run_id}"})) < 3:
        assert time.monotonic() < deadline, "the case's containers never all ran"
        time.sleep(0.2)
    time.sleep(1)
    frozen_at = time.monotonic()
    proxy.freeze()
    try:
        thread.join(timeout=60)
        assert not thread.is_alive(), "the case did not end after h2's engine hung"
        assert time.monotonic() - frozen_at < 20
        outcome = done["outcome"]
        fields, _ = measure({"command": SLEEP}, outcome)
        assert (fields["status"], fields["failure_class"]) == ("failed", "engine_unreachable")
        assert f"the Docker engine of host h2 ({proxy.url}) did not answer" in fields["failure_detail"]
        left = labelled(docker_api, run_id)
        assert [c["Labels"]["org.fleetbench.host"] for c in left] == ["h2"]  # only the lost engine's
        assert "up [" in (tmp_path / "sleep.n2.h1+h2.log").read_text()  # the chief's log, on h1
        assert "up [" in (tmp_path / "sleep.n2.h1+h2.ps0.log").read_text()
    finally:
        proxy.cut()
        for c in labelled(docker_api, run_id):  # what maintenance removes once the engine answers again
            docker_api.remove_container(c["Id"], force=True)


def test_a_role_that_cannot_start_names_its_host(smoke_image, docker_api, tmp_path):
    """The row is stored under the set's first host: a refusal on another host must say which one."""
    run_id = f"mn-start-{uuid.uuid4().hex[:8]}"
    outcome = operator(smoke_image, tmp_path, run_id, h2={"image": "127.0.0.1:5000/fleetbench/no-such-image:1"}
                       ).execute({})
    fields = outcome["measurement"]["fields"]
    assert (fields["status"], fields["failure_class"]) == ("failed", "image_not_found")
    assert fields["failure_detail"].startswith("worker1 on h2: ")
    assert labelled(docker_api, run_id) == []


def test_a_host_whose_engine_is_down_before_the_case_is_engine_unreachable_naming_it(smoke_image, docker_api,
                                                                                      tmp_path):
    from airflow.sdk.exceptions import AirflowException

    from fleetbench.measure import measure

    run_id = f"mn-down-{uuid.uuid4().hex[:8]}"
    op = operator(smoke_image, tmp_path, run_id, h2={"docker_url": "unix:///nonexistent/docker.sock"})
    with pytest.raises(AirflowException, match="the Docker engine of host h2"):
        op.execute({})  # Airflow retries it; the outcome file is the row's if the retry cannot reach h2 either
    saved = json.loads((tmp_path / "sleep.n2.h1+h2.outcome.json").read_text())
    fields, _ = measure({"command": SLEEP}, saved)
    assert (fields["status"], fields["failure_class"]) == ("failed", "engine_unreachable")
    assert "the Docker engine of host h2 (unix:///nonexistent/docker.sock) did not answer" in fields["failure_detail"]
    assert labelled(docker_api, run_id) == []
