"""Tests for the NumPy cpu-smoke stand-in for tf_cnn_benchmarks.

The script runs as a subprocess with the current interpreter (it needs only
the standard library and numpy); its model code is imported from its path for
the numerical gradient checks.
"""

import importlib.util
import math
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

SCRIPT = (Path(__file__).resolve().parents[2]
          / "include" / "images" / "cpu-smoke" / "tf_cnn_benchmarks.py")

STEP_RE = re.compile(
    r"^\d+\timages/sec: \d+\.\d \+/- \d+\.\d \(jitter = \d+\.\d\)"
    r"\t\d+\.\d{3}$")
STEP_FWD_RE = re.compile(
    r"^\d+\timages/sec: \d+\.\d \+/- \d+\.\d \(jitter = \d+\.\d\)"
    r"\t\d+\.\d{3}\t\d\.\d{3}\t\d\.\d{3}$")
TOTAL_RE = re.compile(r"^total images/sec: (\d+\.\d{2})$")


def run_script(*flags, timeout=60):
    return subprocess.run([sys.executable, str(SCRIPT), *flags],
                          capture_output=True, text=True, timeout=timeout)


def header(stdout):
    """'Key:  value' lines before '==========' as a dict."""
    out = {}
    for line in stdout.splitlines():
        if line == "==========":
            break
        if line.startswith(" "):
            out["Batch size (per device)"] = line.strip()
            continue
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def step_lines(stdout):
    lines = stdout.splitlines()
    start = lines.index("Done warm up") + 2  # skip the column header
    end = lines.index("-" * 64)
    return lines[start:end]


def losses(stdout):
    return [float(line.split("\t")[2]) for line in step_lines(stdout)]


def total_images_per_sec(stdout):
    matches = [TOTAL_RE.match(line) for line in stdout.splitlines()]
    found = [float(m.group(1)) for m in matches if m]
    assert len(found) == 1, stdout
    return found[0]


@pytest.fixture(scope="module")
def harness():
    spec = importlib.util.spec_from_file_location("cpu_smoke_tf_cnn", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def lenet_run():
    proc = run_script("--model=lenet", "--batch_size=32", "--num_batches=60",
                      "--learning_rate=0.05", "--num_warmup_batches=2")
    assert proc.returncode == 0, proc.stderr
    return proc


# ---------------------------------------------------------------- output ---

def test_lenet_header_and_layout(lenet_run):
    out = lenet_run.stdout
    lines = out.splitlines()
    assert lines[0].startswith("TensorFlow:  none (fleetbench cpu-smoke, "
                               "numpy %s)" % np.__version__)
    h = header(out)
    assert h["Model"] == "lenet"
    assert h["Dataset"] == "synthetic (synthetic)"
    assert h["Mode"] == "training"
    assert h["SingleSess"] == "False"
    assert h["Batch size"] == "32 global"
    assert h["Batch size (per device)"] == "32 per device"
    assert h["Num batches"] == "60"
    assert re.fullmatch(r"\d+\.\d\d", h["Num epochs"])
    assert h["Devices"] == "['/cpu:0']"
    assert h["NUMA bind"] == "False"
    assert h["Data format"] == "NHWC"
    assert h["Optimizer"] == "sgd"
    assert h["Variables"] == "parameter_server"
    # Exact text of the header block's fixed lines, spacing included.
    assert "Batch size:  32 global\n             32 per device\n" in out
    i = lines.index("==========")
    assert lines[i + 1:i + 6] == ["Generating training model",
                                  "Initializing graph", "Running warm up",
                                  "Done warm up", "Step\tImg/sec\ttotal_loss"]
    assert lines[-3] == lines[-1] == "-" * 64
    assert TOTAL_RE.match(lines[-2])
    assert lenet_run.stderr == ""


def test_step_lines_shape_and_count(lenet_run):
    steps = step_lines(lenet_run.stdout)
    for line in steps:
        assert STEP_RE.match(line), repr(line)
    # Step 1, every 10 steps, and the last step (60 is both).
    assert [int(line.split("\t")[0]) for line in steps] == [
        1, 10, 20, 30, 40, 50, 60]
    assert total_images_per_sec(lenet_run.stdout) > 0


def test_lenet_loss_decreases(lenet_run):
    values = losses(lenet_run.stdout)
    assert all(math.isfinite(v) for v in values)
    assert 2.0 < values[0] < 2.8  # ~ln(10) at the start
    assert values[-1] < values[0] - 0.5, values


def test_last_step_printed_when_not_a_multiple():
    proc = run_script("--model=trivial", "--batch_size=8", "--num_batches=25",
                      "--display_every=10", "--num_warmup_batches=0")
    assert proc.returncode == 0, proc.stderr
    steps = step_lines(proc.stdout)
    assert [int(line.split("\t")[0]) for line in steps] == [1, 10, 20, 25]
    assert all(STEP_RE.match(line) for line in steps)
    assert total_images_per_sec(proc.stdout) > 0


def test_forward_only_mode():
    proc = run_script("--model", "lenet", "--batch_size", "16",
                      "--num_batches", "10", "--forward_only")
    assert proc.returncode == 0, proc.stderr
    h = header(proc.stdout)
    assert h["Mode"] == "forward-only"
    assert ("Step\tImg/sec\ttotal_loss\ttop_1_accuracy\ttop_5_accuracy"
            in proc.stdout.splitlines())
    steps = step_lines(proc.stdout)
    assert len(steps) == 2  # steps 1 and 10
    for line in steps:
        assert STEP_FWD_RE.match(line), repr(line)
    # No parameter updates: every batch is scored by the same weights, so
    # the loss stays near ln(10) instead of dropping.
    assert all(2.0 < v < 2.8 for v in losses(proc.stdout))


def test_two_devices_double_the_global_batch():
    proc = run_script("--model=trivial", "--batch_size=32", "--num_gpus=2",
                      "--num_batches=10", "--variable_update=replicated",
                      "--data_format=NCHW")
    assert proc.returncode == 0, proc.stderr
    h = header(proc.stdout)
    assert h["Batch size"] == "64 global"
    assert h["Batch size (per device)"] == "32 per device"
    assert h["Devices"] == "['/cpu:0', '/cpu:1']"
    assert h["Variables"] == "replicated"
    assert h["Data format"] == "NCHW"


def test_num_gpus_zero_means_one_cpu_device():
    proc = run_script("--model=trivial", "--batch_size=4", "--num_gpus=0",
                      "--num_batches=1", "--num_warmup_batches=0")
    assert proc.returncode == 0, proc.stderr
    h = header(proc.stdout)
    assert h["Devices"] == "['/cpu:0']"
    assert h["Batch size"] == "4 global"
    assert [int(line.split("\t")[0])
            for line in step_lines(proc.stdout)] == [1]


# ----------------------------------------------------------------- errors ---

def test_gpu_device_is_refused():
    proc = run_script("--device=gpu", "--model=trivial")
    assert proc.returncode == 1
    assert proc.stdout == ""
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1
    assert "this harness only runs on the CPU" in err[0]


@pytest.mark.parametrize("flags", [
    ["--batch_size=0"],
    ["--batch_size=-3"],
    ["--batch_size=abc"],
    ["--model=resnet50"],
    ["--optimizer=momentum"],
    ["--num_batches=0"],
    ["--model=lenet", "--image_size=8"],
    ["--no_such_flag=1"],
])
def test_invalid_flags_exit_2_with_one_line(flags):
    proc = run_script(*flags)
    assert proc.returncode == 2, proc
    assert proc.stdout == ""
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "error" in err[0], proc.stderr


def test_sigterm_exits_143():
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--model=lenet", "--batch_size=8",
         "--num_batches=1000000", "--display_every=1000000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("Step\t"):
                break
        time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143
    assert "fleetbench cpu-smoke: terminated by signal 15" in err


# ------------------------------------------------------------ statistics ---

def test_perf_timing_matches_tf_cnn_benchmarks(harness):
    mean, err, jitter = harness.get_perf_timing(10, [0.1, 0.2])
    assert mean == pytest.approx(10 / 0.15)  # batch / mean(times)
    assert err == pytest.approx(25 / math.sqrt(2))  # std([100, 50]) / sqrt(2)
    assert jitter == pytest.approx(1.4826 * 25)
    assert (harness.get_perf_timing_str(305.04, 0.0, 0.0)
            == "images/sec: 305.0 +/- 0.0 (jitter = 0.0)")


# ------------------------------------------------------- model gradients ---

def numerical_gradient_check(harness, model, x, labels, rng, per_param=6,
                             eps=1e-6):
    _, grads, _ = harness.loss_and_grads(model, x, labels)
    assert set(grads) == set(model.params)
    for name, param in model.params.items():
        assert grads[name].shape == param.shape, name
        flat = param.reshape(-1)  # a view: edits change the model
        picks = rng.choice(flat.size, size=min(per_param, flat.size),
                           replace=False)
        for i in picks:
            orig = flat[i]
            flat[i] = orig + eps
            plus = harness.softmax_cross_entropy(
                model.forward(x)[0], labels, need_grad=False)[0]
            flat[i] = orig - eps
            minus = harness.softmax_cross_entropy(
                model.forward(x)[0], labels, need_grad=False)[0]
            flat[i] = orig
            numeric = (plus - minus) / (2 * eps)
            analytic = grads[name].reshape(-1)[i]
            assert analytic == pytest.approx(numeric, rel=1e-4, abs=1e-7), (
                name, i, analytic, numeric)


def test_lenet_backward_matches_numerical_gradient(harness):
    rng = np.random.default_rng(7)
    size = harness.LeNet.min_image_size()
    assert size == 16
    model = harness.LeNet(image_size=size, num_classes=5, seed=3,
                          dtype=np.float64)
    # Non-zero biases so that no ReLU input sits exactly on its kink.
    for name, value in model.params.items():
        if name.endswith("/b"):
            value += rng.uniform(0.05, 0.1, value.shape)
    x = rng.standard_normal((3, size, size, 3))
    labels = np.array([0, 3, 4])
    numerical_gradient_check(harness, model, x, labels, rng)


def test_trivial_backward_matches_numerical_gradient(harness):
    rng = np.random.default_rng(11)
    model = harness.TrivialModel(image_size=4, num_classes=3, seed=1,
                                 dtype=np.float64)
    x = rng.standard_normal((4, 4, 4, 3))
    labels = np.array([0, 1, 2, 1])
    numerical_gradient_check(harness, model, x, labels, rng)


def test_conv_and_pool_against_direct_loops(harness):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 7, 6, 3))
    w = rng.standard_normal((3, 2, 3, 4))
    b = rng.standard_normal(4)
    out, _ = harness.conv2d_forward(x, w, b)
    ref = np.zeros((2, 5, 5, 4))
    for i in range(5):
        for j in range(5):
            patch = x[:, i:i + 3, j:j + 2, :]
            ref[:, i, j, :] = np.tensordot(patch, w, axes=3) + b
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)

    pooled, cache = harness.maxpool2x2_forward(x)  # odd height: row dropped
    assert pooled.shape == (2, 3, 3, 3)
    np.testing.assert_array_equal(
        pooled, x[:, :6].reshape(2, 3, 2, 3, 2, 3).max(axis=(2, 4)))
    dx = harness.maxpool2x2_backward(np.ones_like(pooled), cache)
    assert dx.shape == x.shape
    assert dx.sum() == pooled.size and set(np.unique(dx)) <= {0.0, 1.0}
    assert np.all(dx[:, 6] == 0)


def test_training_step_updates_and_reduces_loss(harness):
    model = harness.build_model("trivial", 8, 4, seed=0)
    data = harness.SyntheticDataset(8, 4, global_batch=16, seed=0)
    assert data.size % 16 == 0
    assert data.images.dtype == np.float32
    before = {k: v.copy() for k, v in model.params.items()}
    first = harness.run_step(model, data.device_batches(0, 2, 8), 0.1)["loss"]
    assert any(not np.array_equal(before[k], model.params[k]) for k in before)
    assert all(v.dtype == np.float32 for v in model.params.values())
    for step in range(1, 40):
        last = harness.run_step(model, data.device_batches(step, 2, 8),
                                0.1)["loss"]
    assert last < first


def test_unexpected_error_prints_traceback_and_exits_1(harness, monkeypatch,
                                                       capsys):
    def boom(args):
        raise RuntimeError("synthetic failure")

    monkeypatch.setattr(harness, "benchmark", boom)
    # Keep the test process's own signal handlers untouched.
    monkeypatch.setattr(harness.signal, "signal", lambda *a: None)
    assert harness.main(["--model=trivial"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert "RuntimeError: synthetic failure" in err
