"""The steps of one fleet_benchmark run, as plain functions over plain data.

The DAG file wires these into tasks; each takes and returns JSON-able dicts (small enough for
XCom; raw logs and probe outputs stay in files under the run's artifact folder). Keeping them free
of Airflow's context makes every step testable on its own.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime, timezone
from pathlib import Path

from fleetbench import __version__
from fleetbench.collect import FAILED, OK, SKIPPED
from fleetbench.config import GB, FleetConfig, load_config
from fleetbench.paths import artifacts_dir, default_config_path
from fleetbench.plan import expand_cases

log = logging.getLogger(__name__)

LABEL_PREFIX = "org.fleetbench"
# Host checks and log parsing are imported where they run, not when the DAG file is parsed: the
# dag-processor re-parses it every few minutes.
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_name(text: str) -> str:
    return _UNSAFE.sub("_", text).strip("_.-")[:120] or "x"


def run_dir(dag_id: str, run_id: str) -> Path:
    return artifacts_dir() / safe_name(dag_id) / safe_name(run_id)


def run_token(dag_id: str, run_id: str) -> str:
    """Short stable id of a DAG run, used in container names."""
    return hashlib.sha256(f"{dag_id}\0{run_id}".encode()).hexdigest()[:10]


# -- plan -------------------------------------------------------------------------------------
def make_plan(run: dict, config_path: str | None = None, params: dict | None = None) -> dict:
    """Read the fleet config, apply the run's parameters, expand the cases.

    `run` holds dag_id, run_id, logical_date, run_type. The plan is logged as a table (what a dry run shows).
    """
    from fleetbench.params import apply_params

    path = Path(config_path or default_config_path())
    cfg = apply_params(load_config(path), params)
    cases = expand_cases(cfg)
    if not cases:
        raise ValueError(f"{path}: the plan has no cases (check benchmarks[*].hosts)")
    hosts = []
    for host in cfg.hosts:
        host_cases = [c for c in cases if c.host == host.name]
        if not host_cases:
            continue
        image_names = sorted({c.image for c in host_cases})
        cudas = [cfg.image(n).cuda for n in image_names if cfg.image(n).cuda]
        hosts.append({
            **host.model_dump(mode="json"),
            "needs": {"gpus": max(c.num_gpus for c in host_cases), "image_cuda": max(cudas, key=_vkey) if cudas else None},
            "images": [cfg.image(n).model_dump(mode="json") for n in image_names],
        })
    log.info("plan: %d case(s) on %d host(s) from %s%s\n%s", len(cases), len(hosts), path,
             " (dry run: nothing will be pulled, run or stored)" if (params or {}).get("dry_run") else "",
             plan_table([c.to_dict() for c in cases]))
    return {
        "run": {**run, "fleet": cfg.fleet.name, "config_digest": cfg.digest(), "config_path": str(path),
                "started_at": datetime.now(timezone.utc).isoformat(), "fleetbench_version": __version__,
                "dry_run": bool((params or {}).get("dry_run")), "params": params or {},
                "fleet_settings": cfg.fleet.model_dump(mode="json")},
        "hosts": hosts,
        "cases": [c.to_dict() for c in cases],
    }


def plan_table(cases: list[dict]) -> str:
    head = ("host", "case_key", "image", "command")
    rows = [head] + [(c["host"], c["case_key"], c["image"], " ".join(c["command"])) for c in cases]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r[:3], widths)) + "  " + r[3] for r in rows)


def central_hosts(plan: dict) -> list[dict]:
    """The planned hosts whose validation and image preparation run on the default queue (central workers):
    those without a `queue` of their own (fleet topology a, or a single machine)."""
    return [h for h in plan["hosts"] if not h.get("queue")]


def planned_host(plan: dict, name: str) -> dict | None:
    """The host as planned for this run; None when the run has no case on it (e.g. a `hosts` parameter)."""
    return next((h for h in plan["hosts"] if h["name"] == name), None)


def proceed(plan: dict, validations: list[dict]) -> bool:
    """False for a dry run: log the verdicts and stop before anything is pulled or run."""
    if not plan["run"].get("dry_run"):
        return True
    for v in validations:
        if v:
            log.info("dry run: host %s is %s%s", v["host"], v["verdict"], f" ({v['reasons']})" if v["reasons"] else "")
    log.info("dry run: %d case(s) planned; stopping here", len(plan["cases"]))
    return False


def _vkey(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


# -- Docker engines over TLS (fleet topology a: central workers, remote engines) -------------
TLS_FILES = {"ca_cert": "ca.pem", "client_cert": "cert.pem", "client_key": "key.pem"}  # DOCKER_CERT_PATH layout


@contextmanager
def docker_tls_files(conn_id: str | None) -> Iterator[dict | None]:
    """The CA, client certificate and key of the Airflow Connection `conn_id` as files, while the block runs.

    The connection's extra holds `ca_cert`, `client_cert` and `client_key`, each a PEM string or the
    path of a PEM file on the worker, and optionally `verify` (default true: the engine's certificate
    must be signed by `ca_cert` and name the host of `docker_url`). They are copied into a private
    temporary folder (0700, files 0600) named like Docker's DOCKER_CERT_PATH (ca.pem, cert.pem,
    key.pem), so docker-py and the docker CLI use the same files; the folder is removed afterwards.
    Yields None without a conn_id, else {"cert_path", "ca_cert", "client_cert", "client_key", "verify"}.
    A missing connection or field raises ValueError naming the connection and the field, never a value.
    """
    if not conn_id:
        yield None
        return
    from airflow.sdk import BaseHook

    extra = BaseHook.get_connection(conn_id).extra_dejson
    missing = [k for k in TLS_FILES if not extra.get(k)]
    if missing:
        raise ValueError(f"Airflow connection {conn_id!r} lacks {', '.join(missing)} in its extra "
                         f"(PEM text or a file path each) for a TLS Docker engine")
    folder = Path(tempfile.mkdtemp(prefix="fleetbench-tls-"))  # mkdtemp: mode 0700
    try:
        for key, name in TLS_FILES.items():
            value = str(extra[key])
            if "-----BEGIN" in value:
                if key == "client_key":
                    _mask(value)
                pem = value
            else:
                try:
                    pem = Path(value).read_text()
                except OSError as exc:
                    raise ValueError(f"Airflow connection {conn_id!r}: {key} file cannot be read: "
                                     f"{exc.strerror or exc}") from None
            path = folder / name
            path.touch(mode=0o600)
            path.write_text(pem if pem.endswith("\n") else pem + "\n")
        verify = str(extra.get("verify", True)).lower() not in ("false", "0", "no", "off")
        yield {"cert_path": str(folder), "verify": verify, **{k: str(folder / n) for k, n in TLS_FILES.items()}}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


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
        return docker.APIClient(base_url=docker_url, version=version or "auto", timeout=timeout)
    return _engine_tls_client()(base_url=docker_url, version=version or "auto", timeout=timeout, tls=docker_tls_config(tls))


@functools.cache
def _engine_tls_client():
    import docker

    class EngineTLSClient(docker.APIClient):
        trust_env = property(lambda self: False, lambda self, value: None)  # requests.Session sets True in __init__

    return EngineTLSClient


def docker_cli_env(docker_url: str, tls: dict | None) -> dict[str, str]:
    """Environment for the docker CLI (host probes) talking to `docker_url`, over TLS when `tls` is set."""
    env = {"DOCKER_HOST": docker_url}
    if tls:
        env["DOCKER_CERT_PATH"] = tls["cert_path"]
        env["DOCKER_TLS_VERIFY" if tls["verify"] else "DOCKER_TLS"] = "1"
    return env


def _mask(secret: str) -> None:
    """Keep a secret out of task logs (best effort outside a task)."""
    try:
        from airflow.sdk.log import mask_secret

        mask_secret(secret)
    except Exception:  # noqa: BLE001 - masking must never break the step
        pass


# -- validate host ----------------------------------------------------------------------------
def runner_for(host: dict, tls: dict | None = None):
    from fleetbench.hosts import LocalRunner

    if host.get("connection", "local") == "local":
        return LocalRunner(env={**os.environ, **docker_cli_env(host["docker_url"], tls)})
    from fleetbench.hosts.ssh import SSHRunner  # imports the SSH provider only when a fleet uses it

    return SSHRunner(host["connection"])


def validate_host(host: dict, run: dict) -> dict:
    """Gather the host's facts into the run's artifact folder and judge them against the host's needs.

    When the host's cases need GPUs, a GPU smoke container runs too (`gpu_smoke_image`, else the
    host's first benchmark image). An unreachable host is a verdict (`reachable: fail`), not a crash.
    """
    from fleetbench.hosts import HostFacts, HostNeeds, evaluate, facts_from_dir, gather, reasons, verdict

    folder = run_dir(run["dag_id"], run["run_id"]) / "hosts" / safe_name(host["name"]) / "facts"
    needs = HostNeeds(gpus=host["needs"]["gpus"], image_cuda=host["needs"]["image_cuda"],
                      min_free_bytes=int(host.get("min_free_gb", 2.0) * GB))
    smoke_image = (host.get("gpu_smoke_image") or next((i["ref"] for i in host.get("images", [])), None)) if needs.gpus else None
    local = host.get("connection", "local") == "local"  # over SSH, docker runs on the host itself
    try:
        with docker_tls_files(host.get("docker_tls_conn_id") if local else None) as tls:
            gather(runner_for(host, tls), folder, gpu_smoke_image=smoke_image)
        facts = facts_from_dir(folder)
    except Exception as exc:  # e.g. the artifact folder cannot be written: still a verdict, with the reason
        log.exception("gathering facts on %s failed", host["name"])
        facts = HostFacts(unreachable=f"facts could not be gathered: {exc}")
    checks = evaluate(facts, needs)
    result = {
        "host": host["name"], "verdict": verdict(checks), "reasons": reasons(checks),
        "checks": [c.to_dict() for c in checks], "facts": facts.to_dict(), "facts_dir": str(folder),
        "collected_at": datetime.now(timezone.utc).isoformat(),
    }
    log.info("host %s: %s%s", host["name"], result["verdict"], f" ({result['reasons']})" if result["reasons"] else "")
    return result


# -- prepare image ----------------------------------------------------------------------------
def registry_auth(conn_id: str | None, registry: str) -> dict | None:
    """A Docker `auth_config` from an Airflow Connection (login, password, host[:port]) for `registry` (a
    normalised host[:port], `fleetbench.registry`); never logged. None when the connection names another
    registry: credentials go only to the registry host and port of their connection, compared as Docker
    does, whatever reference a run pulls."""
    if not conn_id:
        return None
    from airflow.sdk import BaseHook

    from fleetbench.registry import credentials_apply

    conn = BaseHook.get_connection(conn_id)
    server = f"{conn.host}:{conn.port}" if conn.host and conn.port else conn.host
    if not credentials_apply(server, registry):
        log.warning("connection %s is for registry %s, not %s: its credentials are not sent there",
                    conn_id, server, registry)
        return None
    return {"username": conn.login, "password": conn.password, **({"serveraddress": server} if server else {})}


def prepare_host_images(host: dict, validations: list[dict]) -> dict:
    """Check disk, pull, pin and (if configured) bake every image the host's cases need, on the host's own engine.

    Each image's result is `fleetbench.images.PreparedImage` as a dict: cases run its `pinned_ref`
    (the pulled digest, or the baked image's id); `digest` stays the pulled image's registry digest.
    """
    validation = _by_host(validations).get(host["name"])
    if validation is None or validation["verdict"] == "unfit":
        return {"host": host["name"], "images": {}, "skipped": True}
    from fleetbench.config import ImageSpec
    from docker.errors import DockerException

    from fleetbench.images import PreparedImage, prepare
    from fleetbench.registry import registry_of, server_host

    free_hint = (validation.get("facts") or {}).get("docker_root_free_bytes")
    images = {}
    with ExitStack() as stack:
        try:
            tls = stack.enter_context(docker_tls_files(host.get("docker_tls_conn_id")))
        except Exception as exc:  # a missing or incomplete TLS connection: the engine cannot be reached
            log.error("host %s: no TLS client configuration for %s: %s", host["name"], host["docker_url"], exc)
            return {"host": host["name"], "skipped": False, "images": {
                img["name"]: PreparedImage(img["name"], img["ref"], failure_class="docker_unreachable",
                                           error=f"TLS client configuration: {exc}").to_dict()
                for img in host["images"]}}
        try:
            api = docker_api_client(host["docker_url"], tls, timeout=600)
        except DockerException as exc:  # the engine did not answer (e.g. over TLS without a certificate it trusts)
            log.error("host %s: Docker engine %s not reachable: %s", host["name"], host["docker_url"], exc)
            return {"host": host["name"], "skipped": False, "images": {
                img["name"]: PreparedImage(img["name"], img["ref"], failure_class="docker_unreachable",
                                           error=f"Docker engine not reachable: {exc}").to_dict()
                for img in host["images"]}}
        stack.callback(api.close)
        for img in host["images"]:
            spec = ImageSpec.model_validate(img)
            try:
                auth = registry_auth(spec.credentials_conn_id, registry_of(spec.ref))
                push_auth = (registry_auth(spec.bake.push_conn_id, server_host(spec.bake.push_to))
                             if spec.bake and spec.bake.push_to else None)
            except Exception as exc:  # a missing or broken connection is a named failure, not a crash
                images[spec.name] = PreparedImage(spec.name, spec.ref, failure_class="registry_auth",
                                                  error=f"registry credentials: {exc}").to_dict()
                continue
            images[spec.name] = prepare(api, spec, auth_config=auth, push_auth_config=push_auth,
                                        free_bytes_hint=free_hint).to_dict()
    return {"host": host["name"], "images": images, "skipped": False}


# -- run cases --------------------------------------------------------------------------------
def pool_name(host: str) -> str:
    """The Airflow pool of a host's lane: one slot, so one benchmark at a time on the host's GPUs."""
    return f"fleetbench_{safe_name(host)}"


def pools(cfg: FleetConfig) -> dict:
    """`airflow pools import` JSON for every host of a fleet config."""
    return {pool_name(h.name): {"slots": 1, "description": f"fleetbench: one benchmark at a time on {h.name}",
                                "include_deferred": False} for h in cfg.hosts}


def case_kwargs(plan: dict, validations: list[dict], prepared: list[dict], host: str | None = None) -> list[dict]:
    """Per-case arguments for a host lane's mapped BenchmarkCaseOperator: only cases whose host and image are ready."""
    run = plan["run"]
    verdicts = _by_host(validations)
    images = {p["host"]: p["images"] for p in prepared if p}
    hosts = {h["name"]: h for h in plan["hosts"]}
    token = run_token(run["dag_id"], run["run_id"])
    out = []
    for case in plan["cases"]:
        if host is not None and case["host"] != host:
            continue
        v = verdicts.get(case["host"])
        img = images.get(case["host"], {}).get(case["image"])
        if v is None or v["verdict"] == "unfit" or img is None or img.get("failure_class"):
            continue
        out.append({
            "image": img["pinned_ref"],
            "command": case["command"],
            "container_name": safe_name(f"fb-{token}-{case['host']}-{case['case_key']}"),
            "docker_url": hosts[case["host"]]["docker_url"],
            "docker_tls_conn_id": hosts[case["host"]].get("docker_tls_conn_id"),
            "labels": {
                f"{LABEL_PREFIX}.managed": "true",
                f"{LABEL_PREFIX}.dag_id": run["dag_id"],
                f"{LABEL_PREFIX}.run_id": run["run_id"],
                f"{LABEL_PREFIX}.host": case["host"],
                f"{LABEL_PREFIX}.case_key": case["case_key"],
                f"{LABEL_PREFIX}.timeout_s": str(case["timeout_s"]),  # maintenance stops an orphan past it
            },
            "case": {"host": case["host"], "case_key": case["case_key"]},
            "num_gpus": case["num_gpus"],
            "gpu_device_ids": _device_ids(case, v),
            "timeout_s": case["timeout_s"],
            "telemetry_period_s": case.get("telemetry_period_s", 0),
            "log_dir": case_log_dir(run, case["host"]),
            **container_kwargs(case.get("container") or {}),
        })
    log.info("%d case(s) can run%s", len(out), f" on {host}" if host else "")
    return out


def case_log_dir(run: dict, host: str) -> str:
    return str(run_dir(run["dag_id"], run["run_id"]) / "hosts" / safe_name(host) / "cases")


def container_kwargs(container: dict) -> dict:
    """ContainerSpec (plain data) -> BenchmarkCaseOperator/DockerOperator arguments (still JSON-able)."""
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


def _device_ids(case: dict, validation: dict) -> list[str] | None:
    """With gpu_selection device_ids: the host's first N GPUs by UUID (index when the UUID is unknown)."""
    if case["num_gpus"] == 0 or (case.get("container") or {}).get("gpu_selection") != "device_ids":
        return None
    gpus = sorted(validation["facts"].get("gpus") or [], key=lambda g: g["index"])[: case["num_gpus"]]
    return [g.get("uuid") or str(g["index"]) for g in gpus] or None


def _outcome_from_file(run: dict, case: dict) -> dict | None:
    """The outcome a case's task wrote next to its log (e.g. when it was killed before returning)."""
    path = Path(case_log_dir(run, case["host"])) / f"{case['case_key']}.outcome.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# -- collect ----------------------------------------------------------------------------------
def collect(plan: dict, validations: list[dict], prepared: list[dict], outcomes: list[dict]) -> dict:
    """One classified row per planned case: measured, failed, or skipped with the reason. Nothing is dropped."""
    from fleetbench.collect import measure, not_run
    from fleetbench.hosts import HostFacts

    run = plan["run"]
    verdicts = _by_host(validations)
    images = {p["host"]: p["images"] for p in prepared if p}
    done = {(o["host"], o["case_key"]): o for o in outcomes if o}
    rows, step_rows = [], []
    for case in plan["cases"]:
        key = (case["host"], case["case_key"])
        v = verdicts.get(case["host"])
        img = images.get(case["host"], {}).get(case["image"]) or {}
        if v is None:
            fields, steps = not_run(FAILED, "host_check_failed", "host validation did not finish"), []
        elif v["verdict"] == "unfit":
            fields, steps = not_run(SKIPPED, "host_unfit", f"host {case['host']} is unfit: {v['reasons']}"), []
        elif img.get("failure_class"):
            fields, steps = not_run(FAILED, img["failure_class"], img.get("error") or "image not prepared"), []
        elif key in done or (outcome := _outcome_from_file(run, case)) is not None:
            fields, steps = measure(case, done.get(key) or outcome)
        else:
            fields, steps = not_run(FAILED, "task_failed", "the case's task failed before reporting (see its task log)"), []
        facts = HostFacts.from_dict(v["facts"]) if v else HostFacts()
        rows.append({
            "dag_id": run["dag_id"], "run_id": run["run_id"], "logical_date": run.get("logical_date"),
            "host": case["host"], "case_key": case["case_key"], "benchmark": case["benchmark"], "model": case["model"],
            "batch_size_per_device": case["batch_size_per_device"],
            "batch_size_global": case["batch_size_per_device"] * max(case["num_gpus"], 1),
            "num_gpus": case["num_gpus"], "variable_update": case["variable_update"], "device": case["device"],
            "num_batches": case["num_batches"], "image_name": case["image"],
            "image_ref": img.get("ref"), "image_digest": img.get("digest"),
            "driver_version": facts.driver_version, "cuda_driver_version": facts.cuda_driver_version,
            "gpu_model": facts.gpu_model,
            **fields,
        })
        step_rows += [{"dag_id": run["dag_id"], "run_id": run["run_id"], "host": case["host"],
                       "case_key": case["case_key"], **s} for s in steps]
    return {"rows": rows, "steps": step_rows}


# -- store ------------------------------------------------------------------------------------
def store(plan: dict, validations: list[dict], collected: dict) -> dict:
    from fleetbench.hosts import HostFacts
    from fleetbench.metrics import derive, load_catalog_or_none, settings_from_plan
    from fleetbench.warehouse import get_engine, store_run, upgrade

    run = plan["run"]
    # Derived metrics (training time, step spread, speedup, cost, energy) on every row before it is written.
    rows = derive(collected["rows"], collected["steps"], load_catalog_or_none(), settings_from_plan(plan))
    counts = {s: sum(1 for r in rows if r["status"] == s) for s in (OK, FAILED, SKIPPED)}
    run_row = {
        "dag_id": run["dag_id"], "run_id": run["run_id"], "logical_date": run.get("logical_date"),
        "run_type": run.get("run_type"), "fleet": run.get("fleet"), "config_digest": run.get("config_digest"),
        "started_at": run.get("started_at"), "finished_at": datetime.now(timezone.utc).isoformat(),
        "cases_total": len(rows), "cases_ok": counts[OK], "cases_failed": counts[FAILED], "cases_skipped": counts[SKIPPED],
    }
    host_rows = []
    for v in validations:
        if not v:
            continue
        facts = HostFacts.from_dict(v["facts"])
        host_rows.append({
            "dag_id": run["dag_id"], "run_id": run["run_id"], "host": v["host"], "verdict": v["verdict"],
            "reasons": v["reasons"], "kernel": facts.kernel, "docker_version": facts.docker_version,
            "driver_version": facts.driver_version, "cuda_driver_version": facts.cuda_driver_version,
            "gpu_count": len(facts.gpus) if facts.gpus is not None else None, "gpu_model": facts.gpu_model,
            "nvidia_runtime": facts.nvidia_runtime, "facts_json": json.dumps(v["facts"]),
            "checks_json": json.dumps(v["checks"]), "collected_at": v.get("collected_at"),
        })
    engine = get_engine()
    try:
        upgrade(engine)
        written = store_run(engine, run_row, host_rows, rows, collected["steps"])
    finally:
        engine.dispose()
    log.info("stored %d result row(s) for run %s: %s", written, run["run_id"], counts)
    return {**counts, "total": len(rows), "run_id": run["run_id"]}


# -- compare ----------------------------------------------------------------------------------
SUMMARY_FINDINGS = 50  # findings listed in the compare task's return value (XCom); all are stored and logged


def fleet_settings(plan: dict):
    """The `fleet` section of the config the run was planned with (carried in the plan, not re-read)."""
    from fleetbench.config import FleetSettings

    return FleetSettings.model_validate(plan["run"].get("fleet_settings") or {})


def detect_regressions(plan: dict, stored: dict) -> dict:
    """Compare each stored (host, case) of the run with its baseline (`fleetbench.regression`): store the
    findings in `regressions` (replacing an earlier detection of the run), log them, mail them when
    `fleet.notify` is set. Returns a small summary for the run (counts and the first findings)."""
    from fleetbench.notify import notify
    from fleetbench.regression import assess_run, store_findings
    from fleetbench.warehouse import get_engine

    run = plan["run"]
    if stored.get("run_id") not in (None, run["run_id"]):
        raise ValueError(f"stored rows of run {stored['run_id']!r}, not of {run['run_id']!r}")
    fleet = fleet_settings(plan)
    engine = get_engine()
    try:
        result = assess_run(engine, run["dag_id"], run["run_id"], fleet.regressions)
        store_findings(engine, run["dag_id"], run["run_id"], result.findings)
    finally:
        engine.dispose()
    log.info("compared %d case(s) with their baseline; %d without enough history; %d regression(s), %d improvement(s)",
             result.checked, len(result.insufficient_history), len(result.findings), len(result.improvements))
    for imp in result.improvements:
        log.info("improvement: %s %s: %s %+.1f %%", imp["host"], imp["case_key"], imp["metric"], imp["delta_pct"])
    sent = notify(result.findings, fleet.notify, run)
    return {
        "run_id": run["run_id"], "checked": result.checked, "insufficient_history": len(result.insufficient_history),
        "regressions": len(result.findings), "major": sum(1 for f in result.findings if f["severity"] == "major"),
        "improvements": len(result.improvements), "mailed": sent["mailed"],
        "findings": [{k: (round(f[k], 3) if isinstance(f[k], float) else f[k])
                      for k in ("host", "case_key", "metric", "baseline_value", "value", "delta_pct", "z_score", "severity")}
                     | {"changed": sorted(f["changes"])} for f in result.findings[:SUMMARY_FINDINGS]],
    }


# -- report -----------------------------------------------------------------------------------
# The Airflow Asset the report task updates: other DAGs can be scheduled on new results.
WAREHOUSE_ASSET_NAME = "fleetbench_warehouse"
WAREHOUSE_ASSET_URI = "x-fleetbench://warehouse/benchmark_results"


def write_report(plan: dict, stored: dict | None) -> dict:
    """Write the fleet's report (`fleetbench.report.write_report`: HTML, PNGs, JSON; this DAG's results
    of the last 30 days with results) into `<FLEETBENCH_DATA_DIR>/reports/` once the run's rows are stored.
    Returns where it is and the run's counts: the extra of the `fleetbench_warehouse` asset event.

    A report that cannot be written fails this task, never the rows: they are stored (and compared)
    before it runs. It fails (after its retry) rather than logging and going on, because a report that
    silently stops updating misleads the people who read it; `outcome` then fails the run, and
    clearing the `report` task alone writes it again. The asset event is emitted only with a report,
    so a DAG that reacts to it finds the report in place.
    """
    from fleetbench.report import parse_filters
    from fleetbench.report import write_report as write

    run = plan["run"]
    if not stored or stored.get("run_id") != run["run_id"]:
        raise RuntimeError(f"the rows of run {run['run_id']} were not stored, so there is nothing new to report")
    written = write(filters=parse_filters(dag_id=run["dag_id"]))
    log.info("report of %d result(s) of %d run(s) written to %s (%d plot(s))", written["summary"]["results"],
             written["summary"]["runs"], written["html"], len(written["pngs"]))
    return {"dag_id": run["dag_id"], "run_id": run["run_id"], "report": written["html"], "state": written["state"],
            **{k: stored.get(k) for k in ("total", OK, FAILED, SKIPPED)}}


def check_fleet(validations: list[dict]) -> None:
    """Fail with one clear message when no host of the fleet can run."""
    valid = [v for v in validations if v]
    if valid and all(v["verdict"] == "unfit" for v in valid):
        lines = "; ".join(f"{v['host']}: {v['reasons']}" for v in valid)
        raise RuntimeError(f"every host is unfit, nothing ran: {lines}")


def _by_host(items: list[dict]) -> dict[str, dict]:
    return {i["host"]: i for i in items if i}


FAILED_TASK_STATES = ("failed", "upstream_failed")


def failed_tasks(ti, dag_id: str, run_id: str) -> list[str]:
    """`task_id` (`task_id_<map index>` for a mapped one) of each task of the run that failed or whose upstream did."""
    states = ti.get_task_states(dag_id=dag_id, run_ids=[run_id]).get(run_id, {})
    return sorted(t for t, state in states.items() if state in FAILED_TASK_STATES)


def fail_if_tasks_failed(ti, dag_id: str, run_id: str) -> None:
    """Fail (no retry) naming the run's failed tasks; their cases are recorded with a failure class all the same."""
    from airflow.sdk.exceptions import AirflowFailException

    failed = failed_tasks(ti, dag_id, run_id)
    if failed:
        shown = ", ".join(failed[:20]) + (f" and {len(failed) - 20} more" if len(failed) > 20 else "")
        raise AirflowFailException(f"{len(failed)} task(s) of this run failed: {shown}; "
                                   "their cases are recorded in the warehouse with the failure class")
    log.info("no task of run %s failed", run_id)
