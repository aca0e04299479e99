"""Telemetry: the in-container wrapper (`wrapper.py`, stdlib only: GPUs through NVML, the container's CPU time)
and how to ship it into a container; `rapl` reads a host's CPU energy counters."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from fleetbench.telemetry.wrapper import MARKER, NvmlSource, NvmlUnavailable, Sampler, parse_report

CONTAINER_DIR = "/opt/fleetbench-telemetry"
WRAPPER = Path(__file__).with_name("wrapper.py")

__all__ = ["CONTAINER_DIR", "MARKER", "NvmlSource", "NvmlUnavailable", "Sampler", "bundle", "parse_report",
           "wrap_command"]


def bundle() -> bytes:
    """A tar of the wrapper plus nvidia-ml-py's `pynvml` module, for `put_archive(cid, "/", ...)` into a
    created container.

    pynvml goes into a `fallback/` folder that the wrapper appends to sys.path last, so an image's own
    pynvml wins.
    """
    import pynvml

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for arcname, path in (("opt/fleetbench-telemetry/wrapper.py", WRAPPER),
                              ("opt/fleetbench-telemetry/fallback/pynvml.py", Path(pynvml.__file__))):
            data = path.read_bytes()
            info = tarfile.TarInfo(arcname)
            info.size, info.mode = len(data), 0o444
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def wrap_command(command: list[str], period_s: float, gpu: bool = True) -> list[str]:
    """The case's argv under the wrapper; `gpu=False` (a CPU case) leaves NVML alone."""
    return ["python3", f"{CONTAINER_DIR}/wrapper.py", "--period", f"{period_s:g}", *([] if gpu else ["--no-gpu"]),
            "--", *command]
