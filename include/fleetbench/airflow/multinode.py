"""The tasks of multi-node cases (README "Multi-node cases"): `multinode.cases` picks the runnable ones, and
MultiNodeCaseOperator runs one: a container per role on every host of the set (host networking), the
cluster spec passed to each, all started together.

The chief's (worker 0's; node 0's, a launcher case's torchrun on the first host) log gives the result.
Parameter servers, which never exit, are stopped when every worker has finished. When any container fails,
every other container of the case is stopped; the row is failed `peer_failed` naming the role (or with the
chief's own class when the chief failed). A chief that has not joined the cluster (its "Running warm up"
line; a launcher case's "joined process group" line) within `rendezvous_timeout_s` fails the case
`rendezvous_timeout`; no free port for a role, `port_unavailable`. Every role's log is kept in the chief
host's case folder (`<case_key>.log` is the chief's, `<case_key>.<role>.log` the others'), and every
container is removed however the case ended.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import requests
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowTaskTimeout
from docker.errors import APIError, NotFound

from fleetbench import capacity, multinode, runs
from fleetbench.airflow.task_gc import freeze_startup_objects
from fleetbench.hosts.devices import assign
from fleetbench.multinode import set_problem
from fleetbench.run_model import CaseOutcome, HostImages, HostVerdict, Measurement, RunPlan, by_host

log = logging.getLogger(__name__)

POLL_S = 0.5
MARKER_EVERY_S = 2.0
# Each engine call of a multi-node case is short (create, start, inspect, a log read, kill, remove): an engine that
# does not answer within this is lost for the rest of the case, and no further call waits on it.
CALL_TIMEOUT_S = 120
KEPT_LOG_LINES = 20000  # of each role, when the case is killed or an engine is lost (a normal end keeps all)
# What a lost engine looks like to docker-py (its HTTP errors, APIError, are answers, not losses).
ENGINE_LOST = (requests.exceptions.ConnectionError, requests.exceptions.Timeout,
               requests.exceptions.ChunkedEncodingError)


class EngineLost(Exception):
    """A host's engine did not answer (`host`): the case's outcome names it."""

    def __init__(self, host: str, docker_url: str, exc: BaseException) -> None:
        super().__init__(f"the Docker engine of host {host} ({docker_url}) did not answer: {exc}")
        self.host = host


class _Engine:
    """A role host's client that marks its host lost on the first call the engine does not answer, and from then on
    fails at once (a hung host held every later call, and the healthy hosts' containers, for the client's timeout
    each)."""

    def __init__(self, api, host: str, docker_url: str, lost: dict[str, str]) -> None:
        self._api, self._host, self._url, self._lost = api, host, docker_url, lost

    def __getattr__(self, name: str):
        attr = getattr(self._api, name)
        if not callable(attr) or name == "wait":  # a wait past its own timeout is a container slow to die
            return attr

        def call(*args, **kwargs):
            if self._host in self._lost:
                raise EngineLost(self._host, self._url, self._lost[self._host])
            try:
                return attr(*args, **kwargs)
            except ENGINE_LOST as exc:
                self._lost[self._host] = str(exc)
                raise EngineLost(self._host, self._url, exc) from exc

        return call


def role_container_name(dag_id: str, run_id: str, role: dict, case_key: str) -> str:
    """The role's container: run token, host, role and a digest of the case key first (names are cut at 120)."""
    digest = hashlib.sha256(case_key.encode()).hexdigest()[:8]
    return runs.container_name(dag_id, run_id, role["host"], f"{multinode.role_name(role)}-{digest}-{case_key}")


def role_device_ids(case, verdict: HostVerdict) -> list[str] | None:
    """The GPUs a worker or launcher node of `case` gets on its host, as a single-node case would
    (`fleetbench.hosts.devices.assign`, then the case's gpu_selection); None: `--gpus N`."""
    from fleetbench.airflow.operators import selected_device_ids

    devices = assign(case, verdict.host_facts)
    return list(devices.device_ids) if devices.device_ids else selected_device_ids(case, verdict)


def multinode_kwargs(plan, validations: list, prepared: list) -> list[dict]:
    """MultiNodeCaseOperator's arguments per runnable multi-node case (every host of its set ready)."""
    plan = RunPlan.load(plan)
    run = plan.run
    verdicts = by_host(HostVerdict.load(v) for v in validations if v)
    images = by_host(HostImages.load(p) for p in prepared if p)
    out = []
    for case in plan.cases:
        if case.nodes <= 1 or capacity.skipped(case) or set_problem(case, verdicts, images):
            continue
        roles = []
        for role in case.roles:
            host = plan.host(role["host"])
            roles.append({**role, "docker_url": host.docker_url, "docker_tls_conn_id": host.docker_tls_conn_id,
                          "address": host.cluster_address(),
                          "local": host.connection == "local" and host.docker_url.startswith("unix://"),
                          "image": images[role["host"]].ready(case.image)["pinned_ref"],
                          "gpu_device_ids": (None if role.get("job") == "ps" or not case.num_gpus
                                             else role_device_ids(case, verdicts[role["host"]])),
                          "container_name": role_container_name(run.dag_id, run.run_id, role, case.case_key),
                          "labels": {**runs.case_labels(run.dag_id, run.run_id, role["host"], case.case_key,
                                                        case.timeout_s),
                                     runs.label("role"): multinode.role_name(role)}})
        out.append({"case": {"host": case.host, "case_key": case.case_key, "harness": case.harness,
                             "harness_settings": case.harness_settings, "hosts": case.hosts,
                             "run_started_at": run.started_at},
                    "command": case.command, "roles": roles, "cluster": case.cluster, "timeout_s": case.timeout_s,
                    "container": case.container, "num_gpus": case.num_gpus,
                    "log_dir": str(runs.case_log_dir(run.dag_id, run.run_id, case.host))})
    log.info("%d multi-node case(s) can run", len(out))
    return out


class MultiNodeCasesOperator(BaseOperator):
    """`multinode.cases`: the runnable multi-node cases, the map source of `multinode.run_case`. It runs after
    every host lane is done (trigger rule all_done), so a multi-node case never overlaps a single-node case
    of its hosts, and its cases run one at a time, so two that share a host never overlap (nor wait on
    each other). The verdicts and images of the hosts its cases span come from those hosts' lanes (their `cases`
    tasks), read when it runs. A dry run runs none."""

    def __init__(self, *, plan: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan_ref = plan

    def execute(self, context) -> list[dict]:
        from fleetbench.airflow import pipeline
        from fleetbench.airflow.operators import LANE_IMAGES, LANE_VALIDATION, plan_task_id

        freeze_startup_objects()  # fleetbench.airflow.task_gc
        ti = context["ti"]
        plan = RunPlan.load(self.render_template(self.plan_ref, context))
        if plan.run.dry_run:
            return []
        # the slices of the hosts in sets: each holds the multi-node cases of its host (a set's case is in each)
        plan = pipeline.plan_cases(plan, ti, plan.multinode_hosts, plan_task_id(self.plan_ref))
        hosts = sorted({h for case in plan.cases if case.nodes > 1 for h in case.hosts})
        # every planned host's lane by its task id, also one the config lost since the run started (this task
        # parses the DAG file again: a host removed during the night had no lane here, its multi-node cases lost)
        task_ids = [f"{runs.lane_id(h)}.cases" for h in hosts]
        if not task_ids:
            return []
        return multinode_kwargs(plan, list(ti.xcom_pull(task_ids=task_ids, key=LANE_VALIDATION) or []),
                                list(ti.xcom_pull(task_ids=task_ids, key=LANE_IMAGES) or []))


class MultiNodeCaseOperator(BaseOperator):
    """One multi-node case: its roles' containers on their hosts' engines, its outcome as the chief's."""

    def __init__(self, *, case: dict, command: list[str], roles: list[dict], cluster: dict, timeout_s: int,
                 log_dir: str, container: dict | None = None, num_gpus: int = 0,
                 execution_grace_s: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_gpus = num_gpus
        self.case = case
        self.command = command
        self.roles = roles
        self.cluster = cluster
        self.timeout_s = timeout_s
        from fleetbench.airflow.operators import case_execution_timeout  # as the other imports of it here

        self.execution_timeout = case_execution_timeout(self.execution_timeout, timeout_s, execution_grace_s)
        self.log_dir = log_dir
        self.container = container or {}
        self._clients: dict[str, Any] = {}
        self._lost: dict[str, str] = {}  # host -> why its engine is lost for the rest of the case
        self._cids: dict[str, str] = {}  # role name -> container id
        self._killed = False
        self._killed_outcome: dict | None = None  # what on_kill recorded, pushed from the main thread
        self._ti = None
        self._execution_timeout = False
        self._started_at: datetime | None = None

    # -- Airflow entry points -------------------------------------------------------------
    def execute(self, context: Any) -> dict:
        freeze_startup_objects()  # fleetbench.airflow.task_gc
        self._ti = context.get("ti") if hasattr(context, "get") else None
        try:
            with ExitStack() as stack:
                try:
                    self._open_clients(stack)
                except EngineLost as exc:  # a host of the set down before the case: said, and retried by Airflow
                    self._engine_lost_before(exc)
                    raise AirflowException(str(exc)) from None
                return self.run_case()
        except AirflowTaskTimeout:
            self._execution_timeout = True
            raise

    def on_kill(self) -> None:
        """Killed from Airflow (or its execution_timeout): record the case as killed, remove every container, then
        measure (as BenchmarkCaseOperator.on_kill: the unmeasured outcome is on disk before the removal)."""
        self._killed = True
        now = datetime.now(timezone.utc)
        started = self._started_at or now
        why = (f"the task's execution_timeout of {self.execution_timeout} passed" if self._execution_timeout
               else "the task was killed from Airflow (UI or CLI) while the case ran")
        try:
            self._killed_outcome = {**self._blank_outcome(), "killed_by_airflow": True, "error": why,
                                    "started_at": started.isoformat(), "finished_at": now.isoformat(),
                                    "duration_s": round((now - started).total_seconds(), 3)}
            self._write(self._killed_outcome)
        finally:
            self._end_and_keep_logs()
        self._finish(self._killed_outcome, [], None)
        if self._execution_timeout:  # the task runner calls on_kill from its main thread after the timeout
            runs.push_killed_outcome(self._ti, self._killed_outcome, self.log)

    # -- pieces ---------------------------------------------------------------------------
    def _open_clients(self, stack: ExitStack) -> None:
        from docker.errors import DockerException

        from fleetbench.engines import engine_client

        for role in self.roles:
            if role["host"] not in self._clients:
                try:
                    self._clients[role["host"]] = stack.enter_context(
                        engine_client(role["docker_url"], role.get("docker_tls_conn_id"), timeout=CALL_TIMEOUT_S))
                except (DockerException, *ENGINE_LOST) as exc:
                    raise EngineLost(role["host"], role["docker_url"], exc) from exc

    def _cli(self, role: dict):
        return _Engine(self._clients[role["host"]], role["host"], role["docker_url"], self._lost)

    def _engine_lost_before(self, exc: EngineLost) -> None:
        """The outcome file of a case whose host's engine did not answer before it ran: engine_unreachable, naming
        the host; the row's class if Airflow's retry cannot reach it either."""
        now = datetime.now(timezone.utc)
        outcome = {**self._blank_outcome(), "engine_unreachable": True, "error": f"before the case started: {exc}",
                   "started_at": now.isoformat(), "finished_at": now.isoformat(), "duration_s": 0.0}
        self.log.error("case %s: %s", self.case["case_key"], outcome["error"])
        self._paths()[0].parent.mkdir(parents=True, exist_ok=True)
        self._paths()[0].write_text(f"fleetbench: {outcome['error']}\n")
        self._finish(outcome, [], None)

    def _paths(self) -> tuple[Path, Path]:
        return runs.log_path(self.log_dir, self.case["case_key"]), runs.outcome_path(self.log_dir,
                                                                                     self.case["case_key"])

    def _role_log(self, role: dict) -> Path:
        if multinode.is_chief(role):
            return self._paths()[0]
        return Path(self.log_dir) / f"{runs.file_stem(self.case['case_key'])}.{multinode.role_name(role)}.log"

    def _blank_outcome(self) -> dict[str, Any]:
        chief = self.roles[0]
        return {"host": self.case["host"], "case_key": self.case["case_key"], "image": chief["image"],
                "container_name": chief["container_name"], "command": list(self.command),
                "gpu_device_ids": chief.get("gpu_device_ids"),
                "exit_code": None, "oom_killed": False, "timed_out": False, "killed_by_airflow": False,
                "start_error_class": None, "error": None, "log_path": str(self._paths()[0]), "started_at": None,
                "finished_at": None, "duration_s": None, "rapl": None, "peak_mem_mib": None,
                "peak_mem_source": None, "run_started_at": self.case.get("run_started_at")}

    def _remove_stale(self) -> None:
        """Containers of this case's roles left by an earlier try, gone (a 409 "removal in progress" is retried;
        one that stays makes `_create` fail with a conflict that names it)."""
        for role in self.roles:
            if self._remove(role, role["container_name"]):
                self.log.warning("removed container %s left by an earlier try", role["container_name"])

    def _create(self, role: dict, command: list[str]) -> str:
        from docker.types import LogConfig, Ulimit

        from fleetbench.airflow.operators import CASE_LOG_MAX_FILES, CASE_LOG_MAX_SIZE, container_settings

        cli = self._cli(role)
        settings = container_settings(self.container)
        mounts = [{"Source": m["source"], "Target": m["target"], "Type": "bind", "ReadOnly": m["read_only"]}
                  for m in settings["mounts"]]
        host_config = cli.create_host_config(
            auto_remove=False, network_mode="host", shm_size=settings["shm_size"], ipc_mode=settings["ipc_mode"],
            mem_limit=settings["mem_limit"],
            nano_cpus=int(settings["cpu_limit"] * 1e9) if settings["cpu_limit"] else None,
            ulimits=[Ulimit(name=k, soft=v, hard=v) for k, v in settings["ulimit_map"].items()],
            device_requests=self._device_requests(role), mounts=mounts or None,
            log_config=LogConfig(config={"max-size": CASE_LOG_MAX_SIZE, "max-file": CASE_LOG_MAX_FILES}))
        created = cli.create_container(image=role["image"], command=command, name=role["container_name"],
                                       environment=settings["environment"], labels=role["labels"],
                                       host_config=host_config)
        return created["Id"]

    def _device_requests(self, role: dict):
        """The case's GPUs for a worker or launcher node; none for a parameter server (TensorFlow would take
        every visible GPU's memory from the worker next to it)."""
        from docker.types import DeviceRequest

        if not self.num_gpus or role.get("job") == "ps":
            return None
        if role.get("gpu_device_ids"):  # named GPUs (gpu_selection device_ids, or MIG on elsewhere on the host)
            return [DeviceRequest(device_ids=list(role["gpu_device_ids"]), capabilities=[["gpu"]])]
        return [DeviceRequest(count=self.num_gpus, capabilities=[["gpu"]])]

    # -- the run loop ---------------------------------------------------------------------
    def run_case(self) -> dict:
        log_path, outcome_path = self._paths()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        outcome_path.unlink(missing_ok=True)
        outcome = self._blank_outcome()
        t0 = self._started_at = datetime.now(timezone.utc)
        self._remove_stale()
        addresses = {r["host"]: r["address"] for r in self.roles}
        local = {r["host"]: bool(r.get("local")) for r in self.roles}
        try:
            ports = multinode.allocate_ports(multinode.port_roles(self.roles, self.cluster.get("layout")), addresses,
                                             local, int(self.cluster.get("base_port", 23456)))
        except multinode.PortUnavailable as exc:
            return self._not_started(outcome, "port_unavailable", str(exc), t0)
        commands = {multinode.role_name(r): multinode.role_command(self.command, self.roles, ports, addresses, r,
                                                                   self.cluster)
                    for r in self.roles}
        outcome["command"] = commands[multinode.role_name(self.roles[0])]
        self.log.info("case %s: %s", self.case["case_key"],
                      ", ".join(f"{multinode.role_name(r)}@{r['host']}:{p}" for r, p in zip(self.roles, ports)))
        role = self.roles[0]
        try:
            for role in self.roles:
                self._end_if_killed()
                self._cids[multinode.role_name(role)] = self._create(role, commands[multinode.role_name(role)])
            for role in self.roles:  # all created first, then started together
                self._end_if_killed()
                self._cli(role).start(self._cids[multinode.role_name(role)])
        except APIError as exc:  # the role and host that refused: the row is stored under the set's first host
            from fleetbench.airflow.operators import start_error_class

            self._remove_all()
            return self._not_started(outcome, start_error_class(exc),
                                     f"{multinode.role_name(role)} on {role['host']}: {exc}", t0)
        except EngineLost as exc:  # said in the outcome file, then retried by Airflow (the retry removes by name)
            self._remove_all()
            self._engine_lost_before(exc)
            raise AirflowException(str(exc)) from None
        except BaseException:  # a timeout, a kill between create and start: nothing left behind
            self._remove_all()
            raise

        try:
            reason, dead = self._watch(t0)
            stopped = self._stop_running()
            if self._killed:
                runs.push_killed_outcome(self._ti, self._killed_outcome, self.log)
                raise AirflowException(f"case {self.case['case_key']} was killed from Airflow; its outcome is recorded")
            role_outcomes = self._role_outcomes(stopped, t0)
        except (EngineLost, *ENGINE_LOST) as exc:  # the other hosts' containers end at once, their logs kept
            self._end_and_keep_logs()
            now = datetime.now(timezone.utc)
            outcome.update({"engine_unreachable": True, "started_at": t0.isoformat(), "finished_at": now.isoformat(),
                            "duration_s": round((now - t0).total_seconds(), 3),
                            "error": f"mid-case, {exc}"})
            self._finish(outcome, [], None)
            return outcome
        finally:
            self._remove_all()
        chief = role_outcomes[multinode.role_name(self.roles[0])]
        outcome.update({k: chief[k] for k in ("exit_code", "oom_killed", "started_at", "finished_at", "duration_s")})
        outcome["timed_out"] = reason == "timeout"
        ends = self._role_ends(role_outcomes)
        override = None
        if reason == "rendezvous_timeout":
            timeout = self.cluster.get("rendezvous_timeout_s")
            marker = multinode.joined_marker(self.cluster.get("layout"))
            override = ("rendezvous_timeout", f"the chief did not join the cluster (no '{marker}' "
                                              f"line) within {timeout} s; every container of the case was stopped")
        elif reason == "failed" and dead is not None and not multinode.is_chief(dead):
            end = next(e for e in ends if e.name == multinode.role_name(dead))
            override = multinode.peer_failure(end)
        self._finish(outcome, ends, override)
        self.log.info("case %s: %s in %.1f s; logs in %s", self.case["case_key"], reason, outcome["duration_s"] or 0,
                      self.log_dir)
        return outcome

    def _end_if_killed(self) -> None:
        """Killed (on_kill ran: Airflow's SIGTERM handler returns to this code) before every role was created and
        started: create or start no more (they would run on the GPUs until the SIGKILL), end as killed; the caller
        removes what exists."""
        if self._killed:
            runs.push_killed_outcome(self._ti, self._killed_outcome, self.log)
            raise AirflowException(f"case {self.case['case_key']} was killed from Airflow before it ran; its outcome "
                                   "is recorded")

    def _not_started(self, outcome: dict, failure_class: str, error: str, t0: datetime) -> dict:
        outcome.update({"start_error_class": failure_class, "error": error, "started_at": t0.isoformat(),
                        "finished_at": t0.isoformat(), "duration_s": 0.0})
        self.log.error("case %s could not start: %s", self.case["case_key"], error)
        self._paths()[0].write_text(f"fleetbench: the case could not start: {error}\n")
        self._finish(outcome, [], None)
        return outcome

    def _watch(self, t0: datetime) -> tuple[str, dict | None]:
        """Until every worker has exited (done), one role failed, the chief missed the rendezvous, or the
        case's timeout passed: (reason, the failed role)."""
        from fleetbench.airflow.operators import docker_time

        start = time.monotonic()
        rendezvous_s = float(self.cluster.get("rendezvous_timeout_s", 300))
        joined, next_marker, read_since = False, 0.0, None
        chief, marker = self.roles[0], multinode.joined_marker(self.cluster.get("layout"))
        while not self._killed:
            elapsed = time.monotonic() - start
            try:
                states = {multinode.role_name(r): self._cli(r).inspect_container(self._cids[multinode.role_name(r)])
                          ["State"] for r in self.roles}
            except NotFound:
                if self._killed:  # on_kill removed them meanwhile: it recorded the case
                    break
                raise
            failed = [r for r in self.roles if states[multinode.role_name(r)].get("Status") in ("exited", "dead")
                      and (states[multinode.role_name(r)].get("ExitCode")
                           or states[multinode.role_name(r)].get("OOMKilled"))]
            if failed:  # the one that died first: a peer whose death took the chief with it is the cause
                # by time, not by Docker's text: it drops trailing zeros ("...:00Z" sorted after "...:00.3Z")
                role = min(failed, key=lambda r: docker_time(states[multinode.role_name(r)].get("FinishedAt")) or "")
                self.log.error("case %s: %s on %s exited %s", self.case["case_key"], multinode.role_name(role),
                               role["host"], states[multinode.role_name(role)].get("ExitCode"))
                return "failed", role
            workers = [states[multinode.role_name(r)] for r in self.roles if multinode.runs_to_the_end(r)]
            if all(s.get("Status") in ("exited", "dead") for s in workers):
                return "done", None
            if not joined and elapsed >= next_marker:
                joined, read_since = self._chief_printed(chief, marker, read_since)
                next_marker = elapsed + MARKER_EVERY_S
            if not joined and elapsed > rendezvous_s:
                return "rendezvous_timeout", None
            if elapsed > self.timeout_s:
                self.log.error("case %s passed its timeout of %d s", self.case["case_key"], self.timeout_s)
                return "timeout", None
            time.sleep(POLL_S)
        return "killed", None

    def _chief_printed(self, chief: dict, marker: str, since: float | None) -> tuple[bool, float | None]:
        """Whether the chief has printed `marker` since `since` (the engine's time of the last line read before:
        each look reads only what came after it, so a chief that prints thousands of lines between two looks, as
        NCCL_DEBUG=INFO ranks do, cannot hide it; a fixed tail could). Returns it and the new `since`, the
        engine's own timestamp of the last line (the worker's clock may differ from a remote engine's)."""
        from fleetbench.airflow.operators import docker_time

        text = self._cli(chief).logs(self._cids[multinode.role_name(chief)], timestamps=True,
                                     since=since).decode(errors="replace")
        last = text.rstrip("\n").rpartition("\n")[2].partition(" ")[0]
        try:
            at = datetime.fromisoformat(docker_time(last)).timestamp() - 0.001 if last else None
        except (TypeError, ValueError):  # not a timestamp: read from the start again next time
            at = None
        return marker in text, at if at is not None and at > 0 else since

    def _stop_running(self) -> set[str]:
        """Stop (kill: a ps never exits by itself) every container still running; their role names."""
        stopped = set()
        for role in self.roles:
            name = multinode.role_name(role)
            try:
                if self._cli(role).inspect_container(self._cids[name])["State"].get("Running"):
                    self._cli(role).kill(self._cids[name])
                    stopped.add(name)
                    try:
                        self._cli(role).wait(self._cids[name], timeout=30)
                    except requests.exceptions.ReadTimeout:  # slow to die (e.g. in D state): still ours to remove
                        self.log.warning("case %s: %s on %s still dying 30 s after SIGKILL", self.case["case_key"],
                                         name, role["host"])
            except NotFound:
                pass
            except APIError as exc:  # already exited between the two calls
                self.log.debug("stopping %s: %s", name, exc)
        return stopped

    def _role_outcomes(self, stopped: set[str], t0: datetime) -> dict[str, dict]:
        """Each role's container outcome (exit code, OOM kill, times), its log saved to its file."""
        from fleetbench.airflow.operators import docker_time

        out = {}
        for role in self.roles:
            name = multinode.role_name(role)
            cli, cid = self._cli(role), self._cids[name]
            state = cli.inspect_container(cid)["State"]
            path = self._role_log(role)
            tmp = path.with_suffix(".log.tmp")
            with tmp.open("wb") as f:
                for chunk in cli.logs(cid, stdout=True, stderr=True, stream=True, follow=False):
                    f.write(chunk)
            tmp.replace(path)
            started = docker_time(state.get("StartedAt")) or t0.isoformat()
            finished = docker_time(state.get("FinishedAt")) or datetime.now(timezone.utc).isoformat()
            out[name] = {"exit_code": state.get("ExitCode"), "oom_killed": bool(state.get("OOMKilled")),
                         "started_at": started, "finished_at": finished, "stopped": name in stopped,
                         "log_path": str(path),
                         "duration_s": round((datetime.fromisoformat(finished)
                                              - datetime.fromisoformat(started)).total_seconds(), 3)}
        return out

    def _role_ends(self, outcomes: dict[str, dict]) -> list[multinode.RoleEnd]:
        harness = self.case.get("harness") or "tf_cnn_benchmarks"
        return [multinode.classify_role(role, outcomes[multinode.role_name(role)], harness) for role in self.roles]

    def _finish(self, outcome: dict, ends: list, override: tuple[str, str] | None) -> None:
        """Measure the chief's log (the result), apply the case's own verdict, record every role, write the file."""
        from fleetbench.measure import FAILED, measure

        fields, steps = measure({"command": outcome["command"], "harness": self.case.get("harness"),
                                 "harness_settings": self.case.get("harness_settings")}, outcome)
        if override is not None:
            fields = {**fields, "status": FAILED, "failure_class": override[0], "failure_detail": override[1][:500],
                      "images_per_sec": None, "value": None, "accuracy_top1": None}
        roles = []
        for role, end in zip(self.roles, ends or [None] * len(self.roles)):
            roles.append({"role": multinode.role_name(role), "host": role["host"], "job": role["job"],
                          "task_index": role["task_index"], "address": role["address"],
                          **({"procs": role["procs"]} if "procs" in role else {}),
                          "log_path": str(self._role_log(role)),
                          **({"status": end.status, "failure_class": end.failure_class, "exit_code": end.exit_code,
                              "stopped": end.stopped, "started_at": end.started_at, "finished_at": end.finished_at}
                             if end else {})})
        fields["roles_json"] = json.dumps(roles)
        outcome["measurement"] = Measurement(fields=fields, steps=steps).to_xcom()
        CaseOutcome.load(outcome)
        self._write(outcome)

    def _write(self, outcome: dict) -> None:
        """The outcome file next to the chief's log (collect reads it when the task died before returning)."""
        _, path = self._paths()
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(outcome, indent=1))
        tmp.replace(path)

    def _per_host(self, work) -> None:
        """`work(role)` for every role, the hosts side by side (a host that does not answer holds only its own
        roles), each host's roles in layout order."""
        from concurrent.futures import ThreadPoolExecutor

        hosts: dict[str, list[dict]] = {}
        for role in self.roles:
            hosts.setdefault(role["host"], []).append(role)
        if len(hosts) == 1:
            for role in self.roles:
                work(role)
            return
        with ThreadPoolExecutor(max_workers=min(len(hosts), 32)) as pool:
            for done in [pool.submit(lambda roles=roles: [work(r) for r in roles]) for roles in hosts.values()]:
                done.result()

    def _remove_all(self) -> None:
        """Every container of the case, gone (killed first; a missing one is fine; one on a lost engine is left to
        maintenance, which removes it once the engine answers)."""
        self._per_host(lambda role: self._remove(role, self._cids.get(multinode.role_name(role))
                                                 or role["container_name"]))

    def _end_and_keep_logs(self) -> None:
        """Killed, or an engine lost mid-case: every container still reachable is killed at once (its GPUs free),
        then each role's log is kept (its last KEPT_LOG_LINES lines: what it printed until then), then every
        container is removed."""
        def kill(role: dict) -> None:
            cid = self._cids.get(multinode.role_name(role))
            if cid is None or role["host"] in self._lost:
                return
            try:
                self._cli(role).kill(cid)
            except (APIError, EngineLost) as exc:  # already exited, or gone
                self.log.debug("killing %s: %s", multinode.role_name(role), exc)

        def keep_log(role: dict) -> None:
            cid = self._cids.get(multinode.role_name(role))
            if cid is None or role["host"] in self._lost:
                return
            try:
                text = self._cli(role).logs(cid, stdout=True, stderr=True, tail=KEPT_LOG_LINES)
                self._role_log(role).write_bytes(text)
            except (APIError, EngineLost, OSError) as exc:
                self.log.warning("the log of %s on %s could not be kept: %s", multinode.role_name(role), role["host"],
                                 exc)

        self._per_host(kill)
        self._per_host(keep_log)
        self._remove_all()

    def _remove(self, role: dict, cid: str) -> bool:
        """Kill and remove one container, three tries (a 409 "removal in progress", an engine that blinked);
        True when it was there and is gone; False at once on an engine lost earlier in the case, or lost now."""
        for attempt in range(3):
            if role["host"] in self._lost:
                return False
            try:
                self._cli(role).remove_container(cid, force=True)
                return True
            except NotFound:
                return False
            except EngineLost as exc:
                self.log.warning("removing %s: %s; maintenance removes it once the engine answers", cid[:12], exc)
                return False
            except (APIError, requests.exceptions.RequestException) as exc:
                self.log.warning("removing %s failed (attempt %d): %s", cid[:12], attempt + 1, exc)
                time.sleep(0.5 * (attempt + 1))
        return False
