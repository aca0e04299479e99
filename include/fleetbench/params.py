"""Trigger parameters of fleet_benchmark: their JSON schema (for Airflow's trigger form, checked at
trigger time) and how they narrow or override the fleet config for one run.

Nothing from a parameter reaches a command line unless it passes the schema here (enums of the
config's host and model names, strict patterns) and then the fleet config's own validation again.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fleetbench.config import IMAGE_REF_PATTERN, MAX_NUM_BATCHES, NAME_PATTERN, ConfigError, FleetConfig, parse_config
from fleetbench.registry import registry_of, repository_of

log = logging.getLogger(__name__)

DEFAULTS: dict[str, Any] = {
    "hosts": [], "models": [], "batch_sizes": [], "num_gpus": [], "image": None, "num_batches": None, "dry_run": False,
    "force_cases": [], "accept_baselines": [],
}
# A `force_cases` item: a case_key (on every host) or host/case_key. A multi-node case's key names its set of
# hosts with `+` (`<point>.n2.gpu-01+gpu-02`, fleetbench.multinode.set_case_key).
CASE_KEY = r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,249}"
FORCE_CASE_PATTERN = r"^([A-Za-z0-9][A-Za-z0-9_.-]{0,99}/)?" + CASE_KEY + "$"
# An `accept_baselines` item: a host (every case of it) or host/case_key.
CASE_KEY_PART = r"(/" + CASE_KEY + ")?"
ACCEPT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}" + CASE_KEY_PART + "$"



# Up to this many hosts, the trigger form offers the host names: a multi-select (Airflow's form draws one for an
# array with `examples`) and an enum of the items, checked at trigger time. The form sends null for a
# multi-select emptied again, so null is allowed and means "all", as [] does.
# Airflow deep-copies the DAG's params into every task at parse time, so a 1,000-name enum would
# cost seconds of parse time; larger fleets get the strict name pattern at trigger time and the
# check against the config when the run starts (the plan task fails naming the unknown host).
MAX_HOST_ENUM = 100
# The schemas are JSON Schema draft-07 (same keywords, same meaning here): every task carries the
# DAG's params, and serializing them re-checks each schema against its meta-schema, ~3x slower for
# the default 2020-12 one (README "Scale notes").
DIALECT = {"$schema": "http://json-schema.org/draft-07/schema#"}


def param_specs(cfg: FleetConfig) -> dict[str, dict]:
    """name -> {default, schema, title, description}; the DAG wraps each in `airflow.sdk.Param`."""
    hosts = [h.name for h in cfg.hosts]
    models = sorted({m for b in cfg.benchmarks for m in b.models or []})
    host_item = {"type": "string", "pattern": NAME_PATTERN}
    host_choices = {}
    if len(hosts) <= MAX_HOST_ENUM:
        host_item["enum"] = hosts
        host_choices["examples"] = hosts
    specs = {
        "hosts": {"default": [], "title": "Hosts", "description": "Run only these hosts (empty: every host).",
                  "schema": {"type": ["array", "null"], "uniqueItems": True, "items": host_item, **host_choices}},
        "models": {"default": [], "title": "Models", "description": "Run only these models (empty: every model).",
                   "schema": {"type": ["array", "null"], "uniqueItems": True, "examples": models,
                              "items": {"type": "string", "pattern": NAME_PATTERN, "enum": models}}},
        "batch_sizes": {"default": [], "title": "Batch sizes per device",
                        "description": "Run these batch sizes instead of the configured ones (empty: as configured).",
                        "schema": {"type": ["array", "null"], "uniqueItems": True,
                                   "items": {"type": "integer", "minimum": 1, "maximum": 65536}}},
        "num_gpus": {"default": [], "title": "GPU counts",
                     "description": "Run GPU benchmarks with these GPU counts (empty: as configured).",
                     "schema": {"type": ["array", "null"], "uniqueItems": True,
                                "items": {"type": "integer", "minimum": 1, "maximum": 64}}},
        "image": {"default": None, "title": "Image override",
                  "description": "Run every benchmark with this image reference instead of the configured one "
                                 "(as each image's allow_override permits; an overridden image is not baked).",
                  "schema": {"type": ["null", "string"], "pattern": IMAGE_REF_PATTERN, "maxLength": 500}},
        "num_batches": {"default": None, "title": "Number of batches",
                        "description": "Run the tf_cnn_benchmarks and torch_synthetic benchmarks with this many "
                                       "batches. A case run with another number than its benchmark's is a case of "
                                       "its own (<case_key>.nb<N>), apart from the nightly's history.",
                        "schema": {"type": ["null", "integer"], "minimum": 1, "maximum": MAX_NUM_BATCHES}},
        "force_cases": {"default": [], "title": "Force cases",
                        "description": "Run these cases even when their capacity profile predicts an OOM: "
                                       "case_key (every host) or host/case_key.",
                        "schema": {"type": ["array", "null"], "uniqueItems": True, "maxItems": 1000,
                                   "items": {"type": "string", "pattern": FORCE_CASE_PATTERN, "maxLength": 360}}},
        "accept_baselines": {
            "default": [], "title": "Accept new baselines",
            "description": "After this run's results are stored and compared: accept the current level of these "
                           "hosts' cases as their new baseline, as `fleetbench regressions accept` does (host: "
                           "every case of it; host/case_key: one case). Their open regressions close.",
            "schema": {"type": ["array", "null"], "uniqueItems": True, "maxItems": 1000,
                       "items": {"type": "string", "pattern": accept_pattern(hosts), "maxLength": 360}}},
        "dry_run": {"default": False, "title": "Dry run",
                    "description": "Validate the hosts and print the plan; pull and run nothing, store nothing.",
                    "schema": {"type": "boolean"}},
    }
    for spec in specs.values():
        spec["schema"] = {**DIALECT, **spec["schema"]}
    return specs


def accept_pattern(hosts: list[str]) -> str:
    """The pattern of an `accept_baselines` item: with at most MAX_HOST_ENUM hosts only the config's host names
    pass (an unknown host is refused at trigger time), else any host name (checked when the run starts)."""
    if not hosts or len(hosts) > MAX_HOST_ENUM:
        return ACCEPT_PATTERN
    names = "|".join(h.replace(".", "\\.") for h in hosts)  # names are [A-Za-z0-9_.-]: only "." is special
    return f"^({names})" + CASE_KEY_PART + "$"


NAMES_SHOWN = 20


def names(known) -> str:
    """The first NAMES_SHOWN names, sorted, and how many there are in all (a 1,000-host fleet's list was 10 KB)."""
    ordered = sorted(known)
    more = f", ... ({len(ordered)} in all)" if len(ordered) > NAMES_SHOWN else ""
    return ", ".join(ordered[:NAMES_SHOWN]) + more


def accept_targets(items: list[str]) -> list[tuple[str, str | None]]:
    """`accept_baselines` items as (host, case_key or None: every case of the host)."""
    out = []
    for item in items:
        host, _, case_key = item.partition("/")
        out.append((host, case_key or None))
    return out


def whole_numbers(params: dict | None) -> dict | None:
    """The run's parameters with a whole `num_batches` sent as a float (`20.0`: JSON Schema, as Airflow's trigger check
    applies it, counts it as an integer; a REST client or `-c` conf may send one) as the integer: the plan's case keys
    and the check below read it so. The list parameters' floats become integers in the config's own validation."""
    batches = (params or {}).get("num_batches")
    if isinstance(batches, float) and batches.is_integer():
        return {**params, "num_batches": int(batches)}
    return params


def apply_params(cfg: FleetConfig, params: dict | None, source: str = "params") -> FleetConfig:
    """The fleet config narrowed and overridden by a run's parameters, validated again as a whole.

    `hosts` keeps the hosts and only drops the benchmarks that run on none of them: the plan takes the cases of
    those hosts (`plan.build_plan`), from multi-node sets formed as configured, not paired anew. `num_batches` is
    checked here and applied by the plan too, which knows each benchmark's own number (a case run with another
    has a key of its own, `plan.batches_case_key`).
    Raises ConfigError naming the parameter and the value (unknown host or model, bad values).
    """
    params = {**DEFAULTS, **{k: v for k, v in (whole_numbers(params) or {}).items()
                             if v is not None or k in ("image", "num_batches")}}
    unknown = sorted(set(params) - set(DEFAULTS))
    errors = [f"{name}: unknown parameter" for name in unknown]
    known_hosts = {h.name for h in cfg.hosts}
    known_models = {m for b in cfg.benchmarks for m in b.models or []}
    for name, known, what in (("hosts", known_hosts, "host"), ("models", known_models, "model")):
        for i, value in enumerate(params[name] or []):
            if value not in known:
                errors.append(f"{name}[{i}]: unknown {what} {value!r} (known: {names(known)})")
    batches = params["num_batches"]
    if batches is not None and (isinstance(batches, bool) or not isinstance(batches, int)
                                or not 1 <= batches <= MAX_NUM_BATCHES):
        errors.append(f"num_batches: must be an integer from 1 to {MAX_NUM_BATCHES}, got {batches!r}")
    force = params["force_cases"]
    if not isinstance(force, list):
        errors.append(f"force_cases: must be a list of case keys, not {force!r}")
    else:
        errors += [f"force_cases[{i}]: {v!r} is not a case_key or host/case_key" for i, v in enumerate(force)
                   if not isinstance(v, str) or not re.fullmatch(FORCE_CASE_PATTERN, v)]
    accept = params["accept_baselines"]
    if not isinstance(accept, list):
        errors.append(f"accept_baselines: must be a list of hosts or host/case_key, not {accept!r}")
    else:
        for i, v in enumerate(accept):
            if not isinstance(v, str) or not re.fullmatch(ACCEPT_PATTERN, v):
                errors.append(f"accept_baselines[{i}]: {v!r} is not a host or host/case_key")
            elif v.partition("/")[0] not in known_hosts:
                errors.append(f"accept_baselines[{i}]: unknown host {v.partition('/')[0]!r} "
                              f"(known: {names(known_hosts)})")
    if errors:
        raise ConfigError(source, errors)

    data = cfg.model_dump(mode="json", by_alias=True, exclude_none=True)
    asked = set(params["hosts"] or [])
    benchmarks = []
    for bench in data["benchmarks"]:
        if asked and asked.isdisjoint(bench["hosts"] if bench.get("hosts") is not None else known_hosts):
            continue
        if params["models"]:  # a benchmark without models (nccl_tests, command) is not among those asked for
            bench["models"] = [m for m in bench.get("models") or [] if m in params["models"]]
            if not bench["models"]:
                continue
        if params["batch_sizes"] and bench.get("batch_sizes"):
            bench["batch_sizes"] = list(params["batch_sizes"])
        if params["num_gpus"] and bench.get("device", "gpu") == "gpu":
            bench["num_gpus"] = list(params["num_gpus"])
        benchmarks.append(bench)
    if not benchmarks:
        raise ConfigError(source, ["no benchmark is left after applying hosts and models"])
    data["benchmarks"] = benchmarks
    if params["image"]:  # in place of the images the run's benchmarks use; an image none of them uses is not run
        used = {bench["image"] for bench in benchmarks}
        errors = [e for i, image in enumerate(data["images"])
                  if image["name"] in used and (e := override_image(image, params["image"], i))]
        if errors:
            raise ConfigError(source, errors)
    try:
        return parse_config(data, source)
    except ConfigError as exc:
        raise ConfigError(source, [f"after applying the run's parameters: {e}" for e in exc.errors]) from None


def override_image(image: dict, ref: str, index: int) -> str | None:
    """Put the `image` parameter in place of one configured image (a dict of ImageSpec), as its
    `allow_override` permits; returns the error, or None when done.

    The overridden image is never baked or pushed (its bake is dropped), and it keeps the configured
    registry credentials only when it lives on the same registry: anything else is pulled anonymously. Its
    configured `cuda` is dropped too (it is the configured ref's): no driver-vs-CUDA check judges the override.
    """
    if not re.fullmatch(IMAGE_REF_PATTERN, ref):  # not a reference: the config's own check names it
        image["ref"] = ref
        return None
    policy, configured = image.get("allow_override", "same_repository"), image["ref"]
    where = f"image: {ref!r} cannot replace images[{index}] ({image['name']}, {configured!r})"
    if policy == "none":
        return f"{where}: its allow_override is 'none'"
    if policy == "same_repository" and repository_of(ref) != repository_of(configured):
        return (f"{where}: its allow_override is 'same_repository' and {repository_of(ref)} is not "
                f"{repository_of(configured)} (set allow_override: any to allow other repositories)")
    if registry_of(ref) != registry_of(configured):
        image.pop("credentials_conn_id", None)
    if image.get("cuda"):  # the configured ref's CUDA, not this one's: the driver check would judge the wrong one
        log.warning("image: the CUDA version of %s is not known (images[%d].cuda %s is the configured %s's): the "
                    "driver-vs-CUDA check does not judge it", ref, index, image["cuda"], configured)
        image["cuda"] = None
    image.pop("bake", None)
    image["ref"] = ref
    return None
