"""Telemetry: the in-container wrapper (`wrapper.py`, stdlib only: GPUs through NVML, the container's CPU time)
and how to ship it into a container; `rapl` reads a host's CPU energy counters."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from functools import lru_cache
from pathlib import Path

from fleetbench.telemetry.wrapper import MARKER, NvmlSource, NvmlUnavailable, Sampler, parse_report

CONTAINER_DIR = "/opt/fleetbench-telemetry"
WRAPPER = Path(__file__).with_name("wrapper.py")

__all__ = ["CONTAINER_DIR", "MARKER", "NvmlSource", "NvmlUnavailable", "Sampler", "bundle", "ensure_volume",
           "no_python_detail", "parse_report", "volume_mount", "wrap_command"]
VOLUME_PREFIX = "fleetbench-telemetry-"
VOLUME_LABEL = "org.fleetbench.telemetry"  # on the volume: its bundle digest (fleetbench.cleanup keeps the current)


@lru_cache(maxsize=1)
def bundle() -> bytes:
    """A tar of the wrapper plus nvidia-ml-py's `pynvml` module under CONTAINER_DIR: the image its volume is
    filled from (`ensure_volume`).

    pynvml goes into a `fallback/` folder that the wrapper appends to sys.path last, so an image's own
    pynvml wins. The module is found, not imported: importing it (ctypes, ~30 ms) was paid by every case task's
    process, for its file name.
    """
    from importlib.util import find_spec

    spec = find_spec("pynvml")
    if spec is None or not spec.origin:
        raise RuntimeError("the pynvml module (nvidia-ml-py) is not installed: it is shipped to the benchmark "
                           "containers with the telemetry wrapper")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for arcname, path in (("opt/fleetbench-telemetry/wrapper.py", WRAPPER),
                              ("opt/fleetbench-telemetry/fallback/pynvml.py", Path(spec.origin))):
            data = path.read_bytes()
            info = tarfile.TarInfo(arcname)
            info.size, info.mode = len(data), 0o444
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def wrap_command(command: list[str], period_s: float, gpu: bool = True) -> list[str]:
    """The case's argv under the wrapper; `gpu=False` (a CPU case) leaves NVML alone. `-S`: the wrapper needs the
    image's site-packages only for NVML, and adds them itself then (`wrapper.pynvml_path`)."""
    return ["python3", "-S", f"{CONTAINER_DIR}/wrapper.py", "--period", f"{period_s:g}", *([] if gpu else ["--no-gpu"]),
            "--", *command]


def no_python_detail(error: str, image: str | None, benchmark: str | None) -> str | None:
    """What a wrapped case's start error says when its image has no python3 (the engine could not exec the wrapper's
    interpreter: runc's `exec: "python3": executable file not found in $PATH`, crun's `executable file `python3` not
    found`), naming the setting that runs the case without the wrapper; None for any other error. The wrapper
    needs Python 3.6 or later in the image; the benchmark itself may need none (a team's own binary, nccl-tests)."""
    if "python3" not in error or not ("not found" in error or "no such file or directory" in error.lower()):
        return None
    bench = f"benchmark {benchmark!r}" if benchmark else "the case's benchmark"
    return (f"the telemetry wrapper needs python3 in the image ({image}), which has none on its PATH: set "
            f"benchmarks[].telemetry_period_s: 0 for {bench} to run it without telemetry (no measured GPU energy, "
            f"no CPU utilisation), or add python3 to the image; the engine said: {error}")


def volume_name() -> str:
    """The engine's volume with this version of the wrapper and pynvml: named by the bundle's digest, so a new
    wrapper gets a new volume and a volume never changes once it has its files."""
    return VOLUME_PREFIX + hashlib.sha256(bundle()).hexdigest()[:16]


def ensure_volume(api) -> str:
    """The volume that holds the bundle on this engine (`api`, a docker APIClient), made the first time a case of
    this wrapper version runs there. Each case then mounts it read-only instead of copying the bundle into its
    own container (`put_archive` took ~50 ms a case; `inspect_volume` a few).

    It is filled the way Docker fills any empty named volume: from the image a container mounting it is created
    from. That image is the bundle itself (`docker import` of its tar, an image only once it is whole), and the
    volume is created with its files in the same call that creates the (never started) helper container, so a
    volume of that name always holds the whole bundle. The helper and the image are removed at once; the volume
    stays for the next cases (`fleetbench cleanup` removes those of other wrapper versions)."""
    from docker.errors import NotFound
    from docker.types import Mount

    name = volume_name()
    try:
        api.inspect_volume(name)
        return name
    except NotFound:
        pass
    tag = name[len(VOLUME_PREFIX):]
    # Untagged, by its id: cases making the volume at once on one engine each use and remove their own image.
    imported = api.import_image_from_data(bundle())
    image = json.loads(imported.strip().splitlines()[-1])["status"]
    if not image.startswith("sha256:"):
        raise RuntimeError(f"importing the telemetry bundle into the engine answered {imported!r}")
    try:
        helper = api.create_container(image, command=["/never-started"], network_disabled=True,
                                      labels={VOLUME_LABEL: tag},
                                      host_config=api.create_host_config(mounts=[
                                          Mount(CONTAINER_DIR, name, type="volume", labels={VOLUME_LABEL: tag})]))
        api.remove_container(helper["Id"], force=True)
    finally:
        try:
            api.remove_image(image, force=True)
        except NotFound:
            pass
    return name


def volume_mount(api):
    """The read-only mount of the bundle's volume at CONTAINER_DIR, for a case's container on this engine."""
    from docker.types import Mount

    return Mount(CONTAINER_DIR, ensure_volume(api), type="volume", read_only=True)
