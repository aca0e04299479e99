"""BenchmarkCaseOperator: a DockerOperator that runs one benchmark case and always returns its outcome.

Why not the stock DockerOperator run loop (provider 4.6.1): with `execution_timeout`,
`auto_remove="success"` leaves the container running and `"force"` reports NotFound instead of
the timeout; `"never"` leaves an Exited container whose fixed name conflicts on retry. This
operator keeps DockerOperator's parameters, hook and templating, and replaces the run loop:

- a stale container of the same name (an earlier try of this task) is removed first;
- the case's own `timeout_s` is enforced here (wait with a deadline, then stop), so a timeout is
  an outcome (`failure_class="timeout"`), not a lost row;
- the whole container log is saved to a file, the container state (exit code, OOMKilled, real
  start/finish times) is read, and the container is removed, however the case ended;
- `on_kill` (a task killed from the UI) stops and removes the container.

Container-level failures (OOM kill, non-zero exit, crash, timeout, no GPU runtime, missing image)
are returned as data for the collect step; only infrastructure errors (Docker engine unreachable)
raise and fail the task.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import datetime, timedelta, timezone
from functools import cached_property
from pathlib import Path
from typing import Any

import requests
from airflow.providers.docker.operators.docker import DockerOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowTaskTimeout
from docker import APIClient
from docker.errors import APIError, DockerException, NotFound
from docker.types import DeviceRequest, LogConfig, Ulimit

from fleetbench import runs, telemetry
from fleetbench.airflow import pipeline
from fleetbench.airflow.connections import docker_tls_files
from fleetbench.airflow.task_gc import freeze_startup_objects
from fleetbench.engines import engine_now, version_refused, without_environment
from fleetbench.run_model import CaseOutcome, HostImages, HostVerdict, Measurement, RunPlan, by_host
from fleetbench.runs import log_path as case_log_path
from fleetbench.runs import outcome_path
from fleetbench.telemetry.container_memory import PeakMemory
from fleetbench.telemetry.rapl import RaplMeter, RaplUnavailable

log = logging.getLogger(__name__)
# Capacity, device assignment and the TLS engine client are imported where they run: every task process of a
# run imports this module with the DAG file, and most of its tasks need none of them.

STOP_GRACE_S = 10
CASE_LOG_MAX_SIZE, CASE_LOG_MAX_FILES = "100m", "3"
# What a lost engine looks like to docker-py (its HTTP errors, APIError, are answers, not losses).
ENGINE_LOST = (requests.exceptions.ConnectionError, requests.exceptions.Timeout,
               requests.exceptions.ChunkedEncodingError)
MAX_TASK_LOG_LINE = 4000  # a case's log line in the task log; the log file keeps it whole


def docker_time(value: str | None) -> str | None:
    """Docker's RFC 3339 nano timestamps -> ISO 8601 with microseconds (None for the zero time)."""
    if not value or value.startswith("0001-"):
        return None
    head, _, frac = value.rstrip("Z").partition(".")
    frac = "".join(ch for ch in frac if ch.isdigit())[:6].ljust(6, "0")
    return datetime.fromisoformat(f"{head}.{frac}").replace(tzinfo=timezone.utc).isoformat()


def start_error_class(exc: APIError) -> str:
    """Name what Docker refused at container create/start."""
    text = str(exc)
    if "could not select device driver" in text or "nvidia-container-cli" in text:
        return "no_gpu_runtime"
    if isinstance(exc, NotFound) or "No such image" in text:
        return "image_not_found"
    return "container_config"


def case_kwargs(plan, validations: list, prepared: list, host: str | None = None) -> list[dict]:
    """Per-case arguments for a host lane's mapped BenchmarkCaseOperator: only cases whose host and image are ready
    (a case that spans hosts runs in the `multinode` group instead)."""
    from fleetbench import capacity
    from fleetbench.hosts.devices import assign

    plan = RunPlan.load(plan)
    run = plan.run
    verdicts = by_host(HostVerdict.load(v) for v in validations if v)
    images = by_host(HostImages.load(p) for p in prepared if p)
    out = []
    for case in plan.cases:
        if (host is not None and case.host != host) or case.nodes > 1:  # cases across hosts: fleetbench.multinode
            continue
        v, planned = verdicts.get(case.host), plan.host(case.host)
        img = images[case.host].ready(case.image) if case.host in images else None
        if v is None or v.unfit or img is None or capacity.skipped(case):
            continue
        devices = assign(case, v.host_facts)
        if devices.skipped:  # collect stores it skipped, with the reason (fleetbench.measure.case_fields)
            continue
        out.append({
            "image": img["pinned_ref"],
            "command": case.command,
            "container_name": runs.container_name(run.dag_id, run.run_id, case.host, case.case_key),
            "docker_url": planned.docker_url,
            "docker_tls_conn_id": planned.docker_tls_conn_id,
            "api_version": images[case.host].api_version,  # the engine's, as the lane found it: no GET /version a case
            "labels": runs.case_labels(run.dag_id, run.run_id, case.host, case.case_key, case.timeout_s),
            "case": {"host": case.host, "case_key": case.case_key, "benchmark": case.benchmark, "harness": case.harness,
                     "harness_settings": case.harness_settings, "run_started_at": run.started_at},
            "num_gpus": case.num_gpus,
            "gpu_device_ids": list(devices.device_ids) if devices.device_ids else selected_device_ids(case, v),
            "timeout_s": case.timeout_s,
            "telemetry_period_s": case.telemetry_period_s,
            "log_dir": str(runs.case_log_dir(run.dag_id, run.run_id, case.host)),
            "container": _with_visible_devices(case.container, devices),
        })
    log.info("%d case(s) can run%s", len(out), f" on {host}" if host else "")
    return out


def _with_visible_devices(container: dict, devices) -> dict:
    """A MIG case's container also gets NVIDIA_VISIBLE_DEVICES with its MIG UUIDs: what the NVIDIA runtime sets from
    the device request, said explicitly, so an image's own `NVIDIA_VISIBLE_DEVICES=all` (NGC images have it) cannot
    widen it where the runtime reads the environment (legacy mode, the runtime as Docker's default)."""
    if not devices.mig_profile or not devices.device_ids:
        return container
    return {**container, "environment": {**(container.get("environment") or {}),
                                         "NVIDIA_VISIBLE_DEVICES": ",".join(devices.device_ids)}}


def selected_device_ids(case, verdict: HostVerdict) -> list[str] | None:
    """With gpu_selection device_ids: the host's first N GPUs by UUID (index when the UUID is unknown)."""
    if case.num_gpus == 0 or case.container.get("gpu_selection") != "device_ids":
        return None
    gpus = sorted(verdict.facts.get("gpus") or [], key=lambda g: g["index"])[: case.num_gpus]
    return [g.get("uuid") or str(g["index"]) for g in gpus] or None


def all_items(seq) -> list:
    """All items of a mapped task's results in one request (iterating probes past the end, one call per item)."""
    return list(seq[:]) if seq is not None else []


class LaneCasesOperator(BaseOperator):
    """`host_<name>.cases`, a host lane's first task: the host is validated, its images pulled and pinned on its
    engine, then its runnable cases are returned, the map source of the lane's `run_case`. The verdict and the
    images go to XCom under the keys `validation` and `images`, which `store` and `multinode.cases` read.
    A host without a `queue` has its lane on the default queue; one with a `queue` (topology b) on that
    host's worker, whose engine is its own socket.

    One task per host before its cases, not three (a host check and an image step mapped over the hosts,
    then the lane): fewer tasks to schedule per run, and every lane runs on its own, so a slow host's pull
    holds no other host's cases. Built for fleets of 1,000 hosts (1,000 of these in one DAG), where every
    per-task cost at parse time counts: a plain operator rather than a `@task` function, and one dependency
    edge. The plan is resolved when the task runs rather than templated (a rendered field is serialized for
    the UI: the whole plan, per lane); the DAG sets the plan task upstream of it. A dry run stops after the
    verdict; a run without a case on the host does nothing. `host_check_timeout_s` bounds the host check
    (its verdict then says it did not end), not the pull.
    """

    def __init__(self, *, host: str, plan: Any, host_check_timeout_s: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.host = host
        self.plan_ref = plan
        self.host_check_timeout_s = host_check_timeout_s

    def execute(self, context) -> list[dict]:
        freeze_startup_objects()  # fleetbench.airflow.task_gc
        # read once: each step below takes the model as it is (validated four times, a 1,000-host night's plan took
        # each lane 6.7 s and ~500 MiB)
        ti = context["ti"]
        plan = RunPlan.load(self.render_template(self.plan_ref, context))
        host = pipeline.planned_host(plan, self.host)
        if host is None:
            log.info("the run has no case on %s", self.host)
            return []
        plan = pipeline.plan_cases(plan, ti, [self.host], plan_task_id(self.plan_ref))  # its host's cases only
        validation = pipeline.validate_host(host, plan.run, timeout_s=self.host_check_timeout_s)
        ti.xcom_push(key=LANE_VALIDATION, value=validation)
        if not pipeline.proceed(plan, [validation]):
            return []
        images = pipeline.prepare_host_images(host, [validation], pipeline.needed_images(plan, self.host, validation))
        ti.xcom_push(key=LANE_IMAGES, value=images)
        return case_kwargs(plan, [validation], [images], host=self.host)


LANE_VALIDATION, LANE_IMAGES = "validation", "images"


def plan_task_id(plan_ref) -> str:
    """The task that made the plan (its XComArg's), whose XComs hold the case slices."""
    operator = getattr(plan_ref, "operator", None)
    return getattr(operator, "task_id", None) or "plan"


def container_settings(container: dict) -> dict:
    """A case's ContainerSpec (plain data) -> DockerOperator arguments, plus `ulimit_map` and `cpu_limit` (ours)."""
    return {
        "network_mode": container.get("network_mode", "none"),
        "shm_size": container.get("shm_size"),
        "ipc_mode": container.get("ipc_mode"),
        "ulimit_map": container.get("ulimits") or {},
        "mem_limit": container.get("mem_limit"),
        "cpu_limit": container.get("cpus"),
        "environment": container.get("environment") or {},
        "mounts": [{"source": m["source"], "target": m["target"], "type": "bind", "read_only": m.get("read_only", True)}
                   for m in container.get("mounts") or []],
    }


# Past its case's timeout_s, a case task has this long to stop the container, keep its log and say so.
EXECUTION_GRACE_S = 300


def case_execution_timeout(given: timedelta | None, timeout_s: int, grace_s: float | None) -> timedelta | None:
    """A case task's execution_timeout: with `grace_s` (the DAG's case tasks), its own case's timeout_s as the run's
    plan has it, and the grace. The DAG's own (its longest case's, from the config as each task parses it) changed
    with the config: lowered during a night, it killed the rest of the night's longer cases, each twice with its
    retry. Without `grace_s`, the given one."""
    return given if grace_s is None else timedelta(seconds=timeout_s + grace_s)


class BenchmarkCaseOperator(DockerOperator):
    template_fields = tuple(DockerOperator.template_fields)

    def __init__(self, *, case: dict | None = None, timeout_s: int = 3600, log_dir: str | None = None,
                 num_gpus: int = 0, gpu_device_ids: list[str] | None = None, ulimit_map: dict[str, int] | None = None,
                 cpu_limit: float | None = None, telemetry_period_s: float = 0, docker_tls_conn_id: str | None = None,
                 container: dict | None = None, execution_grace_s: float | None = None, **kwargs: Any) -> None:
        if container is not None:  # the case's ContainerSpec (plain data): its docker run settings
            settings = container_settings(container)
            ulimit_map = settings.pop("ulimit_map")
            cpu_limit = settings.pop("cpu_limit")
            kwargs = {**settings, **kwargs}
        kwargs.setdefault("auto_remove", "never")
        kwargs.setdefault("mount_tmp_dir", False)
        kwargs.setdefault("network_mode", "none")
        kwargs.setdefault("force_pull", False)
        # The engine keeps at most this much of a case's log (json-file rotation): a runaway harness cannot
        # fill the host's disk; the saved log file holds what the engine kept.
        kwargs.setdefault("log_opts_max_size", CASE_LOG_MAX_SIZE)
        kwargs.setdefault("log_opts_max_file", CASE_LOG_MAX_FILES)
        super().__init__(**kwargs)
        self.case = case or {}
        self.timeout_s = timeout_s
        self.execution_timeout = case_execution_timeout(self.execution_timeout, timeout_s, execution_grace_s)
        self.log_dir = log_dir
        self.num_gpus = num_gpus
        self.gpu_device_ids = gpu_device_ids
        self.ulimit_map = ulimit_map or {}
        self.cpu_limit = cpu_limit
        self.telemetry_period_s = telemetry_period_s
        # A remote engine over TLS (tcp://host:2376): the Airflow Connection with CA, client cert and key.
        self.docker_tls_conn_id = docker_tls_conn_id
        self._tls: dict | None = None
        self._killed = False
        self._killed_outcome: dict | None = None  # what on_kill recorded, pushed from the main thread
        self._ti = None
        self._execution_timeout = False
        self._started_at: datetime | None = None

    # -- Airflow entry points -------------------------------------------------------------
    def execute(self, context: Any) -> dict:
        freeze_startup_objects()  # fleetbench.airflow.task_gc
        self._ti = context.get("ti") if hasattr(context, "get") else None
        self._normalize_mounts()
        # JSON-able settings from the plan -> docker SDK types (-1 = unlimited, soft = hard).
        self.ulimits = [Ulimit(name=name, soft=value, hard=value) for name, value in self.ulimit_map.items()]
        if self.gpu_device_ids:
            self.device_requests = [DeviceRequest(device_ids=list(self.gpu_device_ids), capabilities=[["gpu"]])]
        elif self.num_gpus:
            self.device_requests = [DeviceRequest(count=self.num_gpus, capabilities=[["gpu"]])]
        # TLS: the connection's certificates as files for as long as the case runs; `cli` uses them.
        try:
            with docker_tls_files(self.docker_tls_conn_id) as self._tls:
                return self.run_case()
        except AirflowTaskTimeout:  # the task runner calls on_kill next: it says why
            self._execution_timeout = True
            raise

    def render_template(self, content: Any, context: Any, jinja_env: Any = None, seen_oids: Any = None) -> Any:
        """The case's fields are data (the fleet config and the run's parameters, through the plan), not Jinja
        templates: they reach Docker as written. Rendered, as DockerOperator's fields are, a `container.mounts`
        source or an `environment` value ending in `.sh` or `.env` would be looked up as a template file
        (TemplateNotFound: the case task fails before its container exists), `${#list}` would be an unclosed
        Jinja comment and `{{ ... }}` would be evaluated. The fields stay in `template_fields`, so the UI still
        shows them. (Only the values mapped in from the lane's XCom were left alone before; the container
        settings built from them were rendered, one Jinja compile per string, ~10 ms a case.)"""
        return content

    @cached_property
    def cli(self) -> APIClient:
        """The engine's client: DockerOperator's hook, or over TLS one with the Airflow Connection's certificates."""
        if not self._tls:
            return without_environment(self.hook.api_client)
        from fleetbench.engines import docker_api_client

        return docker_api_client(self.docker_url, self._tls, timeout=self.timeout, version=self.api_version)

    def on_kill(self) -> None:
        """The task was killed (Airflow's SIGTERM: marked failed or cleared in the UI, the CLI; or its
        execution_timeout): record the case as killed, kill and remove the container in one call, then measure.

        In that order and without a stop grace: Airflow's supervisor follows its SIGTERM with SIGKILL
        5 s later, and a case's outcome must be on disk and its container gone by then. The outcome goes to disk
        unmeasured first (collect measures such a file itself) and is measured after the removal: reading a log of
        ~100 MB takes longer than those 5 s, and the container must not outlive the task on the GPUs."""
        self._killed = True
        if self.case.get("case_key") and self.log_dir:
            log_path, _ = self._paths()
            if not log_path.exists():  # what the case printed until it was killed
                try:
                    self._live_path().replace(log_path)
                except OSError:
                    pass
            why = (f"the task's execution_timeout of {self.execution_timeout} passed" if self._execution_timeout
                   else "the task was killed from Airflow (UI or CLI) while the case ran")
            now = datetime.now(timezone.utc)
            started = self._started_at or now
            self._killed_outcome = {**self._blank_outcome(), "killed_by_airflow": True, "error": why,
                                    "started_at": started.isoformat(), "finished_at": now.isoformat(),
                                    "duration_s": round((now - started).total_seconds(), 3)}
            self._write_outcome(self._killed_outcome)
        if self.container is not None:
            self.log.info("task killed: killing and removing container %s", self.container["Id"][:12])
            self._remove(self.container["Id"], stop_first=False)
        elif self.container_name:  # killed while it was being created: gone by name if it exists (run_case checks too)
            self._remove(self.container_name, stop_first=False)
        if self._killed_outcome is not None:
            self._finish(self._killed_outcome)
            if self._execution_timeout:  # the task runner calls on_kill from its main thread after the timeout
                runs.push_killed_outcome(self._ti, self._killed_outcome, self.log)

    # -- the run loop ---------------------------------------------------------------------
    def _paths(self) -> tuple[Path, Path]:
        return case_log_path(self.log_dir, self.case["case_key"]), outcome_path(self.log_dir, self.case["case_key"])

    def _blank_outcome(self) -> dict[str, Any]:
        log_path, _ = self._paths()
        return {
            "host": self.case["host"], "case_key": self.case["case_key"], "image": self.image,
            "container_name": self.container_name, "command": list(self.command or []),
            "gpu_device_ids": self.gpu_device_ids, "exit_code": None, "oom_killed": False, "timed_out": False,
            "killed_by_airflow": False, "start_error_class": None, "error": None, "log_path": str(log_path),
            "started_at": None, "finished_at": None, "duration_s": None, "rapl": None,
            "peak_mem_mib": None, "peak_mem_source": None, "run_started_at": self.case.get("run_started_at"),
        }

    def _write_outcome(self, outcome: dict) -> None:
        """The outcome also goes to a file next to the log: collect reads it when the task died before returning."""
        _, path = self._paths()
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(outcome, indent=1))
        tmp.replace(path)

    def _finish(self, outcome: dict) -> None:
        """Measure on this worker, where the log is (collect then needs no shared folder), and keep the outcome file."""
        from fleetbench.measure import measure

        fields, steps = measure({"command": outcome["command"], "harness": self.case.get("harness"),
                                 "harness_settings": self.case.get("harness_settings")}, outcome)
        outcome["measurement"] = Measurement(fields=fields, steps=steps).to_xcom()
        CaseOutcome.load(outcome)  # the shape collect reads (fleetbench.run_model); raises on a field it does not know
        self._write_outcome(outcome)

    def run_case(self) -> dict:
        log_path, outcome_path = self._paths()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        outcome_path.unlink(missing_ok=True)  # an earlier try's outcome (or an earlier execution's) is not this try's
        log_path.unlink(missing_ok=True)  # nor its log, which a kill before this try's own would leave in place
        outcome = self._blank_outcome()
        t0 = self._started_at = datetime.now(timezone.utc)
        rapl = None
        try:
            self._connect()
            if self.telemetry_period_s:  # the wrapper, from its volume on the engine (made once per version)
                self.mounts = [*self.mounts, telemetry.volume_mount(self.cli)]
            self._end_if_killed(None)
            self._remove_orphans()
            self.container = self._create_container()
            cid = self.container["Id"]
            self._end_if_killed(cid)
            rapl = self._rapl_start(outcome)
            self.cli.start(cid)
            self._end_if_killed(cid, rapl)
        except ENGINE_LOST as exc:  # the engine did not answer before the case ran: retried, and said if it stays so
            if rapl is not None:
                rapl.stop()
            now = datetime.now(timezone.utc)
            outcome.update(engine_unreachable=True, started_at=t0.isoformat(), finished_at=now.isoformat(),
                           duration_s=0.0, error=f"the Docker engine at {self.docker_url} did not answer before the "
                                                 f"case started: {exc}")
            self.log.error("case %s: %s", self.case["case_key"], outcome["error"])
            log_path.write_text(f"fleetbench: {outcome['error']}\n")
            self._finish(outcome)  # the outcome file: the row's class if the task's retry cannot reach it either
            raise
        except APIError as exc:
            if rapl is not None:
                rapl.stop()
            if self._killed:  # on_kill removed the container under create or start: it recorded the case
                self._end_if_killed(self.container["Id"] if self.container is not None else None)
            outcome["start_error_class"] = start_error_class(exc)
            outcome["error"] = ((telemetry.no_python_detail(str(exc), self.image, self.case.get("benchmark"))
                                 if self.telemetry_period_s else None) or str(exc))
            self.log.error("case %s could not start: %s", self.case["case_key"], exc)
            log_path.write_text(f"fleetbench: container could not start: {exc}\n")
            if self.container is not None:
                self._remove(self.container["Id"], stop_first=False)
            outcome["started_at"] = outcome["finished_at"] = t0.isoformat()
            outcome["duration_s"] = 0.0
            self._finish(outcome)
            return outcome

        streamer = threading.Thread(target=self._stream_logs, args=(cid,), daemon=True)
        streamer.start()
        # The container's peak memory (cgroup, or the engine's stats for a remote engine): fleetbench.capacity.
        memory = PeakMemory(self.cli, cid, local=self._local_engine()).start()
        waited_from = time.monotonic()
        try:
            try:
                result = self.cli.wait(cid, timeout=self.timeout_s)
                outcome["exit_code"] = result.get("StatusCode")
            except APIError:  # e.g. on_kill removed the container first
                if not self._killed:
                    raise
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                # docker-py reports a wait past its deadline as ReadTimeout, or on a unix socket as a
                # ConnectionError ("Read timed out"): a timeout only when the deadline has passed.
                if time.monotonic() - waited_from < self.timeout_s * 0.98:
                    raise
                outcome["timed_out"] = True
                self.log.error("case %s passed its timeout of %d s: stopping the container", self.case["case_key"],
                               self.timeout_s)
                self.cli.stop(cid, timeout=STOP_GRACE_S)
            if rapl is not None:
                outcome["rapl"] = rapl.stop()
            if self._killed:  # on_kill recorded the case and removed its container: the task fails, as killed
                runs.push_killed_outcome(self._ti, self._killed_outcome, self.log)
                raise AirflowException(f"case {self.case['case_key']} was killed from Airflow; its outcome is recorded")
            state = self.cli.inspect_container(cid)["State"]
            outcome["oom_killed"] = bool(state.get("OOMKilled")) or (
                state.get("ExitCode") == 137 and not outcome["timed_out"] and self._oom_event(cid, state))
            if outcome["exit_code"] is None:
                outcome["exit_code"] = state.get("ExitCode")
            outcome["started_at"] = docker_time(state.get("StartedAt")) or t0.isoformat()
            outcome["finished_at"] = docker_time(state.get("FinishedAt")) or datetime.now(timezone.utc).isoformat()
            outcome["duration_s"] = round(
                (datetime.fromisoformat(outcome["finished_at"])
                 - datetime.fromisoformat(outcome["started_at"])).total_seconds(), 3)
            self._save_log(cid, log_path)
            streamer.join(timeout=5)
            self._live_path().unlink(missing_ok=True)
        except ENGINE_LOST as exc:  # the engine stopped answering mid-case
            self._engine_lost(outcome, exc, time.monotonic() - waited_from, t0, log_path)
        finally:
            if rapl is not None:
                rapl.stop()  # idempotent: ends its sampling thread however the case ended
            outcome["peak_mem_mib"], outcome["peak_mem_source"] = memory.stop()
            # An exited container needs no stop (one API round trip less per case); anything else is stopped first.
            self._remove(cid, stop_first=outcome["finished_at"] is None or outcome.get("engine_unreachable", False))
        self._finish(outcome)
        self.log.info("case %s: exit %s%s%s in %.1f s; log %s", self.case["case_key"], outcome["exit_code"],
                      ", OOM-killed" if outcome["oom_killed"] else "", ", timed out" if outcome["timed_out"] else "",
                      outcome["duration_s"] or 0.0, log_path)
        return outcome

    def _connect(self) -> None:
        """The engine's client, made here. An engine it cannot reach is an engine lost before the case for `run_case`
        (a `requests` ConnectionError): DockerHook says so with an AirflowException (its ping or version query
        failed) or the ping's own ConnectionError, the TLS client's version query with a DockerException.

        With `api_version` (the engine's, from the lane's check: `case_kwargs`) the client asks the engine nothing
        before its ping, where `auto` costs a `GET /version` a case (~5-8 ms of the engine's time locally: it asks its
        runtimes for their versions; a round trip more to a remote engine). An engine that refuses that version (it
        was up- or downgraded since the lane's check) gets a client that asks it for its own."""
        try:
            try:
                self._open_client()
            except APIError as exc:
                if not (self.api_version and version_refused(exc)):
                    raise
                self.log.warning("the Docker engine at %s refused API version %s, which the lane's check found there; "
                                 "asking it for its own: %s", self.docker_url, self.api_version, exc)
                self.api_version = None
                refused = self.__dict__.pop("cli", None)
                if self._tls and refused is not None:  # the TLS client is this operator's own (else: the hook's)
                    refused.close()
                self.__dict__.pop("hook", None)  # cached_property: made again with the version asked
                self._open_client()
        except AirflowException as exc:
            raise requests.exceptions.ConnectionError(f"{exc} (see the warning above)") from exc
        except APIError:
            raise
        except DockerException as exc:  # the TLS client's version query went unanswered
            raise requests.exceptions.ConnectionError(f"the Docker engine at {self.docker_url} did not answer: "
                                                      f"{exc}") from exc

    def _open_client(self) -> None:
        cli = self.cli
        if self._tls and self.api_version:  # DockerHook pings; the TLS client asks nothing until the case's first call
            cli.ping()

    def _end_if_killed(self, cid: str | None, rapl: RaplMeter | None = None) -> None:
        """The task was killed (on_kill ran) before its container was there to remove, or before it started:
        Airflow's SIGTERM handler returns to this code, and its SIGKILL 5 s later would leave a container that
        was created or started after on_kill running on the host's GPUs. Remove it, and end as killed (on_kill
        recorded the outcome)."""
        if not self._killed:
            return
        if rapl is not None:
            rapl.stop()
        if cid is not None:
            self._remove(cid, stop_first=False)
        runs.push_killed_outcome(self._ti, self._killed_outcome, self.log)
        raise AirflowException(f"case {self.case['case_key']} was killed from Airflow before it ran; its outcome is "
                               "recorded")

    def _rapl_start(self, outcome: dict) -> RaplMeter | None:
        """A CPU case on this machine's engine: its CPU energy from the host's RAPL counters, from here to the
        container's end. Otherwise, or when the counters cannot be read, `outcome["rapl"]` says why (the
        energy is then estimated from the CPU's TDP and the container's CPU time)."""
        if self.num_gpus:
            return None
        if not str(self.docker_url or "").startswith("unix://"):
            outcome["rapl"] = {"reason": f"the Docker engine {self.docker_url} is on another machine: RAPL is read "
                                         "only where the engine runs"}
            return None
        try:
            return RaplMeter.start()
        except RaplUnavailable as exc:
            outcome["rapl"] = {"reason": str(exc)}
            return None

    def _engine_lost(self, outcome: dict, exc: Exception, after_s: float, t0: datetime, log_path: Path) -> None:
        """Record a case whose engine stopped answering: `engine_unreachable`, with what it printed until then."""
        now = datetime.now(timezone.utc)
        outcome["engine_unreachable"] = True
        outcome["error"] = (f"the Docker engine at {self.docker_url} stopped answering {after_s:.0f} s "
                            f"into the case: {exc}")
        outcome["started_at"] = outcome["started_at"] or t0.isoformat()
        outcome["finished_at"] = now.isoformat()
        outcome["duration_s"] = round((now - t0).total_seconds(), 3)
        self.log.error("case %s: %s", self.case["case_key"], outcome["error"])
        try:
            self._live_path().replace(log_path)
        except OSError:
            pass
        with log_path.open("ab") as f:
            f.write(f"\nfleetbench: {outcome['error']}\n".encode())

    def _oom_event(self, cid: str, state: dict) -> bool:
        """The engine logged an `oom` event for the container. Docker 20.10 sets State.OOMKilled from whichever of
        the OOM and exit notifications comes last, so a container killed at its memory limit can read
        `OOMKilled: false`, exit 137; its event log still has the `oom`. The events are asked for between the
        container's own StartedAt and FinishedAt: the engine's clock, by which it filters them (the worker's may be
        hours off a remote engine's: no event was found, or the query waited until the worker's `until` came)."""
        started, finished = docker_time(state.get("StartedAt")), docker_time(state.get("FinishedAt"))
        until = datetime.fromisoformat(finished).timestamp() if finished else engine_now(self.cli)
        since = datetime.fromisoformat(started).timestamp() if started else until - self.timeout_s - 60
        try:
            events = self.cli.events(since=int(since) - 1, until=int(until) + 2, decode=True,
                                     filters={"container": cid, "event": "oom"})
            try:
                return any(e.get("status") == "oom" or e.get("Action") == "oom" for e in events)
            finally:
                events.close()
        except (APIError, requests.exceptions.RequestException) as exc:
            self.log.warning("case %s: the engine's events could not be read: %s", self.case["case_key"], exc)
            return False

    def _local_engine(self) -> bool:
        """The engine runs on this machine (a unix socket): its containers' cgroups can be read here."""
        return str(self.docker_url or "").startswith("unix://") and not self._tls

    def _live_path(self) -> Path:
        log_path, _ = self._paths()
        return log_path.with_suffix(".live.log")

    def _save_log(self, cid: str, log_path: Path) -> None:
        """The container's whole log, streamed to the file in chunks (never held in memory whole)."""
        tmp = log_path.with_suffix(".log.tmp")
        with tmp.open("wb") as f:
            for chunk in self.cli.logs(cid, stdout=True, stderr=True, stream=True, follow=False):
                f.write(chunk)
        tmp.replace(log_path)

    # -- pieces -----------------------------------------------------------------------------
    def _create_container(self) -> dict:
        log_config = {k: v for k, v in (("max-size", self.log_opts_max_size), ("max-file", self.log_opts_max_file))
                      if v is not None}
        command = self.format_command(self.command)
        if self.telemetry_period_s:  # the wrapper runs the harness as its child and passes everything through
            command = telemetry.wrap_command(list(command), self.telemetry_period_s, gpu=bool(self.num_gpus))
        settings = dict(
            command=command,
            name=self.container_name,
            environment={**self.environment, **self._private_environment},
            host_config=self.cli.create_host_config(
                auto_remove=False,
                mounts=self.mounts,
                network_mode=self.network_mode,
                shm_size=self.shm_size,
                cpu_shares=round(self.cpus * 1024),
                nano_cpus=int(self.cpu_limit * 1e9) if self.cpu_limit else None,
                mem_limit=self.mem_limit,
                cap_add=self.cap_add,
                privileged=self.privileged,
                device_requests=self.device_requests,
                log_config=LogConfig(config=log_config),
                ipc_mode=self.ipc_mode,
                ulimits=self.ulimits,
            ),
            image=self.image,
            user=self.user,
            entrypoint=self.format_command(self.entrypoint),
            working_dir=self.working_dir,
            tty=self.tty,
            hostname=self.hostname,
            labels=self.labels,
        )
        try:
            return self.cli.create_container(**settings)
        except APIError as exc:
            # The name is taken: an earlier try's container (a retry, a task cleared in the UI) is still there.
            # Removed only then, rather than looked up before every case (a round trip each).
            if exc.status_code != 409 or not self.container_name:
                raise
        self._remove_stale_container()
        return self.cli.create_container(**settings)

    def _stream_logs(self, cid: str) -> None:
        """Copy the container's output into the task log and the case's log file as it comes (best effort):
        when the engine is lost mid-case, that file is the case's log; otherwise `_save_log` writes the
        engine's whole log and the live copy goes."""
        try:
            with self._live_path().open("wb") as f:
                for chunk in self.cli.logs(cid, stream=True, follow=True):
                    f.write(chunk)
                    f.flush()
                    for line in chunk.decode(errors="replace").splitlines():
                        self.log.info("%s", line[:MAX_TASK_LOG_LINE])
        except Exception as exc:  # the container may be gone already: the saved log file is authoritative
            self.log.debug("log stream ended: %s", exc)

    def _remove_orphans(self) -> None:
        """Another case of this run and host whose container still runs: its task died with it (a worker SIGKILLed,
        an engine that came back) and waits for its retry, while Airflow already starts the lane's next case, which
        would share the GPUs with it (an understated throughput, a gpu_oom taken as an OOM on record). A lane runs
        its cases one at a time, so any such container is an orphan: removed before this case starts (its retry
        runs the case again). One listing per case (~1 ms)."""
        keys, labels = [runs.label(k) for k in ("dag_id", "run_id", "host")], self.labels or {}
        if not all(labels.get(k) for k in keys):
            return
        mine = self.case.get("case_key")
        try:
            listed = self.cli.containers(all=True, filters={"label": [f"{k}={labels[k]}" for k in keys]})
        except APIError as exc:  # best effort: an engine that refuses the listing is the create's to name
            self.log.warning("could not list this run's containers on the host before the case: %s", exc)
            return
        for c in listed:
            if (c.get("Labels") or {}).get(runs.label("case_key")) != mine:
                self.log.warning("removing container %s of case %s of this run on this host: its task died and left "
                                 "it %s, and it would share the host's GPUs with this case", c["Id"][:12],
                                 (c.get("Labels") or {}).get(runs.label("case_key")), c.get("State") or "there")
                self._remove(c["Id"], stop_first=False)

    def _remove_stale_container(self) -> None:
        if not self.container_name:
            return
        try:
            stale = self.cli.inspect_container(self.container_name)
        except NotFound:
            return
        self.log.warning("removing container %s left by an earlier try", self.container_name)
        self._remove(stale["Id"], stop_first=True)

    def _remove(self, cid: str, stop_first: bool) -> None:
        for attempt in range(3):
            try:
                if stop_first:
                    try:
                        self.cli.stop(cid, timeout=STOP_GRACE_S)
                    except NotFound:
                        return
                self.cli.remove_container(cid, force=True)
                return
            except NotFound:
                return
            except (APIError, requests.exceptions.RequestException) as exc:  # a 409 "removal in progress", or no engine
                self.log.warning("removing container %s failed (attempt %d): %s", cid[:12], attempt + 1, exc)
                time.sleep(0.5 * (attempt + 1))
        self.log.error("container %s could not be removed; maintenance (fleetbench_maintenance) removes it once "
                       "its engine answers again", cid[:12])
