"""Telemetry around a benchmark command: `python3 -S wrapper.py [--period 0.5] [--no-gpu] -- CMD ARGS...`.

Runs inside the benchmark container, so it is one stdlib-only file that Python 3.6 runs (TensorFlow 1.15 and
early 2.x images have 3.6; so no `from __future__ import annotations`, and annotations that name generics are
strings). It starts the
command as a child, passes its output and exit code through unchanged, forwards SIGTERM/SIGINT to
it, samples every visible GPU through NVML every `period` seconds (power, utilisation, memory used,
SM clock, temperature; energy from NVML's total-energy counter where the GPU has one, else the
trapezoid integral of power), and prints one final line:

    FLEETBENCH_TELEMETRY {"nvml": true, "energy_source": "measured", "gpus": [...], "cpu": {...}, ...}

Without NVML (no driver, CPU hosts, an image's own pynvml that lacks a call, a GPU that answers with an error)
the line says `"nvml": false` and why, and the command runs all the same; sampling that fails mid-run stops,
says why (`sampling_error`) and keeps what it had. `--no-gpu` (CPU cases)
leaves NVML alone, so a CPU case on a GPU host does not report the idle GPUs. All NVML calls go
through one small seam (`NvmlSource`); tests drive the sampler with a fake source.

`cpu` is the container's CPU time over the command (`usage_s`, from its cgroup: cgroup v2
`cpu.stat` usage_usec or v1 `cpuacct.usage`, else the waited-for children's rusage), the command's
wall time, the logical CPUs the host has, its sockets and their model name: what a CPU case's energy is
estimated from (TDP x utilisation, `fleetbench.metrics`).

Every case pays the wrapper's start before its command runs, so a CPU case's wrapper imports nothing beyond
`os`, `sys`, `time` and the signal functions: `subprocess` (through `locale`, `re` and `enum`), `json` (through
`re`) and `threading` took ~18 ms of the ~28 ms the wrapper took in a stock Python 3.11 image, where the
interpreter alone starts in ~10 ms. The command starts through `os.posix_spawnp` (Python 3.8+; `subprocess` on
3.6 and 3.7, and wherever posix_spawnp refuses it), the report is written by `_dumps` (what `json.dumps` writes,
tested against it), and the GPU path imports `threading` when it samples.
"""

import os
import sys
import time

try:  # the C module under `signal`: the same functions, without `signal`'s enum classes (~4 ms to import)
    import _signal as signal
except ImportError:  # an interpreter without it
    import signal

MARKER = "FLEETBENCH_TELEMETRY "
FALLBACK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fallback")


def pynvml_path() -> None:
    """Where `import pynvml` looks: the image's site-packages first, then nvidia-ml-py's pynvml shipped next to
    this file. Cases start the wrapper with `python3 -S` (no site-packages: the interpreter starts ~20 ms
    sooner in a stock Python image, and a CPU case never needs them); the GPU path adds them here."""
    if sys.flags.no_site:
        import site

        site.main()
    if FALLBACK not in sys.path:
        sys.path.append(FALLBACK)


class NvmlUnavailable(Exception):
    """NVML cannot be used here (no library, no driver): telemetry says so and the benchmark runs anyway."""


class NvmlSource:
    """The seam: everything fleetbench asks NVML. One instance per process."""

    def __init__(self):
        pynvml_path()
        try:
            import pynvml  # nvidia-ml-py's module (the image's own, else the copy mounted next to this file)
        except ImportError as exc:
            raise NvmlUnavailable(f"pynvml not importable: {exc}") from None
        self.nv = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"nvmlInit failed: {exc}") from None
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    def devices(self) -> "list[dict]":
        out = []
        for i, h in enumerate(self.handles):
            name = self.nv.nvmlDeviceGetName(h)
            uuid = self.nv.nvmlDeviceGetUUID(h)
            out.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                        "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid})
        return out

    def _try(self, fn, *args):
        try:
            return fn(*args)
        except self.nv.NVMLError:  # NotSupported on this GPU, or a transient error: leave the value out
            return None

    def sample(self, index: int) -> dict:
        h, nv = self.handles[index], self.nv
        power = self._try(nv.nvmlDeviceGetPowerUsage, h)
        util = self._try(nv.nvmlDeviceGetUtilizationRates, h)
        mem = self._try(nv.nvmlDeviceGetMemoryInfo, h)
        return {
            "power_w": power / 1000.0 if power is not None else None,
            "util_pct": float(util.gpu) if util is not None else None,
            "mem_used_mib": mem.used / 2**20 if mem is not None else None,
            "sm_clock_mhz": self._try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
            "temp_c": self._try(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
        }

    def energy_mj(self, index: int):
        """Total energy since the driver loaded (mJ), Volta and newer; None where unsupported (or where the image's
        own pynvml is too old to ask: nvidia-ml-py3 7.352 has no such call)."""
        call = getattr(self.nv, "nvmlDeviceGetTotalEnergyConsumption", None)
        return None if call is None else self._try(call, self.handles[index])

    def close(self) -> None:
        self._try(self.nv.nvmlShutdown)


class GpuTrack:
    """Running statistics of one GPU: no sample list is kept, so memory stays flat on long runs."""

    FIELDS = ("power_w", "util_pct", "mem_used_mib", "sm_clock_mhz", "temp_c")

    def __init__(self, device: dict, energy_start_mj):
        self.device = device
        self.energy_start_mj = energy_start_mj
        self.energy_end_mj = None
        self.n = 0
        self.sums = dict.fromkeys(self.FIELDS, 0.0)
        self.counts = dict.fromkeys(self.FIELDS, 0)
        self.peaks = dict.fromkeys(self.FIELDS)
        self.trapezoid_j = 0.0
        self._first_t = None  # when the first power reading came
        self._last = None  # (t, power_w)

    def add(self, t: float, sample: dict) -> None:
        self.n += 1
        for key in self.FIELDS:
            value = sample.get(key)
            if value is None:
                continue
            self.sums[key] += value
            self.counts[key] += 1
            if self.peaks[key] is None or value > self.peaks[key]:
                self.peaks[key] = value
        power = sample.get("power_w")
        if power is not None:
            if self._first_t is None:
                self._first_t = t
            if self._last is not None:
                t0, p0 = self._last
                self.trapezoid_j += (t - t0) * (p0 + power) / 2.0
            self._last = (t, power)

    def summary(self, window=None, period_s=None) -> dict:
        """`window`: (start, stop) of the sampling; the power integral stands for the run's energy only when its
        readings cover it, to within two periods at either end (a GPU lost mid-run, its counter unreadable too:
        the integral of its first second was stored as the run's measured energy)."""
        mean = {k: (self.sums[k] / self.counts[k] if self.counts[k] else None) for k in self.FIELDS}
        counter_ok = (self.energy_start_mj is not None and self.energy_end_mj is not None
                      and self.energy_end_mj >= self.energy_start_mj)
        covered = self.counts["power_w"] >= 2
        if covered and window is not None and period_s is not None:
            slack = 2 * period_s + 0.05
            covered = self._first_t - window[0] <= slack and window[1] - self._last[0] <= slack
        return {
            **self.device,
            "samples": self.n,
            "mean_power_w": _round(mean["power_w"]),
            "peak_power_w": _round(self.peaks["power_w"]),
            "mean_util_pct": _round(mean["util_pct"]),
            "peak_mem_used_mib": _round(self.peaks["mem_used_mib"]),
            "mean_sm_clock_mhz": _round(mean["sm_clock_mhz"]),
            "max_temp_c": self.peaks["temp_c"],
            "energy_j": (_round((self.energy_end_mj - self.energy_start_mj) / 1000.0) if counter_ok
                         else _round(self.trapezoid_j) if covered else None),
            "energy_method": "counter" if counter_ok else "trapezoid" if covered else None,
        }


def _round(value, digits: int = 3):
    return None if value is None else round(value, digits)


def _sum_or_none(values):
    """The sum of the known values; None when no GPU gave one (an unknown is not a zero)."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


# CPU time of the sampling thread alone (Python >= 3.7); Python 3.6 has only the process's.
_thread_time = getattr(time, "thread_time", time.process_time)


class Sampler:
    """Samples every GPU of `source` every `period_s` seconds on a background thread."""

    def __init__(self, source, period_s: float = 0.5, clock=time.monotonic):
        import threading

        self.source = source
        self.period_s = period_s
        self.clock = clock
        self.tracks = [GpuTrack(d, source.energy_mj(d["index"])) for d in source.devices()]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fleetbench-telemetry", daemon=True)
        self.started = self.stopped = None
        self.cpu_s = 0.0
        self.error = None  # why sampling stopped early, if it did

    def sample_once(self) -> None:
        t = self.clock()
        for track in self.tracks:
            track.add(t, self.source.sample(track.device["index"]))

    def _loop(self) -> None:
        cpu0 = _thread_time()
        next_t = self.clock()
        try:
            while not self._stop.is_set():
                self.sample_once()
                next_t += self.period_s
                self._stop.wait(max(0.0, next_t - self.clock()))
        except Exception as exc:  # a GPU lost mid-run, a call the image's pynvml lacks: the benchmark goes on
            self.error = f"{type(exc).__name__}: {exc}"
        self.cpu_s = _thread_time() - cpu0

    def start(self) -> "Sampler":
        self.started = self.clock()
        self._thread.start()
        return self

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        try:
            if self.error is None:
                self.sample_once()  # the last point closes the power integral at the command's end
            for track in self.tracks:
                track.energy_end_mj = self.source.energy_mj(track.device["index"])
        except Exception as exc:
            self.error = self.error or f"{type(exc).__name__}: {exc}"
        self.stopped = self.clock()
        return self.summary()

    def summary(self) -> dict:
        now = self.clock()
        window = (now if self.started is None else self.started, now if self.stopped is None else self.stopped)
        gpus = [t.summary(window, self.period_s) for t in self.tracks]
        energies = [g["energy_j"] for g in gpus]
        wall = (now if self.stopped is None else self.stopped) - (now if self.started is None else self.started)
        return {
            "nvml": True,
            "energy_source": "measured" if gpus and all(e is not None for e in energies) else "none",
            "period_s": self.period_s,
            "duration_s": _round(wall),
            "energy_j": _round(sum(energies)) if gpus and all(e is not None for e in energies) else None,
            "mean_power_w": _round(_sum_or_none(g["mean_power_w"] for g in gpus)),
            "peak_mem_used_mib": _round(max((g["peak_mem_used_mib"] for g in gpus
                                             if g["peak_mem_used_mib"] is not None), default=None)),
            "sampler_cpu_s": _round(self.cpu_s, 4),
            "gpus": gpus,
            **({"sampling_error": self.error} if self.error else {}),
        }


# The container's own CPU time: (path, field or None, seconds per unit). In a container the cgroup
# mounted at /sys/fs/cgroup is the container's own (cgroup namespace on v2, a bind of its group on v1).
CGROUP_CPU = (("/sys/fs/cgroup/cpu.stat", "usage_usec", 1e-6),
              ("/sys/fs/cgroup/cpuacct/cpuacct.usage", None, 1e-9),
              ("/sys/fs/cgroup/cpu,cpuacct/cpuacct.usage", None, 1e-9))


def cgroup_cpu_s(files=CGROUP_CPU):
    """(CPU seconds the cgroup has used, which file) or (None, None) where no cgroup file is readable."""
    for path, key, scale in files:
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            continue
        for line in text.splitlines():
            parts = line.split()
            if key is None and len(parts) == 1 and parts[0].isdigit():
                return int(parts[0]) * scale, path
            if key is not None and len(parts) == 2 and parts[0] == key and parts[1].isdigit():
                return int(parts[1]) * scale, path
    return None, None


def children_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_info(path="/proc/cpuinfo"):
    """(the first `model name` (x86) or `Model` of /proc/cpuinfo, the number of distinct `physical id`s: the
    sockets); None for what it does not say."""
    model, sockets = None, set()
    try:
        with open(path, errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key in ("model name", "Model") and value and model is None:
                    model = value
                elif key == "physical id" and value:
                    sockets.add(value)
    except OSError:
        pass
    return model, len(sockets) or None


class CpuMeter:
    """The container's CPU time and the command's wall time, from `start` to `stop`."""

    def __init__(self, clock=time.monotonic, files=CGROUP_CPU):
        self.clock, self.files = clock, files
        self.t0 = self.clock()
        self.cg0, self.cg_path = cgroup_cpu_s(files)

    def stop(self) -> dict:
        wall = self.clock() - self.t0
        cg1, _ = cgroup_cpu_s(self.files) if self.cg0 is not None else (None, None)
        if cg1 is not None and cg1 >= self.cg0:
            usage, source = cg1 - self.cg0, "cgroup"
        else:
            usage, source = children_cpu_s(), "rusage"
        model, sockets = cpu_info()
        return {"usage_s": _round(usage, 4), "wall_s": _round(wall, 4), "count": os.cpu_count(), "sockets": sockets,
                "model": model, "source": source, "path": self.cg_path if source == "cgroup" else None}


# Signals that Python ignores and a child would inherit ignored: set back to their default in the child, as
# subprocess does (`restore_signals`); a benchmark's shell pipeline ends on SIGPIPE as it would outside the wrapper.
RESTORED_SIGNALS = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, name))


class Child:
    """The command as a child process with the wrapper's stdio and environment, as `subprocess.Popen(command)`
    starts it: no descriptor but stdio inherited, ignored signals back at their default. Through posix_spawnp where
    Python has it (3.8+), else, or when it fails, through Popen itself."""

    def __init__(self, command: "list[str]"):
        self.code = None
        self._popen = None
        spawn = getattr(os, "posix_spawnp", None)  # Python 3.8+
        if spawn is not None:
            _no_inherited_descriptors()
            try:
                self.pid = spawn(command[0], command, os.environ, setsigdef=RESTORED_SIGNALS)
                return
            except (OSError, ValueError):
                # Whatever posix_spawnp refuses goes to Popen, which then starts the command or says why as it
                # always did: a seccomp profile that denies glibc's clone3 with EPERM (Docker's before 20.10.10;
                # Popen forks), a file on PATH that is not a program ahead of the real one (Popen tries the next
                # PATH entry, posix_spawnp stops), an empty program name (ValueError).
                pass
        import subprocess

        self._popen = subprocess.Popen(command)
        self.pid = self._popen.pid

    def send_signal(self, signum: int) -> None:
        if self.code is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def wait(self) -> int:
        """Its exit code, or 128 + the signal that ended it."""
        if self._popen is not None:
            code = self._popen.wait()
            self.code = 128 - code if code < 0 else code
            return self.code
        _, status = os.waitpid(self.pid, 0)
        self.code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        return self.code


def _no_inherited_descriptors() -> None:
    """Descriptors above stdio close at the child's exec (`Popen`'s close_fds): Python opens its own so, a C
    library (NVML's device files) may not."""
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except (OSError, ValueError):
        return
    for fd in fds:
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:  # the listing's own descriptor, closed since
                pass


def _dumps(value) -> str:
    """`json.dumps(value, separators=(",", ":"))` for the report's types (dict, list, tuple, str, int, float, bool,
    None), without importing `json`."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "Infinity" if value > 0 else "-Infinity"
        return float.__repr__(value)
    if isinstance(value, str):
        return _dumps_str(value)
    if isinstance(value, dict):
        # keys as json.dumps converts them: a str as it is, an int, float, bool or None as its JSON text
        return "{" + ",".join(_dumps_str(k if isinstance(k, str) else _dumps(k)) + ":" + _dumps(v)
                              for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_dumps(v) for v in value) + "]"
    raise TypeError("Object of type %s is not JSON serializable" % type(value).__name__)


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _dumps_str(text: str) -> str:
    """A JSON string as `json.dumps` writes it (ensure_ascii): every character outside ' '..'~' as an escape."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif code < 0x20 or code > 0x7E:
            if code >= 0x10000:  # a surrogate pair
                code -= 0x10000
                out.append("\\u%04x\\u%04x" % (0xD800 | (code >> 10), 0xDC00 | (code & 0x3FF)))
            else:
                out.append("\\u%04x" % code)
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def run(command: "list[str]", period_s: float, source_factory=NvmlSource, gpu: bool = True) -> int:
    """Run `command` under telemetry; returns its exit code (128 + signal when a signal ended it)."""
    source = sampler = None
    if not gpu:
        unavailable = "a CPU case: GPUs not sampled"
    else:
        try:
            source = source_factory()
            sampler = Sampler(source, period_s).start()
            unavailable = None
        except NvmlUnavailable as exc:
            unavailable = str(exc)
        except Exception as exc:  # e.g. NVMLError_GPUIsLost opening a GPU: no telemetry, the benchmark still runs
            unavailable = f"NVML could not be read: {type(exc).__name__}: {exc}"
            if source is not None:
                try:
                    source.close()
                except Exception:
                    pass
            source = None
    cpu = CpuMeter()
    try:
        child = Child(command)
    except OSError as exc:
        print(f"fleetbench telemetry: cannot start {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        code = 127
        child = None
    if child is not None:
        def forward(signum, _frame):
            child.send_signal(signum)

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, forward)
        code = child.wait()
    cpu_report = cpu.stop()
    if sampler is not None:
        report = sampler.stop()
        source.close()
    else:
        report = {"nvml": False, "reason": unavailable, "energy_source": "none", "gpus": []}
    report["cpu"] = cpu_report
    sys.stdout.flush()
    print(MARKER + _dumps(report), flush=True)
    return code


def parse_report(text: str):
    """The last telemetry line of a log, as a dict (None when there is none or it is cut)."""
    import json

    for line in reversed(text.splitlines()):
        at = line.find(MARKER)
        if at >= 0:
            try:
                return json.loads(line[at + len(MARKER):])
            except (ValueError, RecursionError):  # cut, or nested past the parser's depth: no report
                return None
    return None


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    period = float(os.environ.get("FLEETBENCH_TELEMETRY_PERIOD", "0.5"))
    if argv[:1] == ["--period"] and len(argv) >= 2:
        period = float(argv[1])
        argv = argv[2:]
    gpu = argv[:1] != ["--no-gpu"]
    if not gpu:
        argv = argv[1:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv or period <= 0:
        print("usage: wrapper.py [--period SECONDS] [--no-gpu] -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    return run(argv, period, gpu=gpu)


if __name__ == "__main__":
    sys.exit(main())
