"""The fleet config (`include/config/fleet.yaml`): pydantic models and a loader whose errors name the field.

Every user mistake becomes a `ConfigError` carrying one line per problem, each with the path to the
field, e.g. ``benchmarks[1].batch_sizes[0]: must be > 0, got -1``. Nothing here touches Docker, SSH
or the warehouse: the DAG file calls `load_config` at parse time.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from fleetbench.harnesses.base import METRIC_NAME as _METRIC_NAME
from fleetbench.harnesses.base import UNITS as _UNITS

# Names that end up in container names, labels, file paths and command lines: a strict pattern,
# so nothing from a config file or a trigger parameter can smuggle shell or path syntax.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
MAX_NUM_BATCHES = 1_000_000  # benchmarks[].num_batches and the trigger parameter num_batches
# A Docker image reference, by distribution's reference grammar: [registry[:port]/]path[/path...][:tag][@sha256:digest],
# each path component lowercase letters and digits joined by one `.`, `_`, `__` or dashes (`x:1:v2` and `a//b`, which
# Docker refuses, are refused here). Python's `re` and JSON Schema (the trigger form's `image`) read it alike.
_DOMAIN_PART = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REF_PATTERN = (rf"^(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?/)?{_PATH_PART}(?:/{_PATH_PART})*"
                     r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$")
IMAGE_REF_SHAPE = ("must be a Docker image reference: [registry[:port]/]name[:tag][@sha256:<64 hex digits>], the "
                   "name's parts lowercase letters and digits joined by '.', '_', '__' or '-' (e.g. "
                   "nvcr.io/nvidia/tensorflow:23.03-tf1-py3)")
DOCKER_URL_PATTERN = r"^(unix:///[^\s]+|tcp://[A-Za-z0-9_.-]+:\d+|ssh://[^\s]+)$"

Name = Annotated[str, Field(pattern=NAME_PATTERN)]
# A path component of a Docker repository name (distribution's reference grammar): what a baked image's name must be.
_DOCKER_PATH = re.compile(r"[a-z0-9]+(?:(?:\.|_{1,2}|-+)[a-z0-9]+)*")
PositiveInt = Annotated[int, Field(gt=0)]
# Upper bounds for numbers that are accepted here but would break later: the DAG file turns timeouts into
# timedeltas at parse time (OverflowError near 10^14 s), Docker turns cpus into nano-CPUs and free space
# into bytes. Nobody means a case longer than a week, more than 1,024 CPUs or a petabyte of free disk.
MAX_TIMEOUT_S = 7 * 24 * 3600
MAX_CPUS = 1024
MAX_FREE_GB = 1_000_000
GB = 10**9  # the unit of every min_free_gb (hosts and images): gigabytes, as disks are sold; README says so
MAX_BATCH_SIZE = 65536  # the trigger form's limit too (fleetbench.params)
TimeoutS = Annotated[int, Field(gt=0, le=MAX_TIMEOUT_S)]
# A MIG profile as `nvidia-smi -L` names it: 1g.10gb, 3g.40gb, 1g.10gb+me, or a compute-instance profile 1c.3g.20gb.
MIG_PROFILE_PATTERN = r"^(?:[1-8]c\.)?[1-8]g\.[0-9]{1,4}gb(?:\+[a-z]{1,8}){0,3}$"

# libyaml's loader where PyYAML was built with it (10x faster on a 1,000-host config), else the pure one;
# the duplicate-key check below adds a few percent.
_BASE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeyLoader(_BASE_LOADER):
    """The safe loader, noting every key a mapping repeats: plain YAML keeps the last silently, so a second
    `hosts:` would drop the first fleet. Parsing stays in libyaml; only the (already Python) mapping
    constructor is extended, and the repeats are collected so that all of them are reported at once."""

    def __init__(self, stream):
        super().__init__(stream)
        # (line, column, message): sorted, as mappings are built nested-last
        self.duplicate_keys: list[tuple[int, int, str]] = []

    def construct_object(self, node, deep=False):
        """A scalar YAML reads as a value it cannot be (an unquoted `2026-02-30` is a date, a 5,000-digit number an
        int past Python's limit) is a YAML error at its line, not a ValueError out of the loader."""
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as exc:
            value = node.value if isinstance(node, yaml.ScalarNode) else node.tag
            shown = value if len(str(value)) <= 40 else f"{str(value)[:40]}..."
            kind = node.tag.rsplit(":", 1)[-1]
            raise yaml.constructor.ConstructorError(
                None, None, f"{shown!r} is not a valid {kind}: {str(exc)[:200]} (quote it to keep it as text)",
                node.start_mark) from None

    def construct_mapping(self, node, deep=False):
        own = list(node.value)  # the mapping's own entries: flatten_mapping replaces `<<: *defaults` by what it merges
        mapping = super().construct_mapping(node, deep=deep)
        if len(mapping) != len(own) or node.value != own:  # the fast path: no merge, every key new
            self._note_duplicate_keys(own)
        return mapping

    def _note_duplicate_keys(self, entries: list[tuple[yaml.Node, yaml.Node]]) -> None:
        """Compares constructed keys (so `1` and `"1"` differ); keys a merge brings in may be overridden."""
        first_line: dict[Any, int] = {}
        for key_node, _ in entries:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            mark = key_node.start_mark
            if key in first_line:
                self.duplicate_keys.append((mark.line, mark.column, f"line {mark.line + 1}, column {mark.column + 1}: "
                                            f"duplicate key {key!r} (first on line {first_line[key]}); "
                                            "YAML would keep only the last"))
            else:
                first_line[key] = mark.line + 1


_YAML_LOADER = _UniqueKeyLoader


class ConfigError(ValueError):
    """A fleet config that cannot be used; `errors` holds one `path: message` line per problem."""

    def __init__(self, source: str, errors: list[str]):
        self.source = source
        self.errors = errors
        super().__init__("\n".join(f"{source}: {e}" for e in errors))


class _Model(BaseModel):
    """Every section: unknown fields are errors, and no number is inf or NaN (YAML's `.inf` passes any `ge`
    bound, and both only fail later, as an OverflowError or a nonsense comparison)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _no_repeats(values: list) -> list:
    """A benchmark's matrix lists name each value once: a repeat would plan the same case twice, which
    `plan.expand_cases` refuses only when the run starts."""
    first: dict[Any, int] = {}
    repeats = []
    for i, value in enumerate(values):
        if value in first:
            repeats.append(f"{value!r} at [{first[value]}] and [{i}]")
        else:
            first[value] = i
    if repeats:
        raise ValueError(f"must not repeat a value: {', '.join(repeats)}")
    return values


Unique = AfterValidator(_no_repeats)


def _mig_profile(value: str) -> str:
    if not re.fullmatch(MIG_PROFILE_PATTERN, value):  # not re.match: its $ passes a final newline
        raise ValueError("not a MIG profile as nvidia-smi -L names it (e.g. 1g.10gb, 3g.40gb, 1g.10gb+me, "
                         "1c.3g.20gb)")
    return value


MigProfile = Annotated[str, Field(max_length=40), AfterValidator(_mig_profile)]


EMAIL_PATTERN = r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*$"
Email = Annotated[str, Field(pattern=EMAIL_PATTERN)]


class RegressionSettings(_Model):
    """How each run is compared with its baseline (`fleetbench.regression`; the statistics are in its docstrings)."""

    window: int = Field(20, ge=1, le=365)  # baseline: the last N ok nights of the baseline's segment
    scale_window: int = Field(60, ge=2, le=365)  # the noise scale: MAD and Qn of the last N baseline nights
    min_history: int = Field(10, ge=2)  # fewer baseline nights than this: no verdict ("insufficient history")
    z_threshold: float = Field(3.5, gt=0)  # robust z (median and MAD of the baseline) in the bad direction
    min_effect_pct: float = Field(3.0, ge=0)  # and at least this change against the baseline's median
    major_effect_pct: float = Field(10.0, gt=0)  # severity "major" from this change on, else "minor"
    scale_floor_pct: float = Field(0.5, ge=0)  # the robust scale is at least this % of the median
    confirm_nights: int = Field(2, ge=1, le=30)  # a finding is confirmed when this many nights in a row agree
    immediate_effect_pct: float = Field(50.0, gt=0)  # ... or at once from this change on, on a low-noise case
    low_noise_pct: float = Field(1.0, ge=0)  # low noise: the robust scale is at most this % of the median
    # A new segment (driver, CUDA driver, image digest, health state) becomes the baseline after this many
    # nights unless a confirmed regression is open against it (then only `fleetbench regressions accept`).
    accept_after_nights: int = Field(10, ge=1, le=365)
    history_days: int = Field(120, ge=7, le=3650)  # how far back a (host, case)'s nights are replayed

    @model_validator(mode="after")
    def _consistent(self) -> "RegressionSettings":
        if self.min_history > self.window:
            raise ValueError(f"min_history ({self.min_history}) must be <= window ({self.window})")
        if self.accept_after_nights < self.min_history:
            raise ValueError(f"accept_after_nights ({self.accept_after_nights}) must be >= min_history "
                             f"({self.min_history}): a new segment needs that many nights to be a baseline")
        if self.major_effect_pct < self.min_effect_pct:
            raise ValueError(f"major_effect_pct ({self.major_effect_pct}) must be >= min_effect_pct "
                             f"({self.min_effect_pct})")
        return self


class NotifySettings(_Model):
    """Where regressions are mailed (`fleetbench.notify`); the SMTP server and its secrets live in the Airflow
    Connection."""

    smtp_conn_id: Name
    to: list[Email] = Field(min_length=1)
    from_email: Email | None = None  # default: the connection's `from_email` extra
    min_severity: Literal["minor", "major"] = "minor"


class CapacitySettings(_Model):
    """What the plan does with a case its capacity profile predicts to run out of memory (`fleetbench.capacity`)."""

    on_predicted_oom: Literal["skip", "warn", "run"] = "skip"  # skip: the case is stored skipped, predicted_oom
    min_points: int = Field(3, ge=2, le=1000)  # ok readings a profile needs before it predicts anything
    confident_points: int = Field(5, ge=2, le=1000)  # below this many, a predicted OOM only warns
    margin_pct: float = Field(10.0, ge=0, lt=100)  # predicted + spread above capacity less this %: predicted OOM
    # the newest readings per profile; at most 1000: the fit weighs every pair of them (10,000 took 53 s and 1.9 GB
    # per profile, in the plan task and each report)
    window: int = Field(200, ge=2, le=1000)

    @model_validator(mode="after")
    def _consistent(self) -> "CapacitySettings":
        if self.min_points > self.window:
            raise ValueError(f"min_points ({self.min_points}) must be <= window ({self.window})")
        return self


# The cron presets Airflow's schedule takes (airflow.sdk timetables' CRON_PRESETS, and croniter's own aliases, which
# Airflow passes on to it).
CRON_PRESETS = {"@hourly": "0 * * * *", "@daily": "0 0 * * *", "@weekly": "0 0 * * 0", "@monthly": "0 0 1 * *",
                "@quarterly": "0 0 1 */3 *", "@yearly": "0 0 1 1 *", "@midnight": "0 0 * * *",
                "@annually": "0 0 1 1 *"}


class FleetSettings(_Model):
    name: Name = "fleet"
    timezone: str = "UTC"
    schedule: str | None = "0 2 * * *"
    # Grid carbon intensity (gCO2e per kWh) for the optional carbon metric; None: no carbon figures.
    carbon_g_per_kwh: float | None = Field(None, ge=0)
    # Time to accuracy: a case's wall time when its reported top-1 accuracy (eval runs) reaches this.
    target_accuracy_top1: float | None = Field(None, gt=0, le=1)
    # Regression detection after each run, and who hears about it (None: findings are stored and logged only).
    regressions: RegressionSettings = RegressionSettings()
    notify: NotifySettings | None = None
    # Peak memory predicted from earlier results, before a case runs.
    capacity: CapacitySettings = CapacitySettings()
    # One benchmark per host holds without pools (each lane's run_case runs one task instance at a time).
    # True also puts each lane in the single-slot pool `fleetbench_<host>`, for exclusivity with other
    # DAGs that use the same pool; the pools must then exist (`fleetbench pools export`), or the lane waits.
    host_pools: bool = False

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a folder of zones, such as 'Europe'
            raise ValueError("unknown time zone (an IANA name, e.g. Europe/Berlin)") from None
        return value

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from datetime import datetime, timezone

        from croniter import CroniterBadDateError, croniter

        expression = CRON_PRESETS.get(value, value)
        if value.startswith("@") and value not in CRON_PRESETS:
            raise ValueError(f"unknown preset (one of {', '.join(CRON_PRESETS)}, or a cron expression)")
        # five fields: croniter reads a sixth as seconds, so a seconds-first '0 0 2 * * *' ran every second of
        # 00:00 on the 2nd of each month
        if len(expression.split()) != 5 or not croniter.is_valid(expression):
            raise ValueError("not a cron expression of five fields (e.g. '0 2 * * *': minute hour day-of-month "
                             "month day-of-week)")
        try:
            croniter(expression, datetime(2026, 1, 1, tzinfo=timezone.utc)).get_next(datetime)
        except CroniterBadDateError:  # e.g. '0 2 31 2 *': February has no 31st
            raise ValueError("never fires (no date matches it)") from None
        return value


# dcgmi diag takes about a minute at -r 1, minutes at -r 2, tens of minutes at -r 3 and 4: its probe's timeout.
DCGM_TIMEOUT_S = {1: 300.0, 2: 1200.0, 3: 3600.0, 4: 7200.0}


class GpuHealthSpec(_Model):
    """GPU health thresholds of a host (README "GPU health"); fleetbench.hosts.health.HealthThresholds."""

    xid_window_hours: int = Field(24, ge=1, le=24 * 90)
    unfit_xids: list[int] = Field([48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 154], max_length=100)
    max_correctable_remapped_rows: int = Field(0, ge=0)
    min_power_limit_ratio: float = Field(1.0, ge=0, le=1)
    idle_clock_reasons: list[Literal["hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
                                     "sw_thermal_slowdown", "sw_power_cap", "applications_clocks_setting",
                                     "sync_boost", "display_clocks_setting"]] = [
        "hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"]
    require_persistence: bool = True
    allow_mig: bool = False
    dcgm_diag_level: int | None = Field(None, ge=1, le=4)  # dcgmi diag -r N; None: not run

    def dcgm_timeout_s(self) -> float:
        """How long the host check's dcgmi diag may take (0 when it is not run)."""
        return DCGM_TIMEOUT_S[self.dcgm_diag_level] if self.dcgm_diag_level else 0.0

    def thresholds(self):
        from fleetbench.hosts.health import HealthThresholds

        data = self.model_dump()
        return HealthThresholds(**{**data, "unfit_xids": tuple(data["unfit_xids"]),
                                   "idle_clock_reasons": tuple(data["idle_clock_reasons"])})


class HostSpec(_Model):
    name: Name
    # "local" probes and runs on this machine's engine; anything else names an Airflow SSH connection (a conn_id:
    # letters, digits, `_`, `.`, `-`, as Airflow allows).
    connection: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,250}$")] = "local"
    docker_url: str = Field("unix:///var/run/docker.sock", pattern=DOCKER_URL_PATTERN)
    # Cost: USD per GPU-hour for GPU cases; USD per hour of the whole host for CPU cases (and GPU cases
    # without a GPU price here or in the GPU catalog).
    price_per_gpu_hour: float | None = Field(None, ge=0)
    price_per_hour: float | None = Field(None, ge=0)
    # The CPUs' TDP in W (all sockets), for CPU cases' estimated energy; default: the CPU model's TDP in
    # CodeCarbon's table (include/config/cpu_tdp.csv) x sockets, else 4 W per logical CPU.
    cpu_tdp_w: float | None = Field(None, gt=0, le=100000)
    tags: list[Name] = []
    # Host validation: free space Docker's data root must have, and the image of the GPU smoke
    # container (`docker run --gpus all IMAGE nvidia-smi -L`; default: the host's benchmark image of the
    # oldest `cuda`, else its first).
    min_free_gb: float = Field(2.0, ge=0, le=MAX_FREE_GB)  # GB (10^9 bytes)
    gpu_smoke_image: str | None = Field(None, pattern=IMAGE_REF_PATTERN)
    # GPU health checks (run when the host's cases need GPUs) and folders put before PATH for every probe
    # (e.g. /usr/local/nvidia/bin when a non-interactive SSH login does not find nvidia-smi or dcgmi).
    gpu_health: GpuHealthSpec = GpuHealthSpec()
    probe_path: list[Annotated[str, Field(pattern=r"^(/[A-Za-z0-9_.+-]{1,100}){1,20}/?$")]] = Field([], max_length=8)
    # Fleet topology with the CeleryExecutor (README "Deploying at fleet scale"):
    # (a) central workers drive the host's engine over TLS: docker_url tcp://host:2376 and an Airflow
    #     Connection with the CA, client certificate and key (extra: ca_cert, client_cert, client_key);
    #     `connection` is then the host's SSH connection, so that the probes run on the host itself;
    # (b) a Celery worker on the host listens on `queue`: the host's validation, image preparation and
    #     cases run there, on its local socket. None: the default queue (central workers).
    queue: Name | None = None
    docker_tls_conn_id: Name | None = None
    # Multi-node cases (README "Multi-node cases"): the address the host's containers are reached at by the
    # other hosts of a case (its cluster spec). Default: 127.0.0.1 for a local host; required otherwise.
    address: str | None = Field(None, pattern=r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")

    def cluster_address(self) -> str | None:
        """Where the other hosts of a multi-node case reach this host's containers."""
        return self.address or ("127.0.0.1" if self.connection == "local" else None)

    @field_validator("docker_url")
    @classmethod
    def _one_machine(cls, value: str, info: ValidationInfo) -> str:
        """With connection local, uname, nvidia-smi and df run on the Airflow worker: a remote engine's
        `docker info` would join them into facts about two machines. A tcp:// port out of range was taken, then blamed
        on the TLS configuration by the image step (docker-py's ValueError)."""
        if value.startswith("tcp://") and not 1 <= int(value.rpartition(":")[2]) <= 65535:
            raise ValueError("the port must be from 1 to 65535")
        if info.data.get("connection") == "local" and not value.startswith("unix://"):
            raise ValueError("connection local probes this worker (uname, nvidia-smi, df), so the engine must be "
                             "its own: use an Airflow SSH connection for the host, or a unix:// socket")
        return value

    @model_validator(mode="after")
    def _tls_needs_tcp(self) -> "HostSpec":
        if self.docker_tls_conn_id and not self.docker_url.startswith("tcp://"):
            raise ValueError(f"docker_tls_conn_id needs a tcp:// docker_url (TLS), got {self.docker_url!r}")
        return self


# Paths for the bake step: a project path under include/ (copied from), an absolute container path (copied to).
_INCLUDE_PATH = r"^include(/[A-Za-z0-9_][A-Za-z0-9_.-]*)+$"
_CONTAINER_PATH = r"^(/[A-Za-z0-9_][A-Za-z0-9_.-]*)+$"


class BakeCopy(_Model):
    """Copy a file or folder of the project (under `include/`) into the image."""

    src: str = Field(pattern=_INCLUDE_PATH)
    dest: str = Field(pattern=_CONTAINER_PATH)


class BakeGit(_Model):
    """Check out one branch of a git repository into the image (cloned on the Airflow worker, see fleetbench.bake)."""

    url: str = Field(pattern=r"^(https://|ssh://|file:///)[A-Za-z0-9_.@:/~+%-]+$")  # %: percent-encoded characters
    branch: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,199}$")
    dest: str = Field(pattern=_CONTAINER_PATH)


class BakeSpec(_Model):
    """The runbook's `docker commit`: a setup container from the pinned base, committed under a deterministic tag."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True)
    copy_: list[BakeCopy] = Field([], alias="copy")  # `copy` would shadow BaseModel.copy
    git: BakeGit | None = None
    run: list[str] = []  # argv of the setup step, run in the container after copy/git (no shell unless you name one)
    network: Literal["none", "host"] = "none"  # the setup step's network (host: e.g. pip install)
    timeout_s: TimeoutS = 1800
    push_to: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9.-]*(:\d{1,5})?$")  # registry host[:port]
    push_conn_id: Name | None = None  # Airflow Connection with the push registry's credentials

    @model_validator(mode="after")
    def _does_something(self) -> "BakeSpec":
        if not (self.copy_ or self.git or self.run):
            raise ValueError("bake needs at least one of copy, git or run")
        return self


def _program_named(command: list[str] | None) -> list[str] | None:
    """A command's first item is the program the container runs: an empty or blank one starts nothing."""
    if command and not command[0].strip():
        raise ValueError(f"the first item is the program to run, and it is empty: {command[0]!r}")
    return command


class ImageSpec(_Model):
    name: Name
    ref: str = Field(pattern=IMAGE_REF_PATTERN)
    pull_policy: Literal["always", "if-missing", "never"] = "always"
    cuda: str | None = Field(None, pattern=r"^\d+\.\d+$")
    # The harness inside the image: tf_cnn_benchmarks and torch_synthetic append their case flags
    # (--model=..., --batch_size=...); command runs it as is (unless the benchmark gives its own `command`);
    # nccl_tests does not use it. Required by the benchmarks that need it (config check).
    command: list[str] = []
    # Airflow Connection (login, password, host[:port]) for the registry: secrets never live in this file.
    credentials_conn_id: Name | None = None
    # Refuse to pull (or bake) when Docker's data root has less free space than this (GB, 10^9 bytes).
    min_free_gb: float | None = Field(None, gt=0, le=MAX_FREE_GB)
    bake: BakeSpec | None = None
    # What a manual run's `image` parameter may put in place of `ref`: `none` (refused), `same_repository`
    # (another tag or digest of the same repository) or `any` image. An overridden image is never baked or
    # pushed, and the credentials go only to the registry of `credentials_conn_id` (fleetbench.registry).
    allow_override: Literal["none", "same_repository", "any"] = "same_repository"

    @field_validator("command")
    @classmethod
    def _program(cls, value: list[str] | None) -> list[str] | None:
        return _program_named(value)


BYTES_PATTERN = r"^[0-9]+[bkmgBKMG]?$"
ULIMITS = Literal["memlock", "stack", "nofile", "core", "nproc"]


class MountSpec(_Model):
    source: str = Field(pattern=r"^/[^\s]*$")
    target: str = Field(pattern=r"^/[^\s]*$")
    read_only: bool = True


class ContainerSpec(_Model):
    """How a case's container is started (docker run flags). GPU cases default to NGC's recommended flags."""

    network_mode: Literal["none", "host"] = "none"
    shm_size: str | None = Field(None, pattern=BYTES_PATTERN)
    ipc_mode: Literal["host", "private", "shareable"] | None = None
    # -1 means unlimited. NGC recommends memlock=-1 and stack=67108864 on GPU hosts.
    ulimits: dict[ULIMITS, Annotated[int, Field(ge=-1)]] = {}
    mem_limit: str | None = Field(None, pattern=BYTES_PATTERN)
    cpus: float | None = Field(None, gt=0, le=MAX_CPUS)
    environment: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = {}
    mounts: list[MountSpec] = []
    # count: `--gpus N` (Docker picks); device_ids: the first N GPUs of the host by UUID, recorded on the row.
    gpu_selection: Literal["count", "device_ids"] = "count"


NGC_GPU_CONTAINER = ContainerSpec(shm_size="1g", ulimits={"memlock": -1, "stack": 67108864})


class MetricPattern(_Model):
    """A named regex for the `command` harness: its one capture group is the metric's value."""

    metric: str = Field(pattern=_METRIC_NAME.pattern)
    regex: str = Field(min_length=1, max_length=500)  # compiled and checked for backtracking by the config check
    unit: str
    better: Literal["higher", "lower"] | None = None  # None: lower for time units, else higher

    @field_validator("unit")
    @classmethod
    def _known_unit(cls, value: str) -> str:
        if value not in _UNITS:
            raise ValueError(f"unknown unit {value!r} (known: {', '.join(sorted(_UNITS))})")
        return value


class CommandMetrics(_Model):
    """Where the `command` harness reads its metrics (README "Harnesses")."""

    json_lines: bool = True  # {"metric": ..., "value": ..., "unit": ..., "better": ...} lines on stdout
    patterns: list[MetricPattern] = []
    primary: str | None = Field(None, pattern=_METRIC_NAME.pattern)  # None: the first metric the case prints


SIZE_RANGE_PATTERN = r"^[0-9]{1,12}[KMG]?:[0-9]{1,12}[KMG]?$"
_SIZE_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}  # as nccl-tests' parsesize reads -b/-e


def _size_range(value: str) -> str:
    """nccl-tests refuses a MIN above MAX (`invalid sizes for 'minbytes' and 'maxbytes'`) before it runs anything:
    every host would fail that case every night, so the config check names it first."""
    low, high = value.split(":")
    if _size_bytes(low) > _size_bytes(high):
        raise ValueError(f"MIN {low} is larger than MAX {high} ({_size_bytes(low)} > {_size_bytes(high)} bytes)")
    return value


def _size_bytes(size: str) -> int:
    unit = size[-1] if size[-1] in _SIZE_UNITS else ""
    return int(size.removesuffix(unit)) * _SIZE_UNITS[unit]


SizeRange = Annotated[str, Field(pattern=SIZE_RANGE_PATTERN), AfterValidator(_size_range)]


class BenchmarkSpec(_Model):
    name: Name
    image: Name
    # fleetbench.harnesses: tf_cnn_benchmarks, torch_synthetic, command, nccl_tests. The matrix axes a harness has
    # (models, batch_sizes, ...) are checked against it by the config check (`_harness_errors`).
    harness: str = "tf_cnn_benchmarks"
    models: Annotated[list[Name], Unique] | None = Field(None, min_length=1)
    batch_sizes: Annotated[list[Annotated[int, Field(gt=0, le=MAX_BATCH_SIZE)]], Unique] | None = Field(
        None, min_length=1)
    num_gpus: Annotated[list[Annotated[int, Field(ge=0, le=64)]], Unique] = Field([1], min_length=1)
    variable_update: Annotated[list[Literal["parameter_server", "replicated", "independent", "horovod",
                                            "distributed_replicated"]], Unique] = Field(["parameter_server"],
                                                                                         min_length=1)
    # torch_synthetic: precision, memory format (channels_last) and torch.compile on/off as matrix axes.
    precisions: Annotated[list[Literal["fp32", "fp16", "bf16"]], Unique] = Field(["fp32"], min_length=1)
    channels_last: Annotated[list[bool], Unique] = Field([False], min_length=1)
    compile: Annotated[list[bool], Unique] = Field([False], min_length=1)
    # nccl_tests: the collectives (<name>_perf binaries) and "MIN:MAX" byte ranges (-b/-e, e.g. 8:128M).
    collectives: Annotated[list[Literal["all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast",
                                        "reduce", "sendrecv", "scatter", "gather", "hypercube"]], Unique] | None = (
        Field(None, min_length=1))
    size_ranges: Annotated[list[SizeRange], Unique] = Field(
        ["8:128M"], min_length=1)
    nccl_tests_dir: str = Field("/opt/nccl-tests/build", pattern=r"^(/[A-Za-z0-9_][A-Za-z0-9_.-]*)+/?$")
    # command: the case's argv (default: the image's command), run as is; and where its metrics come from.
    # nccl_tests: a launcher put in front of the binary (e.g. mpirun -np 2 ...), default none.
    command: list[Annotated[str, Field(max_length=4096, pattern=r"^[^\x00]*$")]] | None = Field(None, min_length=1)
    metrics: CommandMetrics | None = None
    num_batches: Annotated[int, Field(gt=0, le=MAX_NUM_BATCHES)] = 100  # the warehouse's integer column holds it
    num_warmup_batches: Annotated[int, Field(ge=0, le=MAX_NUM_BATCHES)] = 5
    device: Literal["gpu", "cpu"] = "gpu"
    timeout_s: TimeoutS = 3600
    hosts: Annotated[list[Name], Field(min_length=1)] | None = None  # [] would run nowhere: leave it out for all
    extra_args: list[Annotated[str, Field(pattern=r"^--[A-Za-z0-9_]+=[A-Za-z0-9_.,:/-]*$")]] = []
    container: ContainerSpec | None = None  # None: NGC's flags for GPU cases, plain defaults for CPU cases
    # GPU sampling period of the in-container telemetry wrapper (needs python3 in the image); 0 turns it off.
    # CPU benchmarks (device: cpu) run under it too, without NVML: it counts the container's CPU time, what
    # their energy is estimated from when the host's RAPL counters cannot be read.
    telemetry_period_s: float = Field(0.5, ge=0, le=60)
    # Run on MIG instances instead of whole GPUs (README "MIG instances"): each profile, as nvidia-smi -L names it
    # (1g.10gb, 3g.40gb, ...), is a matrix axis; a case takes num_gpus instances of its profile, named by their
    # MIG- UUIDs in the container's device request. None: whole GPUs, never a GPU in MIG mode.
    mig_profiles: Annotated[list[MigProfile], Unique] | None = Field(None, min_length=1)

    # Multi-node cases (README "Multi-node cases"): hosts per case (1: today's single-host cases), and the
    # role layout of a case of N > 1 hosts. ps_worker (tf_cnn_benchmarks): `ps_per_node` parameter servers
    # and `workers_per_node` workers on every host of the set (`ps_nodes: first`: the ps only on the set's
    # first host); worker 0 on the first host is the chief, whose log gives the result. launcher
    # (torch_synthetic): torchrun on every host of the set, `procs_per_node` ranks each (GPU cases: one per GPU,
    # the case's num_gpus), a process group of `backend` (auto: gloo on CPU, nccl on GPU); node 0 is the chief.
    nodes: Annotated[list[Annotated[int, Field(ge=1, le=64)]], Unique] = Field([1], min_length=1)
    layout: Literal["ps_worker", "launcher"] = "ps_worker"
    ps_per_node: int = Field(1, ge=0, le=8)
    workers_per_node: int = Field(1, ge=1, le=64)
    ps_nodes: Literal["all", "first"] = "all"
    procs_per_node: int | None = Field(None, ge=1, le=64)
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    # Hosts of one set must report the same GPU model (host validation), unless this is true.
    mixed_gpu_models: bool = False
    # First port tried per case (each role gets its own, checked free on its host), and how long the chief
    # may take to join the cluster (its "Running warm up" line) before the case fails rendezvous_timeout.
    base_port: int = Field(23456, ge=1024, le=65000)
    rendezvous_timeout_s: int = Field(300, ge=10, le=MAX_TIMEOUT_S)

    def container_settings(self) -> ContainerSpec:
        """The benchmark's `container`; a GPU benchmark's takes NGC's shm_size and ulimits where it does not set
        them itself (a `container` with only an environment variable dropped them: a 64 MB /dev/shm for NCCL)."""
        if self.container is None:
            return NGC_GPU_CONTAINER if self.device == "gpu" else ContainerSpec()
        if self.device != "gpu":
            return self.container
        return self.container.model_copy(update={k: getattr(NGC_GPU_CONTAINER, k) for k in ("shm_size", "ulimits")
                                                 if not getattr(self.container, k)})  # unset: None, {}

    @field_validator("command")
    @classmethod
    def _program(cls, value: list[str] | None) -> list[str] | None:
        return _program_named(value)

    @model_validator(mode="after")
    def _cpu_needs_no_gpus(self) -> "BenchmarkSpec":
        if self.device == "cpu" and any(n != 0 for n in self.num_gpus):
            raise ValueError("device cpu runs with num_gpus [0]")
        if self.device == "gpu" and 0 in self.num_gpus:
            raise ValueError("device gpu needs num_gpus >= 1 (use device: cpu for CPU cases)")
        return self


class FleetConfig(_Model):
    fleet: FleetSettings = FleetSettings()
    hosts: list[HostSpec] = Field(min_length=1)
    images: list[ImageSpec] = Field(min_length=1)
    benchmarks: list[BenchmarkSpec] = Field(min_length=1)

    def host(self, name: str) -> HostSpec:
        return next(h for h in self.hosts if h.name == name)

    def image(self, name: str) -> ImageSpec:
        return next(i for i in self.images if i.name == name)

    def digest(self) -> str:
        """A stable hash of the effective config, recorded with each run."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _cross_check(data: dict) -> list[str]:
    """References between sections: names must be unique and must exist. Reads the raw data (a section or
    item of the wrong shape is the field checks' to report), so these come with the field errors, at once."""
    def items(section: str) -> list[tuple[int, dict]]:
        value = data.get(section)
        return [(i, item) for i, item in enumerate(value) if isinstance(item, dict)] if isinstance(value, list) else []

    def names(section: str) -> set[str]:
        return {item["name"] for _, item in items(section) if isinstance(item.get("name"), str)}

    errors: list[str] = []
    errors += _multinode_errors(data, items("hosts"), items("benchmarks"))
    for section in ("hosts", "images", "benchmarks"):
        seen: set[str] = set()
        for i, item in items(section):
            name = item.get("name")
            if not isinstance(name, str):  # a missing or mistyped name is the field checks' to report
                continue
            if name in seen:
                errors.append(f"{section}[{i}].name: duplicate name {name!r}")
            seen.add(name)
    baked: dict[str, tuple[int, str]] = {}
    for i, item in items("images"):  # a baked image is fleetbench/<name> (lower case): a Docker path component
        name = item.get("name")
        if item.get("bake") and isinstance(name, str) and not _DOCKER_PATH.fullmatch(name.lower()):
            errors.append(f"images[{i}].name: {name!r} cannot name its baked image fleetbench/{name.lower()} (Docker "
                          "repository names: letters and digits, separated by one '.', one or two '_', or '-')")
        elif item.get("bake") and isinstance(name, str):
            j, other = baked.setdefault(name.lower(), (i, name))
            if j != i and other != name:  # one repository: each bake would supersede the other, and cleanup take it
                errors.append(f"images[{i}].name: {name!r} and images[{j}]'s {other!r} would both bake into "
                              f"fleetbench/{name.lower()}: rename one")
    lanes: dict[str, str] = {}  # a host's lane is task group host_<name> with "." as "_" (fleetbench.runs.lane_id)
    folders: dict[str, str] = {}
    for i, item in items("hosts"):
        name = item.get("name")
        if not isinstance(name, str):
            continue
        other = lanes.setdefault(name.replace(".", "_"), name)
        if other != name:
            errors.append(f"hosts[{i}].name: {name!r} and {other!r} would share the task group "
                          f"host_{name.replace('.', '_')} (a '.' is written '_' there): rename one")
            continue
        other = folders.setdefault(name.rstrip("_.-"), name)  # fleetbench.runs.safe_name: files, pools
        if other != name:
            errors.append(f"hosts[{i}].name: {name!r} and {other!r} would share the artifacts folder and pool "
                          f"{name.rstrip('_.-')!r} (a name's trailing '_', '.' and '-' are dropped there): rename one")
    host_names, image_names = names("hosts"), names("images")
    image_commands = {item["name"]: item.get("command") for _, item in items("images")
                      if isinstance(item.get("name"), str)}
    for i, bench in items("benchmarks"):
        errors += _harness_errors(bench, f"benchmarks[{i}]", image_commands)
        image = bench.get("image")
        if isinstance(image, str) and image_names and image not in image_names:
            errors.append(f"benchmarks[{i}].image: unknown image {image!r} "
                          f"(known: {', '.join(sorted(image_names))})")
        hosts = bench.get("hosts")
        for j, host in enumerate(hosts if isinstance(hosts, list) else []):
            if isinstance(host, str) and host_names and host not in host_names:
                errors.append(f"benchmarks[{i}].hosts[{j}]: unknown host {host!r} "
                              f"(known: {', '.join(sorted(host_names))})")
    return errors


# variable_update values a case of several hosts runs with (tf_cnn_benchmarks' cluster modes).
CLUSTER_UPDATES = ("parameter_server", "distributed_replicated")


def _multinode_errors(data: dict, hosts: list[tuple[int, dict]], benches: list[tuple[int, dict]]) -> list[str]:
    """Benchmarks with `nodes` > 1: a harness and layout that can span hosts, cluster variable updates, and
    spanned hosts the others can reach (an address) from the default queue."""
    errors: list[str] = []
    by_name = {h["name"]: (i, h) for i, h in hosts if isinstance(h.get("name"), str)}
    for i, bench in benches:
        nodes = bench.get("nodes")
        if not isinstance(nodes, list) or not any(isinstance(n, int) and n > 1 for n in nodes):
            continue
        path = f"benchmarks[{i}]"
        harness = bench.get("harness", "tf_cnn_benchmarks")
        layout = bench.get("layout", "ps_worker")
        if layout == "launcher":
            errors += _launcher_errors(bench, path, harness)
            updates = []
        else:
            if harness == "torch_synthetic":
                errors.append(f"{path}.layout: harness torch_synthetic spans hosts with layout launcher, "
                              f"got {layout!r}")
            elif harness != "tf_cnn_benchmarks":
                errors.append(f"{path}.nodes: cases of several hosts (nodes > 1) run harness tf_cnn_benchmarks "
                              f"(layout ps_worker) or torch_synthetic (layout launcher), not {harness!r}")
            errors += [f"{path}.{f}: a field of layout launcher; this benchmark's layout is ps_worker"
                       for f, default in LAUNCHER_FIELDS.items() if bench.get(f, default) != default]
            updates = bench.get("variable_update", ["parameter_server"])
        for j, vu in enumerate(updates if isinstance(updates, list) else []):
            if isinstance(vu, str) and vu not in CLUSTER_UPDATES:
                errors.append(f"{path}.variable_update[{j}]: {vu!r} cannot span hosts (nodes > 1 runs "
                              f"{' or '.join(CLUSTER_UPDATES)})")
            if vu == "distributed_replicated" and 1 in nodes:
                errors.append(f"{path}.nodes: 1 with variable_update distributed_replicated (a cluster mode): "
                              "give the 1-node baseline its own benchmark (e.g. replicated)")
        if bench.get("mig_profiles"):
            errors.append(f"{path}.mig_profiles: cases of several hosts (nodes > 1) run on whole GPUs; give the MIG "
                          "cases a benchmark of their own")
        if layout != "launcher" and bench.get("ps_per_node", 1) == 0:  # tf_cnn_benchmarks' cluster needs a ps job
            errors.append(f"{path}.ps_per_node: 0 leaves the cluster without a parameter server, which "
                          f"variable_update {' and '.join(CLUSTER_UPDATES)} need (tf_cnn_benchmarks puts the "
                          "variables on /job:ps): give at least 1")
        if bench.get("device", "gpu") == "gpu" and layout != "launcher" and bench.get("workers_per_node", 1) != 1:
            errors.append(f"{path}.workers_per_node: GPU cases run one worker per host with the case's num_gpus "
                          "GPUs (several workers on one host would each see every GPU)")
        names = bench.get("hosts") if isinstance(bench.get("hosts"), list) else list(by_name)
        names = [n for n in names if isinstance(n, str)]  # another type is the field checks' to report
        spanned = [by_name[n] for n in names if n in by_name]
        # A local host's containers are reached at 127.0.0.1 unless it has an address: fine while every host of
        # the benchmark is this machine, never when a remote host must reach it.
        remote = any(h.get("connection", "local") != "local" for _, h in spanned)
        for name in names:
            if name not in by_name:
                continue
            j, host = by_name[name]
            if not host.get("address") and host.get("connection", "local") == "local" and remote:
                errors.append(f"hosts[{j}].address: is required for local host {name!r} of multi-node benchmark "
                              f"{bench.get('name')!r}, which also spans remote hosts (they cannot reach it at "
                              "127.0.0.1)")
            if host.get("queue"):
                errors.append(f"hosts[{j}].queue: host {name!r} runs multi-node benchmark {bench.get('name')!r}, "
                              "whose containers are started from the default queue: drive its engine over TLS "
                              "(docker_url tcp://) instead of a queue of its own")
            if not host.get("address") and host.get("connection", "local") != "local":
                errors.append(f"hosts[{j}].address: is required for host {name!r} of multi-node benchmark "
                              f"{bench.get('name')!r} (where the other hosts reach its containers)")
    return errors


# Each layout's own fields and their defaults: a value other than the default under the other layout is refused
# (a dumped config, as the run's parameters are applied to, carries every field at its default).
PS_WORKER_FIELDS = {"ps_per_node": 1, "workers_per_node": 1, "ps_nodes": "all"}
LAUNCHER_FIELDS = {"procs_per_node": None, "backend": "auto"}


def _launcher_errors(bench: dict, path: str, harness: Any) -> list[str]:
    """A launcher-layout benchmark (torchrun): torch_synthetic, none of ps_worker's fields, ranks per host that
    fit its device, a backend that exists there."""
    errors = []
    if harness != "torch_synthetic":
        errors.append(f"{path}.layout: launcher runs harness torch_synthetic (under torchrun), not {harness!r}")
    errors += [f"{path}.{f}: a field of layout ps_worker; layout launcher runs procs_per_node ranks per host"
               for f, default in PS_WORKER_FIELDS.items() if bench.get(f, default) != default]
    device = bench.get("device", "gpu")
    if device == "gpu" and bench.get("procs_per_node") is not None:
        errors.append(f"{path}.procs_per_node: GPU cases run one rank per GPU (the case's num_gpus); "
                      "procs_per_node is for device cpu")
    if device == "cpu" and bench.get("backend") == "nccl":
        errors.append(f"{path}.backend: nccl needs GPUs; device cpu runs gloo")
    return errors


def _harness_errors(bench: dict, path: str, image_commands: dict[str, Any]) -> list[str]:
    """A raw benchmark against its harness: known harness, only the matrix axes it has, the ones it needs,
    an argv to run, and the harness's own checks (e.g. the command harness's regexes)."""
    from fleetbench.harnesses import HARNESSES, MATRIX_AXES

    name = bench.get("harness", "tf_cnn_benchmarks")
    harness = HARNESSES.get(name) if isinstance(name, str) else None
    if harness is None:
        return [f"{path}.harness: unknown harness {name!r} (known: {', '.join(sorted(HARNESSES))})"]
    def given(field: str) -> bool:  # set to other than its default (a dumped config repeats the defaults)
        return field in bench and bench[field] != BenchmarkSpec.model_fields[field].default

    errors = [f"{path}.{axis}: harness {name} has no matrix axis {axis} (its axes: {', '.join(harness.axes)})"
              for axis in MATRIX_AXES if given(axis) and axis not in harness.axes]
    errors += [f"{path}.{axis}: is required for harness {name}" + (", got null" if axis in bench else "")
               for axis in harness.required if bench.get(axis) is None]
    for field in ("command", "metrics", "nccl_tests_dir"):
        if given(field) and field not in harness.fields:
            errors.append(f"{path}.{field}: harness {name} does not use it (only {', '.join(harness.fields) or 'none'}"
                          " of command, metrics, nccl_tests_dir)")
    image = bench.get("image")
    if harness.needs_argv and not bench.get("command") and isinstance(image, str) and image in image_commands \
            and not image_commands[image]:
        errors.append(f"{path}.image: image {image!r} has no command, and harness {name} needs one to run"
                      + (" (or give the benchmark a command)" if "command" in harness.fields else ""))
    if harness.gpu_only and bench.get("device") == "cpu":
        errors.append(f"{path}.device: harness {name} runs on GPUs only")
    if bench.get("mig_profiles") and bench.get("device") == "cpu":
        errors.append(f"{path}.mig_profiles: MIG instances are GPU devices; a device cpu benchmark cannot ask for them")
    return errors + _extra_args_errors(bench, path, harness) + harness.check(bench, path)


def _extra_args_errors(bench: dict, path: str, harness: Any) -> list[str]:
    """`extra_args` that repeat a flag the harness sets (`Harness.own_flags`), or a prefix the program would read
    as one: the last value wins, so the case would run with other settings than its key and row say."""
    own = harness.own_flags(bench)
    extra = bench.get("extra_args")
    errors = []
    for j, arg in enumerate(extra if isinstance(extra, list) else []):
        if not (isinstance(arg, str) and arg.startswith("--") and len(arg) > 2):
            continue  # the field checks report it
        flag = arg[2:].partition("=")[0]
        hit = flag if flag in own else next((f for f in own if harness.abbreviated_flags and f.startswith(flag)), None)
        if hit:
            errors.append(f"{path}.extra_args[{j}]: --{flag}" + (f" (a prefix of --{hit})" if hit != flag else "")
                          + f" is set by harness {harness.name} ({own[hit]}), got {arg!r}")
    return errors


_MESSAGES = {
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be >= {ge}",
    "less_than_equal": "must be <= {le}",
    "string_pattern_mismatch": "must match {pattern}",
    "missing": "is required",
    "extra_forbidden": "unknown field",
    "too_short": "must not be empty",
    "literal_error": "must be one of {expected}",
    "int_parsing": "must be an integer",
    "int_type": "must be an integer",
    "int_from_float": "must be an integer",
    "float_parsing": "must be a number",
    "finite_number": "must be a finite number",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "bool_parsing": "must be true or false",
}


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _shown(value: Any) -> Any:
    """A refused value as an error repeats it: a URL without the user and password it may carry (a git token): the
    error also becomes the DAG's import error, which whoever sees the DAG in the UI can read."""
    if isinstance(value, str) and "://" in value and "@" in value:
        from urllib.parse import urlsplit

        from fleetbench.bake import public_url  # only then: bake imports docker

        try:
            parts = urlsplit(value)
            if parts.password is None and parts.scheme not in ("http", "https"):
                return value  # ssh://bench@gpu-01: a user name, no secret (an http(s) user may be a bare token)
        except ValueError:
            pass
        return public_url(value)
    return value


def format_validation_error(exc: ValidationError) -> list[str]:
    lines = []
    for err in exc.errors(include_url=False):
        template = _MESSAGES.get(err["type"])
        ctx = err.get("ctx") or {}
        if ctx.get("pattern") == IMAGE_REF_PATTERN:  # a regex of the reference grammar says little to a reader
            message = IMAGE_REF_SHAPE
        elif template:
            try:
                message = template.format(**ctx)
            except (KeyError, IndexError):
                message = err["msg"]
        else:
            message = str(ctx.get("error") or err["msg"])
            message = message.removeprefix("Value error, ")
        if err["type"] not in ("missing", "extra_forbidden"):
            message += f", got {_shown(err['input'])!r}" if not isinstance(err["input"], (dict, list)) else ""
        lines.append(f"{_loc(tuple(err['loc']))}: {message}")
    return lines


def parse_config(data: Any, source: str = "<config>") -> FleetConfig:
    if not isinstance(data, dict):
        raise ConfigError(source, ["(top level): must be a mapping with hosts, images and benchmarks, "
                                   f"got {type(data).__name__}"])
    errors = _cross_check(data)  # references between sections, read off the raw data: all errors come at once
    try:
        cfg = FleetConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, format_validation_error(exc) + errors) from None
    if errors:
        raise ConfigError(source, errors)
    errors = _case_key_errors(cfg)
    if errors:
        raise ConfigError(source, errors)
    return cfg


def _case_key_errors(cfg: FleetConfig) -> list[str]:
    """A case key two benchmarks would both plan: keys join a benchmark's name and its axis values with dots,
    which names may hold (benchmark `cnn` with model `resnet50.v1`, benchmark `cnn.resnet50` with model `v1`),
    and the plan, the warehouse and the regression history know a case by its key. Multi-node keys carry `.n<N>`
    and their host set, so they are compared per number of hosts."""
    from fleetbench.harnesses import get as get_harness
    from fleetbench.plan import mig_case_key

    first: dict[tuple[str, int], int] = {}
    clashes: dict[tuple[int, int], list[str]] = {}  # (benchmark, the earlier one) -> the keys both plan
    for i, bench in enumerate(cfg.benchmarks):
        for point in get_harness(bench.harness).points(bench):
            keys = [(mig_case_key(point.case_key, m), 1) for m in bench.mig_profiles or [None]] if 1 in bench.nodes \
                else []
            for key in keys + [(point.case_key, n) for n in bench.nodes if n > 1]:
                j = first.setdefault(key, i)
                if j != i:
                    clashes.setdefault((i, j), []).append(key[0] if key[1] == 1 else f"{key[0]}.n{key[1]}.<host set>")
    return [f"benchmarks[{i}].name: case key {keys[0]!r}" + (f" (and {len(keys) - 1} more)" if len(keys) > 1 else "")
            + f" is also planned by benchmarks[{j}] ({cfg.benchmarks[j].name!r}): rename one"
            for (i, j), keys in clashes.items()]


def nights_within(fleet: FleetSettings) -> int | None:
    """How many times `fleet.schedule` fires in `regressions.history_days` (counted up to min_history + 1); None
    without a schedule."""
    if fleet.schedule is None:
        return None
    from datetime import datetime, timedelta
    from zoneinfo import ZoneInfo

    from croniter import croniter

    start = datetime(2026, 1, 1, tzinfo=ZoneInfo(fleet.timezone))
    end = start + timedelta(days=fleet.regressions.history_days)
    it, n = croniter(CRON_PRESETS.get(fleet.schedule, fleet.schedule), start), 0
    while n <= fleet.regressions.min_history and it.get_next(datetime) < end:
        n += 1
    return n


def config_warnings(cfg: FleetConfig) -> list[str]:
    """What is valid but probably not meant: a Docker engine over plain tcp:// (no TLS) is root on its host for
    anyone who reaches the port."""
    warnings = [f"hosts[{i}].docker_url: {h.docker_url} without docker_tls_conn_id: the engine's API is "
                "unauthenticated (root on that host for anyone who reaches the port); use TLS (README 'Two fleet "
                "topologies')" for i, h in enumerate(cfg.hosts) if h.docker_url.startswith("tcp://")
                and not h.docker_tls_conn_id]
    engines: dict[str, int] = {}
    queues: dict[str, int] = {}
    for i, h in enumerate(cfg.hosts):  # two entries for one machine: two lanes benchmarking its GPUs at once
        if not h.docker_url.startswith("unix://"):  # several local hosts on loopback addresses share one on purpose
            if (j := engines.setdefault(h.docker_url, i)) != i:
                warnings.append(f"hosts[{i}].docker_url: {h.docker_url} is also hosts[{j}]'s ({cfg.hosts[j].name}): "
                                "two lanes would run cases on that engine's GPUs at once, and its results would be "
                                "stored under both names")
        if h.queue and (j := queues.setdefault(h.queue, i)) != i:
            warnings.append(f"hosts[{i}].queue: {h.queue!r} is also hosts[{j}]'s ({cfg.hosts[j].name}): one worker "
                            "would run both hosts' lanes on its own engine, at once")
    for i, bench in enumerate(cfg.benchmarks):
        spanned = len(bench.hosts) if bench.hosts is not None else len(cfg.hosts)
        warnings += [f"benchmarks[{i}].nodes: {n} hosts per case, but the benchmark runs on {spanned} host(s): "
                     "no case of that size is planned" for n in bench.nodes if n > spanned]
        if cfg.fleet.host_pools and max(bench.nodes) > 1:  # an Airflow task holds one pool, not one per host
            warnings.append(f"benchmarks[{i}].nodes: multi-node cases do not take the per-host pools "
                            "(fleet.host_pools); within fleet_benchmark they never overlap a host's other cases, "
                            "but another DAG's task in a spanned host's pool can")
    if (nights := nights_within(cfg.fleet)) is not None and nights <= cfg.fleet.regressions.min_history:
        reg = cfg.fleet.regressions
        warnings.append(f"fleet.regressions.history_days: {reg.history_days} days of fleet.schedule "
                        f"{cfg.fleet.schedule!r} hold {nights} night(s), but a verdict needs min_history "
                        f"({reg.min_history}) earlier ones: no case is ever compared with a baseline; raise "
                        "history_days or lower min_history")
    for i, image in enumerate(cfg.images):
        if not (image.bake and image.bake.git):
            continue
        from fleetbench.bake import public_url  # the CLI's config check only: bake imports docker

        if public_url(image.bake.git.url) != image.bake.git.url:  # a user, a password or a bare token
            warnings.append(f"images[{i}].bake.git.url: carries a password or token: it stays out of the image, its "
                            "labels, rows and logs, but the config and the run's plan (XCom) hold it; use a deploy "
                            "key (ssh://) or git's credential helper on the workers")
    return warnings


def read_yaml(path: str | Path) -> Any:
    """A YAML file's data (libyaml where PyYAML has it); an unreadable file, another encoding, a syntax error or a
    repeated key raises `ConfigError` naming the file and line. The fleet config and the GPU catalog read this way."""
    path = Path(path)
    try:
        blob = path.read_bytes()
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read file: {exc.strerror or exc}"]) from None
    return _load_yaml(_decode(blob, str(path)), str(path))


def load_config(path: str | Path) -> FleetConfig:
    """Read and validate a fleet config file; raises `ConfigError` naming the file and field."""
    return parse_config(read_yaml(path), str(path))


# The last config `load_config_once` read: (file identity, the validated config). One entry: a process parses
# with one config at a time.
_LAST_LOADED: list[tuple[tuple, FleetConfig]] = []


def configured_fleet() -> FleetSettings | None:
    """The `fleet` settings of the fleet config the DAG uses ($FLEETBENCH_CONFIG, else include/config/fleet.yaml),
    for commands that read the warehouse outside a run (`fleetbench report`, `capacity`, `compare`, `regressions
    accept`, the UI view): they judge as the plan does. None when there is no fleet config at all (the variable
    unset and no default file); a config that cannot be read (a `FLEETBENCH_CONFIG` naming no file too) raises
    ConfigError, naming it."""
    from fleetbench.paths import default_config_path

    path = default_config_path()
    if not os.environ.get("FLEETBENCH_CONFIG") and not path.exists():
        return None
    return load_config_once(path).fleet


def load_config_once(path: str | Path) -> FleetConfig:
    """`load_config`, but a file unchanged since this process last read it is not read and validated again.

    For the DAG files: fleet_benchmark and fleetbench_maintenance both read the fleet config at parse time, and
    a DagBag of `dags/` (tests, `airflow dags test`, the parse benchmark) parses both in one process; a
    1,000-host config takes ~0.05 s to read and validate. The file is known by its path, device, inode, size,
    and modification and change times (ns): an edit, even one that keeps the size, or a file swapped in by a
    rename, is read again on the next parse. A config that fails to load is not remembered (each parse reports
    its error); the returned config is frozen (pydantic `frozen=True` models), so sharing it is safe.
    """
    try:
        st = os.stat(path)
    except OSError:
        return load_config(path)  # the same error as an uncached load
    key = (os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if _LAST_LOADED and _LAST_LOADED[0][0] == key:
        return _LAST_LOADED[0][1]
    cfg = load_config(path)
    _LAST_LOADED[:] = [(key, cfg)]
    return cfg


def _decode(blob: bytes, source: str) -> str:
    """The file's text; another encoding (e.g. Latin-1 from an old editor) is named by its first bad byte."""
    try:
        return blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(source, [f"byte {exc.start}: not UTF-8 text ({exc.reason} 0x{blob[exc.start]:02x}); "
                                   "save the file as UTF-8"]) from None


def _load_yaml(text: str, source: str) -> Any:
    """Parse with libyaml where available; syntax errors and repeated keys (all of them) name their lines."""
    loader = _YAML_LOADER(text)
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, [f"{where}: invalid YAML: {problem}"]) from None
    finally:
        loader.dispose()
    if loader.duplicate_keys:
        raise ConfigError(source, [message for *_, message in sorted(loader.duplicate_keys)])
    return data
