"""Every failure class a case row can carry: its name, what it means, and where it is produced.

One vocabulary for the CLI (`fleetbench parse`), the warehouse (`failure_class`), the report and
README. A name not listed here is a bug (a test checks every producer against this table).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FailureClass:
    name: str
    meaning: str
    produced_by: str  # module (and step) that names it
    permanent: bool = False  # another attempt of the same step cannot fix it (no retry)


_CLASSES = [
    # host validation (fleetbench.hosts.check, fleetbench.hosts)
    FailureClass("host_unfit", "the host failed a check (see host_facts.checks_json); its cases were skipped",
                 "measure.case_fields"),
    FailureClass("host_check_failed", "host validation did not finish (its lane's task failed first)",
                 "measure.case_fields"),
    # the case's devices on its host (fleetbench.hosts.devices)
    FailureClass("mig_enabled", "skipped: the case needs whole GPUs, and MIG is enabled on too many of its host's "
                 "GPUs (for a multi-node case, of a host of its set; a GPU in MIG mode runs only its MIG instances); "
                 "the detail lists them", "devices.assign"),
    FailureClass("mig_unavailable", "skipped: the case asks for MIG instances of a profile the host has fewer of "
                 "(or no GPU in MIG mode, or its MIG devices unknown); the detail lists what the host has",
                 "devices.assign"),
    FailureClass("too_few_gpus", "skipped: the case asks for more whole GPUs than its host has (for a multi-node case, "
                 "a host of its set); the host's smaller cases run; the detail names both counts", "devices.assign"),
    FailureClass("driver_too_old", "skipped: the host's NVIDIA driver cannot run the CUDA version of the case's image "
                 "(`images[].cuda`), not even through minor-version or forward compatibility; the detail names the "
                 "driver it needs (update the driver, or use an image of an older CUDA)", "devices.assign"),
    # images (fleetbench.images, fleetbench.bake, fleetbench.prepare)
    FailureClass("image_not_found", "the registry has no such repository, tag or digest, or no image of the host's "
                 "platform under that tag (a manifest list without linux/arm64, say); or pull_policy 'never' and not "
                 "on the host", "images.prepare_image", permanent=True),
    FailureClass("registry_unreachable", "the registry did not answer (after bounded retries)", "images.prepare_image"),
    FailureClass("registry_auth", "the registry refused the credentials, or none were given where it needs them",
                 "images.prepare_image", permanent=True),
    FailureClass("insufficient_disk", "Docker's data root has less free space than min_free_gb (refused before "
                 "pulling or baking), or the disk filled during a pull", "images.check_disk", permanent=True),
    FailureClass("docker_unreachable", "the host's Docker engine did not answer (or refused the TLS certificate)",
                 "images.prepare_image, pipeline.prepare_host_images"),
    FailureClass("bake_failed", "the bake step (copy, git checkout, setup command or commit) failed", "bake"),
    FailureClass("pull_failed", "the pull failed for another reason (see the detail)", "images.prepare_image"),
    # the case's container (fleetbench.airflow.operators, fleetbench.measure.classify)
    FailureClass("no_gpu_runtime", "the engine has no NVIDIA runtime for a GPU case", "operators.start_error_class"),
    FailureClass("container_config", "the engine refused the container's settings (e.g. a ulimit)",
                 "operators.start_error_class"),
    FailureClass("killed", "the task was killed from Airflow, or the container by SIGKILL without an OOM kill",
                 "measure.classify"),
    FailureClass("timeout", "the case passed its timeout_s and was stopped", "measure.classify"),
    FailureClass("engine_unreachable", "the Docker engine stopped answering while the case ran", "measure.classify"),
    FailureClass("oom_killed", "the kernel OOM-killed the container (host or container memory)", "measure.classify"),
    FailureClass("core_dump", "the harness crashed (SIGABRT / SIGSEGV, core dumped)", "measure.classify"),
    FailureClass("nonzero_exit", "the harness exited non-zero for another reason", "measure.classify"),
    FailureClass("task_failed", "the case's task failed before reporting (see its task log)",
                 "measure.case_fields"),
    # multi-node cases (fleetbench.airflow.multinode)
    FailureClass("peer_failed", "another container of a multi-node case (a worker or ps, named in the detail "
                 "with its own class) failed; every container of the case was stopped", "multinode.run_case"),
    FailureClass("rendezvous_timeout", "the chief of a multi-node case did not join its cluster within "
                 "rendezvous_timeout_s; every container of the case was stopped", "multinode.run_case"),
    FailureClass("port_unavailable", "no free port for a role of a multi-node case on its host (tried from "
                 "base_port on)", "multinode.run_case"),
    FailureClass("image_mismatch", "the hosts of a multi-node case's set pinned different images of its `image` (the "
                 "tag moved between their pulls, or one kept an older copy under pull_policy if-missing, or another "
                 "bake); the detail lists each host's digest", "multinode.set_problem"),
    FailureClass("mixed_gpu_models", "skipped: the hosts of a multi-node case's set have different GPU models "
                 "(set mixed_gpu_models to run them anyway)", "multinode.set_problem"),
    # the plan's capacity profile (fleetbench.capacity)
    FailureClass("predicted_oom", "skipped: its capacity profile predicts (or an OOM on record shows) more memory "
                 "than the host's GPU or the container's limit; the prediction is in the detail",
                 "capacity.assess, measure.case_fields"),
    # what the log says (fleetbench.parsing, mapped by measure.classify)
    FailureClass("gpu_oom", "the framework ran out of GPU memory (ResourceExhausted, CUDA out of memory)",
                 "parsing (log 'oom')"),
    FailureClass("nccl", "NCCL reported an error (a failed or aborted nccl-tests run, Test NCCL failure)",
                 "parsing, parsing.nccl"),
    FailureClass("wrong_results", "nccl-tests found wrong values (Out of bounds values : N FAILED, #wrong > 0)",
                 "parsing.nccl"),
    FailureClass("cuda_error", "a GPU fault: a CUDA call failed under NCCL (NCCL WARN Cuda failure, Test CUDA "
                 "failure, Test NCCL failure 'unhandled cuda error'), or the framework's (an illegal memory access, "
                 "an unspecified launch failure, an uncorrectable ECC error)",
                 "parsing.nccl, parsing"),
    FailureClass("import_error", "the harness could not import what it needs", "parsing"),
    FailureClass("cuda_driver", "the driver is too old for the image's CUDA, or CUDA could not initialise", "parsing"),
    FailureClass("no_result", "exited 0 (or with an unknown status) but printed no (valid) primary metric",
                 "measure.classify"),
    FailureClass("other_error", "the log shows an error fleetbench has no name for", "parsing"),
    # the warehouse (fleetbench.warehouse.fit)
    FailureClass("store_error", "a value of the row could not be stored as measured (named in the detail)",
                 "warehouse.fit"),
]

FAILURE_CLASSES: dict[str, FailureClass] = {c.name: c for c in _CLASSES}
PERMANENT = frozenset(c.name for c in _CLASSES if c.permanent)

# The log parsers' names for what a log shows -> the row's failure class ("oom" in a log is the framework's GPU OOM).
LOG_CLASSES = {"oom": "gpu_oom", "nccl": "nccl", "import_error": "import_error", "cuda_driver": "cuda_driver",
               "cuda_error": "cuda_error", "no_result": "no_result", "other_error": "other_error"}


# The log classes that fail a case by themselves; the others (other_error, no_result) only explain an exit.
FAILING_LOG_CLASSES = ("oom", "nccl", "cuda_error", "import_error", "cuda_driver")


def row_class(log_class: str | None) -> str | None:
    """A parser's failure class as the warehouse names it."""
    return LOG_CLASSES.get(log_class, log_class) if log_class else None


def meaning(name: str) -> str:
    return FAILURE_CLASSES[name].meaning if name in FAILURE_CLASSES else "unknown failure class"
