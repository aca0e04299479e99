"""The telemetry sampler through its NVML seam, with a fake GPU source (no NVML on this machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fleetbench.telemetry import parse_report, wrap_command
from fleetbench.telemetry import wrapper as tw


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class FakeGpus:
    """Two GPUs: GPU 0 has an energy counter (Volta+), GPU 1 has none (older: NotSupported)."""

    def __init__(self, clock, powers=(100.0, 300.0)):
        self.clock = clock
        self.powers = powers
        self.closed = False

    def devices(self):
        return [{"index": 0, "name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-0"},
                {"index": 1, "name": "Tesla P100", "uuid": "GPU-1"}]

    def sample(self, index):
        t = self.clock()
        power = self.powers[0] + (self.powers[1] - self.powers[0]) * min(t / 10.0, 1.0)  # ramps over 10 s
        return {"power_w": power, "util_pct": 50.0 + index, "mem_used_mib": 1000.0 * (1 + t), "sm_clock_mhz": 1410,
                "temp_c": 40 + int(t)}

    def energy_mj(self, index):
        if index == 1:
            return None
        t = self.clock()  # exact integral of the ramp, in mJ
        return 1000.0 * (self.powers[0] * t + (self.powers[1] - self.powers[0]) * t * t / 20.0)

    def close(self):
        self.closed = True


def test_energy_from_counter_and_from_trapezoid():
    clock = FakeClock()
    sampler = tw.Sampler(FakeGpus(clock), period_s=0.5, clock=clock)
    sampler.started = 0.0
    for i in range(21):  # 0 .. 10 s every 0.5 s
        clock.t = i * 0.5
        sampler.sample_once()
    sampler.stopped = clock.t
    for track in sampler.tracks:
        track.energy_end_mj = sampler.source.energy_mj(track.device["index"])
    report = sampler.summary()
    gpu0, gpu1 = report["gpus"]
    # The ramp 100 W -> 300 W over 10 s is 2000 J exactly; the trapezoid of a linear ramp is exact too.
    assert (gpu0["energy_method"], gpu0["energy_j"]) == ("counter", 2000.0)
    assert (gpu1["energy_method"], gpu1["energy_j"]) == ("trapezoid", 2000.0)
    assert gpu0["mean_power_w"] == 200.0 and gpu0["peak_power_w"] == 300.0
    assert gpu0["peak_mem_used_mib"] == 11000.0 and gpu0["max_temp_c"] == 50
    assert gpu1["mean_util_pct"] == 51.0 and gpu0["samples"] == 21
    assert report["energy_source"] == "measured" and report["energy_j"] == 4000.0
    assert report["mean_power_w"] == 400.0 and report["duration_s"] == 10.0


def test_power_readings_that_stop_mid_run_are_no_measured_energy():
    """A GPU lost 1 s into a 10 s case: its counter cannot be read at the end either, and the power integral of that
    one second was stored as the run's measured energy (150 J beside a 300 W mean over 10 s). Readings that do not
    cover the run give no energy: the row's energy_source is none, and `derive` estimates it."""
    clock = FakeClock()
    sampler = tw.Sampler(FakeGpus(clock), period_s=0.5, clock=clock)
    sampler.started = 0.0
    for i in range(3):  # 0, 0.5, 1.0 s: then the GPU is lost
        clock.t = i * 0.5
        sampler.sample_once()
    clock.t = 10.0
    sampler.stopped = 10.0
    report = sampler.summary()  # no counter at the end: energy_end_mj stays None
    assert [g["energy_j"] for g in report["gpus"]] == [None, None]
    assert report["energy_source"] == "none" and report["energy_j"] is None
    for i in range(3, 21):  # readings to the end: the integral stands
        clock.t = i * 0.5
        sampler.sample_once()
    assert sampler.summary()["gpus"][1]["energy_j"] == 2000.0


def test_missing_values_are_left_out_not_zeroed():
    clock = FakeClock()

    class Partial(FakeGpus):
        def sample(self, index):
            return {"power_w": None, "util_pct": None, "mem_used_mib": 5.0, "sm_clock_mhz": None, "temp_c": None}

        def energy_mj(self, index):
            return None

    sampler = tw.Sampler(Partial(clock), period_s=0.5, clock=clock)
    sampler.sample_once()
    report = sampler.summary()
    assert report["energy_source"] == "none" and report["energy_j"] is None
    assert report["gpus"][0]["mean_power_w"] is None and report["gpus"][0]["energy_method"] is None


def test_sampler_thread_samples_at_its_period():
    clock_source = FakeGpus(lambda: 0.0)
    sampler = tw.Sampler(clock_source, period_s=0.05).start()
    import time

    time.sleep(0.5)
    report = sampler.stop()
    assert 6 <= report["gpus"][0]["samples"] <= 14  # ~10 periods plus the closing sample
    assert report["sampler_cpu_s"] < 0.25


def test_run_passes_output_and_exit_code_through(capfd):
    clock = FakeClock()
    code = tw.run([sys.executable, "-c", "print('bench says hi'); raise SystemExit(3)"], 0.05,
                  source_factory=lambda: FakeGpus(clock))
    out = capfd.readouterr().out
    assert code == 3
    assert out.splitlines()[0] == "bench says hi"
    report = parse_report(out)
    assert report["nvml"] is True and len(report["gpus"]) == 2


def test_without_nvml_it_says_why(capfd):
    def unavailable():
        raise tw.NvmlUnavailable("nvmlInit failed: NVML Shared Library Not Found")

    code = tw.run([sys.executable, "-c", "pass"], 0.5, source_factory=unavailable)
    report = parse_report(capfd.readouterr().out)
    assert code == 0
    cpu = report.pop("cpu")
    assert report == {"nvml": False, "reason": "nvmlInit failed: NVML Shared Library Not Found",
                      "energy_source": "none", "gpus": []}
    assert cpu["count"] == os.cpu_count() and cpu["wall_s"] > 0 and cpu["usage_s"] >= 0


def test_real_nvml_source_fails_cleanly_on_this_machine():
    """No GPU driver here: the real seam raises NvmlUnavailable (on a GPU machine it opens the GPUs)."""
    try:
        source = tw.NvmlSource()
    except tw.NvmlUnavailable as exc:
        assert "nvmlInit failed" in str(exc) or "pynvml" in str(exc)
    else:  # a machine with a driver
        assert source.devices()
        source.close()


def test_signal_death_becomes_128_plus_signal(capfd):
    code = tw.run([sys.executable, "-c", "import os; os.abort()"], 0.5,
                  source_factory=lambda: (_ for _ in ()).throw(tw.NvmlUnavailable("none")))
    assert code == 134


def test_cli_usage_and_report_parsing():
    proc = subprocess.run([sys.executable, tw.__file__], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage" in proc.stderr
    assert parse_report("noise\nFLEETBENCH_TELEMETRY {\"nvml\": false}\n") == {"nvml": False}
    assert parse_report("FLEETBENCH_TELEMETRY {cut") is None and parse_report("") is None
    assert wrap_command(["python3", "b.py"], 0.5) == ["python3", "-S", "/opt/fleetbench-telemetry/wrapper.py",
                                                      "--period", "0.5", "--", "python3", "b.py"]
    json.dumps(parse_report('x FLEETBENCH_TELEMETRY {"a": 1}'))


def test_under_python_S_the_gpu_path_still_finds_the_images_pynvml_before_the_shipped_one(tmp_path):
    """Cases start the wrapper with `python3 -S`: a CPU case's wrapper imports no site-packages at all, a GPU
    case's adds them before the shipped pynvml (`fallback/`, last), so an image's own pynvml still wins."""
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import wrapper as tw;"
             "print(any('site-packages' in p for p in sys.path));"
             "tw.pynvml_path(); import pynvml;"
             "print(pynvml.__file__); print(sys.path[-1] == tw.FALLBACK)")
    out = subprocess.run([sys.executable, "-S", "-c", probe, os.path.dirname(tw.__file__)], capture_output=True,
                         text=True, check=True).stdout.split()
    assert out[0] == "False"  # nothing from site-packages before the GPU path asks
    assert "site-packages" in out[1] and "fallback" not in out[1]  # the environment's own nvidia-ml-py
    assert out[2] == "True"
    # and the wrapper as a case runs it, CPU case: exit code and telemetry line as without -S
    proc = subprocess.run([sys.executable, "-S", tw.__file__, "--no-gpu", "--", sys.executable, "-c",
                           "import sys; sys.exit(3)"], capture_output=True, text=True)
    assert proc.returncode == 3 and parse_report(proc.stdout)["reason"] == "a CPU case: GPUs not sampled"


# An NVML binding as a benchmark image may carry its own: `full` (nvidia-ml-py), `old` (nvidia-ml-py3 7.352: no
# energy counter call), `lost` (a GPU that answers NVMLError_GPUIsLost when opened), `dies` (one that is lost
# mid-run: its power reading fails from the third call on).
FAKE_PYNVML = """
class NVMLError(Exception):
    pass
class NVMLError_GPUIsLost(NVMLError):
    pass
NVML_CLOCK_SM = NVML_TEMPERATURE_GPU = 0
MODE = {mode!r}
calls = [0]
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 1
def nvmlDeviceGetHandleByIndex(i):
    if MODE == "lost":
        raise NVMLError_GPUIsLost("GPU is lost")
    return i
def nvmlDeviceGetName(h): return b"Tesla T4"
def nvmlDeviceGetUUID(h): return b"GPU-0"
def nvmlDeviceGetPowerUsage(h):
    calls[0] += 1
    if MODE == "dies" and calls[0] > 2:
        raise RuntimeError("the GPU fell off the bus")
    return 70000
class _Util: gpu = 90
def nvmlDeviceGetUtilizationRates(h): return _Util()
class _Mem: used = 2 ** 30
def nvmlDeviceGetMemoryInfo(h): return _Mem()
def nvmlDeviceGetClockInfo(h, clock): return 1590
def nvmlDeviceGetTemperature(h, sensor): return 60
if MODE == "full":
    def nvmlDeviceGetTotalEnergyConsumption(h): return 1000
"""


def _pythons():
    """This interpreter, and the oldest ones benchmark images carry where this machine has them (on PATH, or
    installed by pyenv)."""
    import glob
    import shutil

    found = [pytest.param(sys.executable, id="this")]
    for version in ("3.6", "3.7"):
        candidates = [shutil.which(f"python{version}"),
                      *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")))]
        working = [c for c in candidates
                   if c and subprocess.run([c, "-c", "pass"], capture_output=True).returncode == 0]
        exe, ok = (working[0], True) if working else (None, False)
        found.append(pytest.param(exe, id=version, marks=() if ok else pytest.mark.skip(
            reason=f"no python{version} on this machine to run the wrapper with")))
    return found


@pytest.mark.parametrize("python", _pythons())
@pytest.mark.parametrize("mode", ["full", "old", "lost", "dies"])
def test_the_wrapper_runs_the_benchmark_whatever_nvml_does(python, mode, tmp_path):
    (tmp_path / "pynvml.py").write_text(FAKE_PYNVML.format(mode=mode))
    proc = subprocess.run([python, "-S", tw.__file__, "--period", "0.05", "--", "sh", "-c",
                           "echo bench ran; sleep 0.3; exit 3"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 3 and proc.stdout.startswith("bench ran\n"), (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    report = parse_report(proc.stdout)
    if mode == "lost":
        assert report["nvml"] is False
        assert report["reason"] == "NVML could not be read: NVMLError_GPUIsLost: GPU is lost"
        return
    (gpu,) = report["gpus"]
    assert report["nvml"] is True and gpu["name"] == "Tesla T4"
    if mode == "dies":  # what it had before the GPU was lost, and why it stopped
        assert report["sampling_error"] == "RuntimeError: the GPU fell off the bus"
        assert gpu["samples"] >= 1 and gpu["mean_power_w"] == 70.0
        # its first readings are not the run's energy; the warehouse keeps why (clean_report dropped the key)
        assert gpu["energy_j"] is None and report["energy_source"] == "none"
        from fleetbench.telemetry.report import clean_report

        assert clean_report(report)["sampling_error"] == "RuntimeError: the GPU fell off the bus"
    else:
        assert "sampling_error" not in report and gpu["samples"] >= 4
        assert gpu["energy_method"] == ("counter" if mode == "full" else "trapezoid")  # old: no counter call
        assert report["mean_power_w"] == 70.0 and report["peak_mem_used_mib"] == 1024.0


def test_unknown_power_and_memory_are_unknown_not_zero():
    class NoReadings(FakeGpus):
        def sample(self, index):
            return {"power_w": None, "util_pct": 90.0, "mem_used_mib": None, "sm_clock_mhz": None, "temp_c": None}

        def energy_mj(self, index):
            return None

    sampler = tw.Sampler(NoReadings(FakeClock()), period_s=0.5, clock=FakeClock())
    sampler.sample_once()
    report = sampler.summary()
    assert (report["mean_power_w"], report["peak_mem_used_mib"]) == (None, None)  # were 0.0 and 0.0


def test_a_report_nested_past_the_json_parsers_depth_is_no_report():
    assert parse_report("FLEETBENCH_TELEMETRY " + "[" * 100_000 + "\n") is None  # was a RecursionError


# -- an image without python3 ------------------------------------------------------------------------
class NoPythonEngine:
    """A Docker engine (APIClient) whose image has no python3: the container is created, its start refused with
    the error runc gives (as Docker 24 answered for fleetbench/base:bookworm with PATH pointing nowhere)."""

    START_ERROR = ('failed to create task for container: failed to create shim task: OCI runtime create failed: runc '
                   'create failed: unable to start container process: exec: "python3": executable file not found '
                   'in $PATH: unknown')

    def __init__(self):
        self.created, self.removed = [], []

    def inspect_volume(self, name):
        return {"Name": name}

    def create_host_config(self, **kw):
        return kw

    def create_container(self, **kw):
        self.created.append(kw)
        return {"Id": "c0ffee" * 10}

    def start(self, cid):
        import requests
        from docker.errors import APIError

        response = requests.Response()
        response.status_code = 400
        raise APIError("400 Client Error: Bad Request", response=response, explanation=self.START_ERROR)

    def remove_container(self, cid, force=False):
        self.removed.append(cid)


@pytest.mark.parametrize("period", [0.5, 0])
def test_a_case_whose_image_has_no_python3_names_the_setting_that_runs_it_without_the_wrapper(tmp_path, period):
    from fleetbench.airflow.operators import BenchmarkCaseOperator
    from fleetbench.measure import measure

    op = BenchmarkCaseOperator(task_id="t", image="127.0.0.1:5000/nccl@sha256:" + "0" * 64, command=["/bin/true"],
                               docker_url="tcp://gpu-01:2376", telemetry_period_s=period, log_dir=str(tmp_path),
                               case={"host": "h", "case_key": "own.g1", "benchmark": "own", "harness": "command",
                                     "harness_settings": {"json_lines": True, "patterns": []}})
    engine = op.__dict__["cli"] = NoPythonEngine()
    outcome = op.run_case()
    assert engine.created[0]["command"][0] == ("python3" if period else "/bin/true") and engine.removed
    fields, _ = measure({"command": outcome["command"], "harness": "command", "harness_settings": {}}, outcome)
    assert (fields["status"], fields["failure_class"]) == ("failed", "container_config")
    if period:  # was Docker's message alone, which names no setting
        assert fields["failure_detail"].startswith(
            "the telemetry wrapper needs python3 in the image (127.0.0.1:5000/nccl@sha256:")
        assert "set benchmarks[].telemetry_period_s: 0 for benchmark 'own'" in fields["failure_detail"]
    else:  # not wrapped: the error is the command's own
        assert "telemetry_period_s" not in fields["failure_detail"] and "python3" in fields["failure_detail"]


def _random_value(rng, depth=0):
    """Report-like values, with what JSON must escape: control characters, DEL, quotes, non-ASCII, astral
    characters, lone surrogates; NaN, infinities, -0.0, huge ints; non-str keys json.dumps converts."""
    alphabet = ['a', 'Z', ' ', '~', '"', '\\', '/', '\n', '\r', '\t', '\b', '\f', '\x00', '\x1f', '\x7f', '\x80',
                'é', '\u2028', '\ud800', '\udfff', '\uffff', '😀', '\U0010ffff', 'ß', '中']
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 7, 2 ** 64 + 3, -(10 ** 30)])
    if kind == 3:
        return rng.choice([0.0, -0.0, 1.5, 1e-7, 1e300, -2.5e-310, 123456.789, float("nan"), float("inf"),
                           float("-inf"), rng.random()])
    if kind in (4, 5):
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
    if kind == 6:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 7:
        return tuple(_random_value(rng, depth + 1) for _ in range(rng.randrange(3)))
    keys = ["gpus", "k\n", "é", 1, 2.5, True, None, "x"]
    return {rng.choice(keys): _random_value(rng, depth + 1) for _ in range(rng.randrange(5))}


def test_the_wrappers_own_json_writer_writes_what_json_dumps_writes():
    """The wrapper writes its report without importing json (its start is part of every case): byte for byte
    `json.dumps(value, separators=(",", ":"))` on 5,000 random report-like values and a real report."""
    import random

    rng = random.Random(20261207)
    for _ in range(5000):
        value = _random_value(rng)
        assert tw._dumps(value) == json.dumps(value, separators=(",", ":")), repr(value)
    clock = FakeClock()
    report = tw.Sampler(FakeGpus(clock), 0.5, clock=clock).start().stop()
    report["cpu"] = tw.CpuMeter().stop()
    assert tw._dumps(report) == json.dumps(report, separators=(",", ":"))
    with pytest.raises(TypeError, match="not JSON serializable"):
        tw._dumps({"a": object()})


PYTHONS = _pythons()


@pytest.mark.parametrize("python", PYTHONS)
def test_the_command_starts_as_subprocess_started_it(python, tmp_path):
    """The command runs as `subprocess.Popen(command)` ran it (posix_spawnp on Python 3.8+, Popen on 3.6 and 3.7):
    SIGPIPE and SIGXFSZ at their default (Python ignores them, and an ignored signal stays ignored across exec: a
    shell pipeline would end with "Broken pipe" errors), no descriptor beyond stdio, the same environment, its
    output and exit code through, a command that cannot start is exit code 127 with the reason."""
    # a shell, not Python (which ignores SIGPIPE itself when it starts): its signal mask and descriptors as given
    probe = ["sh", "-c", 'grep SigIgn /proc/$$/status; ls /proc/$$/fd | tr "\\n" " "; echo;'
             ' echo "env $FLEETBENCH_PROBE"; exit 5']
    # the wrapper itself gets an inheritable descriptor (a C library's, say) that the command must not see
    launcher = ("import os, sys, runpy; r, w = os.pipe(); os.set_inheritable(r, True); os.set_inheritable(w, True);"
                "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
    proc = subprocess.run([python, "-S", "-c", launcher, tw.__file__, "--no-gpu", "--", *probe],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "FLEETBENCH_PROBE": "yes"})
    assert proc.returncode == 5, proc.stderr
    sig_ign, fds, env = proc.stdout.splitlines()[:3]
    ignored = int(sig_ign.split()[1], 16)
    assert not ignored & (1 << (13 - 1)) and not ignored & (1 << (25 - 1)), sig_ign  # SIGPIPE, SIGXFSZ
    assert set(fds.split()) <= {"0", "1", "2", "255"}, fds  # dash keeps 255 open for its own use (or 10)
    assert env == "env yes"
    assert parse_report(proc.stdout)["cpu"]["wall_s"] > 0
    proc = subprocess.run([python, "-S", tw.__file__, "--no-gpu", "--", str(tmp_path / "no-such-benchmark")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 127 and "cannot start" in proc.stderr and "No such file" in proc.stderr, proc.stderr
    assert parse_report(proc.stdout)["reason"] == "a CPU case: GPUs not sampled"


@pytest.mark.parametrize("python", PYTHONS)
def test_sigterm_to_the_wrapper_reaches_the_command(python, tmp_path):
    """`docker stop` signals the container's first process, the wrapper: the command gets the signal and the
    wrapper ends with its exit code (here the command's own, from its handler), its report still written."""
    import signal
    import time

    ready = tmp_path / "ready"
    command = [sys.executable, "-c",
               "import signal, sys, time, pathlib\n"
               "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\n"
               f"pathlib.Path({str(ready)!r}).write_text('x')\n"
               "time.sleep(30)\n"]
    proc = subprocess.Popen([python, "-S", tw.__file__, "--no-gpu", "--", *command], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 42, err
    assert parse_report(out)["cpu"]["wall_s"] < 29


@pytest.mark.parametrize("python", PYTHONS)
def test_what_posix_spawnp_refuses_starts_as_popen_started_it(python, tmp_path):
    """Popen's way where posix_spawnp stops short: a file on PATH that is not a program, ahead of the real one
    (Popen tries the next PATH entry; glibc's posix_spawnp ends with ENOEXEC), and an empty program name (Popen:
    exit 127 with the reason and the report; posix_spawnp: a ValueError)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "fleetbench-probe").write_bytes(b"\x00\x01 not a program")
    (tmp_path / "b" / "fleetbench-probe").write_text("#!/bin/sh\necho the real one\nexit 4\n")
    for path in (tmp_path / "a" / "fleetbench-probe", tmp_path / "b" / "fleetbench-probe"):
        path.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'a'}:{tmp_path / 'b'}:{os.environ['PATH']}"}
    proc = subprocess.run([python, "-S", tw.__file__, "--no-gpu", "--", "fleetbench-probe"], capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 4 and proc.stdout.startswith("the real one\n"), (proc.stdout, proc.stderr)
    proc = subprocess.run([python, "-S", tw.__file__, "--no-gpu", "--", ""], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 127 and "cannot start ''" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and parse_report(proc.stdout)["cpu"]["wall_s"] >= 0
