#!/usr/bin/env python3
"""fleetbench cpu-smoke: a NumPy stand-in for tf_cnn_benchmarks on the CPU.

This script runs in a minimal Debian bookworm container that has nothing but
``python3`` (3.11) and Debian's ``python3-numpy`` (1.24).  It does real work:
a training loop -- forward pass, backward pass written out by hand, plain SGD
parameter update -- of a small image classifier on a fixed-seed synthetic
data set, and it reports on stdout in tf_cnn_benchmarks' output format, so
that the parser that reads the real TensorFlow harness reads this one too.

It is *not* TensorFlow and does not pretend to be: the first line says
``TensorFlow:  none (fleetbench cpu-smoke, numpy X.Y.Z)``.

Models (both exist by these names in tf_cnn_benchmarks; the layer stacks here
are the ones below, not necessarily TensorFlow's):

* ``trivial``: flatten -> one fully connected layer -> softmax.
* ``lenet``:   conv5x5(6)-relu-maxpool2 -> conv5x5(16)-relu-maxpool2 ->
               fc120-relu -> fc84-relu -> fc(num_classes) -> softmax.
  Convolutions are VALID, stride 1, computed with im2col built from NumPy
  stride tricks; tensors are NHWC internally (``--data_format`` is only
  reported).

Devices: ``--num_gpus=N`` simulates N devices on the CPU.  Each step runs the
forward/backward pass once per device on that device's own per-device batch,
averages the gradients (parameter-server style) and applies one SGD update, so
the global batch is ``batch_size * N``.  ``--num_gpus=0`` means one CPU device.

Statistics replicate tf_cnn_benchmarks' ``benchmark_cnn.get_perf_timing``:
at step i the line shows ``global_batch / mean(step_times)``, the standard
error ``std(speeds) / sqrt(n)`` and ``jitter = 1.4826 * MAD(speeds)`` over
the measured steps so far, where ``speeds = global_batch / step_times``.
``total images/sec`` is ``num_batches * global_batch`` divided by the wall
time of the measured (post-warm-up) loop.  Step lines are printed at step 1,
every ``--display_every`` steps, and at the last step.

In ``--forward_only`` mode, as in tf_cnn_benchmarks, the step lines carry two
extra columns, top_1_accuracy and top_5_accuracy; the loss column is the real
cross-entropy of the batch (tf_cnn_benchmarks prints 0.000 there).

Synthetic data: ``pool`` images are generated once from ``--seed``; labels are
drawn uniformly at random, each image is its class's prototype (a coarse 4x4
random pattern, upsampled) weakly mixed into Gaussian noise, normalised per
channel to mean 0 / std 1.  Steps walk through
the pool in order and wrap around, so the loss goes down as the model learns.

Exit codes: 0 success; 1 unsupported device or unexpected error (traceback on
stderr); 2 invalid flags; 128+N when killed by signal N (SIGTERM: 143).
"""

import os

if __name__ == "__main__" and "OMP_NUM_THREADS" not in os.environ:
    # One BLAS/OpenMP thread unless the caller asked otherwise; must happen
    # before numpy is imported.
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                 "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
                 "NUMEXPR_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import math  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import numpy as np  # noqa: E402
from numpy.lib.stride_tricks import as_strided  # noqa: E402

PROG = "tf_cnn_benchmarks.py"
# How many digits to show for the loss and accuracies (as tf_cnn_benchmarks).
LOSS_AND_ACCURACY_DIGITS_TO_SHOW = 3
MODE_TRAIN = "training"
MODE_FORWARD_ONLY = "forward-only"
VARIABLE_UPDATES = ("parameter_server", "replicated", "distributed_replicated",
                    "independent", "distributed_all_reduce",
                    "collective_all_reduce", "horovod")
NUM_CHANNELS = 3
# Upper bounds for the synthetic image pool.
POOL_MAX_IMAGES = 1024
POOL_MAX_BYTES = 64 * 1024 * 1024
# Side of the coarse random pattern each class prototype is upsampled from.
PROTOTYPE_GRID = 4


# --------------------------------------------------------------------------
# Statistics (same definitions as tf_cnn_benchmarks' benchmark_cnn.py)
# --------------------------------------------------------------------------

def get_perf_timing(batch_size, step_train_times):
    """Returns (speed_mean, speed_uncertainty, speed_jitter) in images/sec."""
    times = np.array(step_train_times, dtype=np.float64)
    speeds = batch_size / times
    speed_mean = batch_size / np.mean(times)
    speed_uncertainty = np.std(speeds) / np.sqrt(float(len(speeds)))
    speed_jitter = 1.4826 * np.median(np.abs(speeds - np.median(speeds)))
    return float(speed_mean), float(speed_uncertainty), float(speed_jitter)


def get_perf_timing_str(speed_mean, speed_uncertainty, speed_jitter):
    return ("images/sec: %.1f +/- %.1f (jitter = %.1f)"
            % (speed_mean, speed_uncertainty, speed_jitter))


# --------------------------------------------------------------------------
# Layers: forward and hand-written backward passes (NHWC)
# --------------------------------------------------------------------------

def im2col(x, kh, kw):
    """(N,H,W,C) -> (N*Ho*Wo, kh*kw*C) patches for a VALID, stride-1 conv.

    The sliding windows are a zero-copy strided view; the final reshape
    gathers them into one contiguous matrix.
    """
    n, h, w, c = x.shape
    ho, wo = h - kh + 1, w - kw + 1
    sn, sh, sw, sc = x.strides
    windows = as_strided(x, shape=(n, ho, wo, kh, kw, c),
                         strides=(sn, sh, sw, sh, sw, sc), writeable=False)
    return windows.reshape(n * ho * wo, kh * kw * c)


def conv2d_forward(x, w, b):
    """VALID stride-1 convolution. x (N,H,W,C), w (kh,kw,C,F), b (F,)."""
    kh, kw, _, f = w.shape
    n, h, wd, _ = x.shape
    ho, wo = h - kh + 1, wd - kw + 1
    cols = im2col(x, kh, kw)
    out = cols @ w.reshape(-1, f)
    out += b
    return out.reshape(n, ho, wo, f), (x.shape, cols)


def conv2d_backward(dout, cache, w, need_dx=True):
    """Returns (dx or None, dw, db) for conv2d_forward."""
    x_shape, cols = cache
    kh, kw, c, f = w.shape
    n, ho, wo, _ = dout.shape
    d2 = dout.reshape(-1, f)
    dw = (cols.T @ d2).reshape(w.shape)
    db = d2.sum(axis=0)
    dx = None
    if need_dx:
        # col2im: scatter-add every kernel tap's patch gradient back.
        dcols = (d2 @ w.reshape(-1, f).T).reshape(n, ho, wo, kh, kw, c)
        dx = np.zeros(x_shape, dtype=dout.dtype)
        for i in range(kh):
            for j in range(kw):
                dx[:, i:i + ho, j:j + wo, :] += dcols[:, :, :, i, j, :]
    return dx, dw, db


def maxpool2x2_forward(x):
    """2x2 max pooling, stride 2 (odd trailing rows/columns are dropped)."""
    n, h, w, c = x.shape
    ho, wo = h // 2, w // 2
    xc = x[:, :2 * ho, :2 * wo, :]
    win = (xc.reshape(n, ho, 2, wo, 2, c)
           .transpose(0, 1, 3, 5, 2, 4)
           .reshape(n, ho, wo, c, 4))
    idx = win.argmax(axis=-1)
    out = np.take_along_axis(win, idx[..., None], axis=-1)[..., 0]
    return out, (x.shape, idx)


def maxpool2x2_backward(dout, cache):
    """Routes each output gradient to the (first) maximum of its window."""
    x_shape, idx = cache
    n, h, w, c = x_shape
    ho, wo = dout.shape[1], dout.shape[2]
    dwin = np.zeros((n, ho, wo, c, 4), dtype=dout.dtype)
    np.put_along_axis(dwin, idx[..., None], dout[..., None], axis=-1)
    d = (dwin.reshape(n, ho, wo, c, 2, 2)
         .transpose(0, 1, 4, 2, 5, 3)
         .reshape(n, 2 * ho, 2 * wo, c))
    if (2 * ho, 2 * wo) == (h, w):
        return d
    dx = np.zeros(x_shape, dtype=dout.dtype)
    dx[:, :2 * ho, :2 * wo, :] = d
    return dx


def relu(x):
    return np.maximum(x, 0)


def relu_backward(dout, out):
    """Gradient of relu given its output (out > 0 where the input was > 0)."""
    return dout * (out > 0)


def dense_forward(x, w, b):
    return x @ w + b


def dense_backward(dout, x, w, need_dx=True):
    dw = x.T @ dout
    db = dout.sum(axis=0)
    dx = dout @ w.T if need_dx else None
    return dx, dw, db


def softmax_cross_entropy(logits, labels, need_grad=True):
    """Mean cross-entropy and its gradient w.r.t. the logits."""
    n = logits.shape[0]
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    s = e.sum(axis=1, keepdims=True)
    rows = np.arange(n)
    loss = float(np.mean(np.log(s[:, 0]) - z[rows, labels]))
    if not need_grad:
        return loss, None
    dlogits = e / s
    dlogits[rows, labels] -= 1
    dlogits /= n
    return loss, dlogits.astype(logits.dtype, copy=False)


def top_k_accuracy(logits, labels, k):
    k = min(k, logits.shape[1])
    topk = np.argpartition(-logits, k - 1, axis=1)[:, :k]
    return float(np.mean(np.any(topk == labels[:, None], axis=1)))


# --------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------

def _normal(rng, shape, std, dtype):
    return (rng.standard_normal(shape) * std).astype(dtype)


class TrivialModel:
    """flatten -> fully connected (num_classes) -> softmax."""

    name = "trivial"

    def __init__(self, image_size=32, num_channels=NUM_CHANNELS,
                 num_classes=10, seed=0, dtype=np.float32):
        rng = np.random.default_rng(seed)
        fan_in = image_size * image_size * num_channels
        self.image_size = image_size
        self.params = {
            "fc/w": _normal(rng, (fan_in, num_classes),
                            math.sqrt(1.0 / fan_in), dtype),
            "fc/b": np.zeros(num_classes, dtype=dtype),
        }

    def forward(self, x):
        p = self.params
        flat = x.reshape(x.shape[0], -1)
        logits = dense_forward(flat, p["fc/w"], p["fc/b"])
        return logits, flat

    def backward(self, dlogits, cache):
        _, dw, db = dense_backward(dlogits, cache, self.params["fc/w"],
                                   need_dx=False)
        return {"fc/w": dw, "fc/b": db}


class LeNet:
    """LeNet-5: conv5x5(6)-relu-pool-conv5x5(16)-relu-pool-fc120-fc84-fc."""

    name = "lenet"

    @staticmethod
    def feature_size(image_size):
        """Spatial size after the two conv+pool blocks (must be >= 1)."""
        s = (image_size - 4) // 2
        return (s - 4) // 2

    @classmethod
    def min_image_size(cls):
        size = 1
        while cls.feature_size(size) < 1:
            size += 1
        return size

    def __init__(self, image_size=32, num_channels=NUM_CHANNELS,
                 num_classes=10, seed=0, dtype=np.float32):
        if image_size < self.min_image_size():
            raise ValueError("lenet needs --image_size >= %d, got %d"
                             % (self.min_image_size(), image_size))
        rng = np.random.default_rng(seed)
        fs = self.feature_size(image_size)
        flat = 16 * fs * fs
        c = num_channels

        def he(shape, fan_in):
            return _normal(rng, shape, math.sqrt(2.0 / fan_in), dtype)

        self.image_size = image_size
        self.params = {
            "conv1/w": he((5, 5, c, 6), 25 * c),
            "conv1/b": np.zeros(6, dtype=dtype),
            "conv2/w": he((5, 5, 6, 16), 25 * 6),
            "conv2/b": np.zeros(16, dtype=dtype),
            "fc1/w": he((flat, 120), flat),
            "fc1/b": np.zeros(120, dtype=dtype),
            "fc2/w": he((120, 84), 120),
            "fc2/b": np.zeros(84, dtype=dtype),
            # Small logits layer: the initial loss starts near ln(classes).
            "fc3/w": _normal(rng, (84, num_classes), 0.01, dtype),
            "fc3/b": np.zeros(num_classes, dtype=dtype),
        }

    def forward(self, x):
        p = self.params
        c1, c1_cache = conv2d_forward(x, p["conv1/w"], p["conv1/b"])
        r1 = relu(c1)
        m1, m1_cache = maxpool2x2_forward(r1)
        c2, c2_cache = conv2d_forward(m1, p["conv2/w"], p["conv2/b"])
        r2 = relu(c2)
        m2, m2_cache = maxpool2x2_forward(r2)
        flat = m2.reshape(m2.shape[0], -1)
        h1 = relu(dense_forward(flat, p["fc1/w"], p["fc1/b"]))
        h2 = relu(dense_forward(h1, p["fc2/w"], p["fc2/b"]))
        logits = dense_forward(h2, p["fc3/w"], p["fc3/b"])
        cache = (c1_cache, r1, m1_cache, c2_cache, r2, m2_cache, m2.shape,
                 flat, h1, h2)
        return logits, cache

    def backward(self, dlogits, cache):
        p = self.params
        (c1_cache, r1, m1_cache, c2_cache, r2, m2_cache, m2_shape,
         flat, h1, h2) = cache
        g = {}
        dh2, g["fc3/w"], g["fc3/b"] = dense_backward(dlogits, h2, p["fc3/w"])
        dh2 = relu_backward(dh2, h2)
        dh1, g["fc2/w"], g["fc2/b"] = dense_backward(dh2, h1, p["fc2/w"])
        dh1 = relu_backward(dh1, h1)
        dflat, g["fc1/w"], g["fc1/b"] = dense_backward(dh1, flat, p["fc1/w"])
        dm2 = dflat.reshape(m2_shape)
        dr2 = maxpool2x2_backward(dm2, m2_cache)
        dc2 = relu_backward(dr2, r2)
        dm1, g["conv2/w"], g["conv2/b"] = conv2d_backward(
            dc2, c2_cache, p["conv2/w"])
        dr1 = maxpool2x2_backward(dm1, m1_cache)
        dc1 = relu_backward(dr1, r1)
        _, g["conv1/w"], g["conv1/b"] = conv2d_backward(
            dc1, c1_cache, p["conv1/w"], need_dx=False)
        return g


MODELS = {"trivial": TrivialModel, "lenet": LeNet}


def build_model(name, image_size, num_classes, seed, dtype=np.float32):
    return MODELS[name](image_size=image_size, num_channels=NUM_CHANNELS,
                        num_classes=num_classes, seed=seed, dtype=dtype)


def loss_and_grads(model, x, labels):
    """One forward + backward pass: (loss, grads, logits)."""
    logits, cache = model.forward(x)
    loss, dlogits = softmax_cross_entropy(logits, labels)
    return loss, model.backward(dlogits, cache), logits


def sgd_update(params, grads, learning_rate):
    for k, v in params.items():
        v -= learning_rate * grads[k]


# --------------------------------------------------------------------------
# Synthetic data
# --------------------------------------------------------------------------

class SyntheticDataset:
    """A fixed-seed pool of labelled images, walked in order with wrap-around.

    Labels are uniform random; an image is ``signal_strength`` times its
    class prototype (a coarse random pattern, upsampled) plus unit Gaussian
    noise, normalised per channel to mean 0 and std 1.  The pool size
    is a multiple of the global batch, at most POOL_MAX_IMAGES images and
    about POOL_MAX_BYTES bytes (but never less than one global batch).
    """

    name = "synthetic"

    def __init__(self, image_size, num_classes, global_batch, seed=0,
                 num_channels=NUM_CHANNELS, dtype=np.float32,
                 signal_strength=0.25):
        shape = (image_size, image_size, num_channels)
        bytes_per_image = int(np.prod(shape)) * np.dtype(dtype).itemsize
        target = min(POOL_MAX_IMAGES,
                     max(1, POOL_MAX_BYTES // bytes_per_image))
        self.global_batch = global_batch
        self.size = global_batch * max(1, target // global_batch)
        rng = np.random.default_rng(seed + 4321)
        # Class prototypes: a random PROTOTYPE_GRID x PROTOTYPE_GRID pattern
        # per class, upsampled (nearest neighbour) to the image size.
        grid = min(PROTOTYPE_GRID, image_size)
        coarse = rng.standard_normal((num_classes, grid, grid, num_channels),
                                     dtype=np.float32)
        rows = (np.arange(image_size) * grid) // image_size
        prototypes = coarse[:, rows][:, :, rows]
        self.labels = rng.integers(0, num_classes, self.size).astype(np.int64)
        images = rng.standard_normal((self.size,) + shape, dtype=np.float32)
        images += signal_strength * prototypes[self.labels]
        mean = images.mean(axis=(0, 1, 2), dtype=np.float64)
        std = images.std(axis=(0, 1, 2), dtype=np.float64)
        images -= mean.astype(np.float32)
        images /= np.maximum(std, 1e-6).astype(np.float32)
        self.images = images.astype(dtype, copy=False)

    def device_batches(self, step, num_devices, batch_size):
        """Per-device (images, labels) views for global step ``step``."""
        start = (step * self.global_batch) % self.size
        out = []
        for d in range(num_devices):
            lo = start + d * batch_size
            out.append((self.images[lo:lo + batch_size],
                        self.labels[lo:lo + batch_size]))
        return out


# --------------------------------------------------------------------------
# One benchmark step
# --------------------------------------------------------------------------

def run_step(model, device_batches, learning_rate, forward_only=False):
    """Runs one step over all devices.

    Training: forward + backward per device, gradients averaged, one SGD
    update.  Forward-only: forward pass and metrics only.
    Returns a dict with 'loss' (mean over devices) and, in forward-only mode,
    'top_1_accuracy' and 'top_5_accuracy'.
    """
    losses = []
    top1 = []
    top5 = []
    grad_sum = None
    for x, labels in device_batches:
        logits, cache = model.forward(x)
        loss, dlogits = softmax_cross_entropy(logits, labels,
                                              need_grad=not forward_only)
        losses.append(loss)
        if forward_only:
            top1.append(top_k_accuracy(logits, labels, 1))
            top5.append(top_k_accuracy(logits, labels, 5))
            continue
        grads = model.backward(dlogits, cache)
        if grad_sum is None:
            grad_sum = grads
        else:
            for k, g in grads.items():
                grad_sum[k] += g
    result = {"loss": float(np.mean(losses))}
    if forward_only:
        result["top_1_accuracy"] = float(np.mean(top1))
        result["top_5_accuracy"] = float(np.mean(top5))
    else:
        sgd_update(model.params, grad_sum,
                   learning_rate / len(device_batches))
    return result


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        # One line on stderr, exit status 2 (absl/argparse convention).
        self.exit(2, "%s: error: %s\n" % (self.prog, message))


def _int_at_least(minimum):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError("invalid int value: %r" % text)
        if value < minimum:
            raise argparse.ArgumentTypeError(
                "must be >= %d, got %d" % (minimum, value))
        return value
    return parse


def _positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("invalid float value: %r" % text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(
            "must be a finite number > 0, got %r" % text)
    return value


def _bool(text):
    lowered = text.strip().lower()
    if lowered in ("1", "true", "t", "yes", "y"):
        return True
    if lowered in ("0", "false", "f", "no", "n"):
        return False
    raise argparse.ArgumentTypeError("invalid bool value: %r" % text)


def make_parser():
    p = _ArgumentParser(
        prog=PROG, allow_abbrev=False,
        description="fleetbench cpu-smoke: NumPy CNN training benchmark that "
                    "prints tf_cnn_benchmarks-format output (CPU only).")
    p.add_argument("--model", choices=sorted(MODELS), default="trivial")
    p.add_argument("--batch_size", type=_int_at_least(1), default=32,
                   help="batch size per device")
    p.add_argument("--num_batches", type=_int_at_least(1), default=100)
    p.add_argument("--num_warmup_batches", type=_int_at_least(0), default=5)
    p.add_argument("--display_every", type=_int_at_least(1), default=10)
    p.add_argument("--num_gpus", type=_int_at_least(0), default=1,
                   help="number of simulated devices (0 means 1 CPU device)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--variable_update", choices=VARIABLE_UPDATES,
                   default="parameter_server")
    p.add_argument("--data_format", choices=("NHWC", "NCHW"), default="NHWC")
    p.add_argument("--optimizer", choices=("sgd",), default="sgd")
    p.add_argument("--forward_only", type=_bool, nargs="?", const=True,
                   default=False)
    p.add_argument("--noforward_only", dest="forward_only",
                   action="store_false")
    p.add_argument("--image_size", type=_int_at_least(1), default=32)
    p.add_argument("--num_classes", type=_int_at_least(2), default=10)
    p.add_argument("--seed", type=_int_at_least(0), default=0)
    p.add_argument("--learning_rate", type=_positive_float, default=0.01)
    return p


def parse_args(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.model == "lenet" and args.image_size < LeNet.min_image_size():
        parser.error("argument --image_size: lenet needs --image_size >= %d, "
                     "got %d" % (LeNet.min_image_size(), args.image_size))
    return args


# --------------------------------------------------------------------------
# Benchmark
# --------------------------------------------------------------------------

def log_fn(line):
    print(line, flush=True)


def benchmark(args):
    num_devices = max(1, args.num_gpus)
    devices = ["/cpu:%d" % i for i in range(num_devices)]
    global_batch = args.batch_size * num_devices
    mode = MODE_FORWARD_ONLY if args.forward_only else MODE_TRAIN

    dataset = SyntheticDataset(args.image_size, args.num_classes,
                               global_batch, seed=args.seed)
    num_epochs = args.num_batches * global_batch / dataset.size

    log_fn("TensorFlow:  none (fleetbench cpu-smoke, numpy %s)"
           % np.__version__)
    log_fn("Model:       %s" % args.model)
    log_fn("Dataset:     %s (synthetic)" % dataset.name)
    log_fn("Mode:        %s" % mode)
    log_fn("SingleSess:  False")
    log_fn("Batch size:  %s global" % global_batch)
    log_fn("             %s per device" % args.batch_size)
    log_fn("Num batches: %d" % args.num_batches)
    log_fn("Num epochs:  %.2f" % num_epochs)
    log_fn("Devices:     %s" % devices)
    log_fn("NUMA bind:   False")
    log_fn("Data format: %s" % args.data_format)
    log_fn("Optimizer:   %s" % args.optimizer)
    log_fn("Variables:   %s" % args.variable_update)
    log_fn("==========")
    log_fn("Generating training model")
    model = build_model(args.model, args.image_size, args.num_classes,
                        args.seed)
    log_fn("Initializing graph")
    log_fn("Running warm up")

    step_train_times = []
    local_step = -args.num_warmup_batches
    data_step = 0
    loop_start_time = None
    while local_step < args.num_batches:
        if local_step == 0:
            log_fn("Done warm up")
            header = "Step\tImg/sec\ttotal_loss"
            if args.forward_only:
                header += "\ttop_1_accuracy\ttop_5_accuracy"
            log_fn(header)
            step_train_times = []
            loop_start_time = time.perf_counter()
        start_time = time.perf_counter()
        batches = dataset.device_batches(data_step, num_devices,
                                         args.batch_size)
        results = run_step(model, batches, args.learning_rate,
                           forward_only=args.forward_only)
        step_train_times.append(max(time.perf_counter() - start_time, 1e-9))
        data_step += 1
        if local_step >= 0 and (local_step == 0
                                or (local_step + 1) % args.display_every == 0
                                or local_step + 1 == args.num_batches):
            stats = get_perf_timing(global_batch, step_train_times)
            digits = LOSS_AND_ACCURACY_DIGITS_TO_SHOW
            line = "%i\t%s\t%.*f" % (local_step + 1,
                                     get_perf_timing_str(*stats),
                                     digits, results["loss"])
            if args.forward_only:
                line += "\t%.*f\t%.*f" % (
                    digits, results["top_1_accuracy"],
                    digits, results["top_5_accuracy"])
            log_fn(line)
        local_step += 1
    elapsed = time.perf_counter() - loop_start_time
    images_per_sec = args.num_batches * global_batch / elapsed
    log_fn("-" * 64)
    log_fn("total images/sec: %.2f" % images_per_sec)
    log_fn("-" * 64)
    return images_per_sec


def _on_signal(signum, frame):
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001 - best effort while dying
        pass
    os.write(2, ("fleetbench cpu-smoke: terminated by signal %d\n"
                 % signum).encode())
    os._exit(128 + signum)


def main(argv=None):
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    args = parse_args(argv)
    if args.device != "cpu":
        sys.stderr.write("%s: error: --device=%s is not supported: this "
                         "harness only runs on the CPU\n"
                         % (PROG, args.device))
        return 1
    try:
        benchmark(args)
    except BrokenPipeError:
        # stdout went away: say so, and keep the interpreter's final flush
        # from raising again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.stderr.write("%s: error: stdout closed (broken pipe)\n" % PROG)
        return 1
    except Exception:  # noqa: BLE001 - reported, never swallowed
        sys.stdout.flush()
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
