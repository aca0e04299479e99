"""Tests for fleetbench.parsing against real Lambda logs and small synthetic logs.

Every expected number for a real log was read off the log text by hand
(header block, first/last step line, ``total images/sec`` line, error lines).
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from fleetbench.parsing import ParsedLog, Step, UnknownFormat, cli_parse, detect_format, parse_log, parse_log_file

REAL_LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "real-logs"  # tests/fixtures/real-logs/SOURCES.md
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs"

TF = "tf_cnn_benchmarks"
HOROVOD = "horovod_synthetic"

CLI_FIELDS = [
    "file", "format", "status", "failure_class", "failure_detail", "model", "num_gpus",
    "batch_size_per_device", "batch_size_global", "variable_update", "precision",
    "forward_only", "data", "step_count", "steps", "total_images_per_sec",
    "accuracy_top1", "accuracy_top5", "devices", "primary", "metrics",
]  # fmt: skip


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def real(name: str) -> str:
    return read(REAL_LOGS / name)


def fixture(name: str) -> str:
    return read(FIXTURES / name)


GPUS = {n: [f"/gpu:{i}" for i in range(n)] for n in (1, 2, 4, 8)}

# Hand-checked against each file. Tuple fields:
# model, num_gpus, per-device batch, global batch, variable_update, forward_only, data,
# step_count, first step, last step, total, status, failure_class.
# precision is None for all of them: tf_cnn_benchmarks never prints it and Lambda's
# harness did not echo its command line (the fp16 runs are fp16 only per their file names).
REAL_EXPECTED = {
    "tfcnn_resnet50_1gpu_lambda-2080ti-tf115.log": (
        "resnet50", 1, 64, 64, "replicated", False, "synthetic", 11,
        Step(1, 295.2, 0.0, 0.0, 8.220), Step(100, 293.1, 0.2, 1.3, 8.036),
        292.85, "ok", None,
    ),
    "tfcnn_resnet50_8gpu_lambda-v100-fp16.log": (
        "resnet50", 8, 384, 3072, "replicated", False, "synthetic", 11,
        Step(1, 4504.5, 0.0, 0.0, 7.790), Step(100, 4677.6, 38.9, 321.9, 7.470),
        4676.54, "ok", None,
    ),
    "tfcnn_alexnet_4gpu_lambda-rtx8000-paramserver-fp16.log": (
        "alexnet", 4, 4096, 16384, "parameter_server", False, "synthetic", 11,
        Step(1, 25530.6, 0.0, 0.0, 7.233), Step(100, 25413.7, 10.4, 113.3, 7.232),
        25405.16, "ok", None,
    ),
    "tfcnn_inception3_8gpu_lambda-a100-fp16-realdata.log": (
        "inception3", 8, 448, 3584, "replicated", False, "real", 11,
        Step(1, 5442.5, 0.0, 0.0, 7.314), Step(100, 4220.5, 60.7, 540.8, 7.196),
        4220.13, "ok", None,
    ),
    "tfcnn_resnet152_4gpu_lambda-a100-forwardonly-fp16.log": (
        "resnet152", 4, 224, 896, "replicated", True, "synthetic", 11,
        Step(1, 11803.1, 0.0, 0.0, 0.0), Step(100, 11758.2, 4.5, 13.0, 0.0),
        11751.92, "ok", None,
    ),
    "tfcnn_vgg16_2gpu_lambda-radeonvii-rocm.log": (
        "vgg16", 2, 192, 384, "replicated", False, "synthetic", 11,
        Step(1, 316.5, 0.0, 0.0, 7.263), Step(100, 315.7, 0.7, 6.3, 7.267),
        315.65, "ok", None,
    ),
    "tfcnn_inception3_1gpu_lambda-radeonvii-truncated.log": (
        "inception3", 1, 96, 96, "replicated", False, "synthetic", 0,
        None, None, None, "failed", "no_result",
    ),
    "tfcnn_inception3_4gpu_lambda-rtx6000-importerror.log": (
        None, None, None, None, None, None, None, 0,
        None, None, None, "failed", "import_error",
    ),
    "tfcnn_alexnet_4gpu_lambda-3070-nccl-internalerror.log": (
        "alexnet", 4, 384, 1536, "replicated", False, "synthetic", 0,
        None, None, None, "failed", "nccl",
    ),
    "tfcnn_vgg16_1gpu_lambda-2080maxq-tf115-oom-training.log": (
        "vgg16", 1, 48, 48, "replicated", False, "synthetic", 0,
        None, None, None, "failed", "oom",
    ),
    "tfcnn_vgg16_1gpu_lambda-2080maxq-xla-oom-forwardonly.log": (
        "vgg16", 1, 48, 48, "replicated", True, "synthetic", 0,
        None, None, None, "failed", "oom",
    ),
}  # fmt: skip

# The error line each failed real log should report (verbatim from the log).
REAL_DETAIL = {
    "tfcnn_inception3_4gpu_lambda-rtx6000-importerror.log": (
        "tensorflow.python.framework.errors_impl.NotFoundError: libforestprotos.so: "
        "cannot open shared object file: No such file or directory"
    ),
    "tfcnn_alexnet_4gpu_lambda-3070-nccl-internalerror.log": (
        "2021-03-24 23:34:29.175680: W tensorflow/core/framework/op_kernel.cc:1651] "
        "OP_REQUIRES failed at nccl_ops.cc:104 : Internal: unhandled system error"
    ),
    "tfcnn_vgg16_1gpu_lambda-2080maxq-tf115-oom-training.log": (
        "2020-07-10 08:43:28.767546: W tensorflow/core/framework/op_kernel.cc:1651] "
        "OP_REQUIRES failed at matmul_op.cc:480 : Resource exhausted: OOM when allocating "
        "tensor with shape[4096,4096] and type float on /job:localhost/replica:0/task:0/"
        "device:GPU:0 by allocator GPU_0_bfc"
    ),
    # Not the earlier (recoverable) autotuner OOM at 08:34:27.156: the op that failed.
    "tfcnn_vgg16_1gpu_lambda-2080maxq-xla-oom-forwardonly.log": (
        "2020-07-10 08:34:27.532472: W tensorflow/core/framework/op_kernel.cc:1651] "
        "OP_REQUIRES failed at xla_ops.cc:502 : Resource exhausted: Out of memory while "
        "trying to allocate 427819008 bytes."
    ),
}


def test_every_real_log_is_covered():
    assert sorted(p.name for p in REAL_LOGS.glob("*.log")) == sorted(REAL_EXPECTED)


@pytest.mark.parametrize("name", sorted(REAL_EXPECTED))
def test_real_log_fields(name):
    (model, gpus, per_dev, glob, variables, fwd, data, nsteps, first, last, total, status, failure) = (
        REAL_EXPECTED[name]
    )
    log = parse_log(real(name))

    assert log.format == TF
    assert (log.status, log.failure_class) == (status, failure)
    assert log.model == model
    assert log.num_gpus == gpus
    assert log.devices == (GPUS[gpus] if gpus else None)
    assert log.batch_size_per_device == per_dev
    assert log.batch_size_global == glob
    assert log.variable_update == variables
    assert log.precision is None
    assert log.forward_only is fwd
    assert log.data == data
    assert log.step_count == nsteps == len(log.steps)
    assert log.total_images_per_sec == total
    assert (log.accuracy_top1, log.accuracy_top5) == (None, None)
    if nsteps:
        assert log.steps[0] == first
        assert log.steps[-1] == last
        assert [s.step for s in log.steps] == [1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
    if status == "ok":
        assert log.failure_detail is None
    elif failure == "no_result":
        assert log.failure_detail == "no 'total images/sec' line in log (0 step lines parsed)"
    else:
        assert log.failure_detail == REAL_DETAIL[name]
        assert log.failure_detail in real(name)


def test_real_batch_sizes_are_ints():
    log = parse_log(real("tfcnn_resnet50_1gpu_lambda-2080ti-tf115.log"))
    assert type(log.batch_size_per_device) is int and type(log.batch_size_global) is int


def test_real_oom_logs_carry_recoverable_allocator_warnings():
    """Both failed OOM runs also print TF's 'this is not a failure' allocator warning
    before the fatal OOM; the warning alone must not decide anything."""
    for name in (
        "tfcnn_vgg16_1gpu_lambda-2080maxq-tf115-oom-training.log",
        "tfcnn_vgg16_1gpu_lambda-2080maxq-xla-oom-forwardonly.log",
    ):
        text = real(name)
        assert "The caller indicates that this is not a failure" in text
        log = parse_log(text)
        # the fatal allocation decides, and the detail quotes it, not the warning
        assert (log.status, log.failure_class) == ("failed", "oom")
        assert "Resource exhausted" in log.failure_detail and "not a failure" not in log.failure_detail
        # without the fatal lines, the warnings alone are no failure
        warnings_only = "\n".join(line for line in text.splitlines() if "Resource exhausted" not in line
                                   and "OOM when allocating" not in line and "ResourceExhaustedError" not in line)
        assert parse_log(warnings_only).failure_class != "oom", name


def _recoverable_oom_lines() -> list[str]:
    text = real("tfcnn_vgg16_1gpu_lambda-2080maxq-tf115-oom-training.log")
    lines = [
        line
        for line in text.splitlines()
        if "ran out of memory" in line
        or "CUDA_ERROR_OUT_OF_MEMORY" in line
        or "Garbage collection: deallocate free memory regions" in line
    ]
    assert any("not a failure" in line for line in lines)
    return lines


def test_total_with_recovered_oom_warnings_is_ok():
    """Real warning lines (copied from the OOM log) spliced into a successful real run."""
    text = real("tfcnn_resnet50_1gpu_lambda-2080ti-tf115.log")
    noisy = text.replace("Done warm up\n", "\n".join(_recoverable_oom_lines()) + "\nDone warm up\n")
    log = parse_log(noisy)
    assert (log.status, log.failure_class, log.failure_detail) == ("ok", None, None)
    assert log.total_images_per_sec == 292.85


def test_recovered_oom_warnings_alone_are_not_oom():
    text = real("tfcnn_inception3_1gpu_lambda-radeonvii-truncated.log")
    warnings = [line for line in _recoverable_oom_lines() if "CUDA_ERROR" not in line]
    log = parse_log(text + "\n".join(warnings) + "\n")
    assert log.failure_class == "no_result"


@pytest.mark.parametrize("name", sorted(REAL_EXPECTED))
def test_real_log_detected_as_tf_cnn(name):
    assert detect_format(real(name)) == TF


@pytest.mark.parametrize("name", ["lambda_thermal_inception3_8gpu_a100.csvlog", "lambda_metadata_8xa100.tsv"])
def test_non_benchmark_files_are_unknown(name):
    assert detect_format(real(name)) is None
    with pytest.raises(UnknownFormat):
        parse_log(real(name))


def test_crlf_and_spaces_instead_of_tabs():
    text = real("tfcnn_resnet50_8gpu_lambda-v100-fp16.log")
    variant = text.replace("\t", "    ").replace("\n", "\r\n")
    assert parse_log(variant) == parse_log(text)


def test_parse_is_fast_on_150kb_log():
    text = real("tfcnn_vgg16_1gpu_lambda-2080maxq-tf115-oom-training.log")
    assert len(text) > 150_000
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        parse_log(text)
        best = min(best, time.perf_counter() - start)
    assert best < 0.05


# --- synthetic fixtures -----------------------------------------------------


def test_mpi_two_ranks_interleaved_with_glued_line():
    log = parse_log(fixture("tf_cnn_horovod_2rank_mpirun_interleaved_glued.log"))
    assert (log.status, log.format) == ("ok", TF)
    assert log.variable_update == "horovod"
    assert log.devices == ["horovod/gpu:0", "horovod/gpu:1"]
    assert (log.num_gpus, log.batch_size_per_device, log.batch_size_global) == (2, 64, 128)
    # Rank 0 only, including its half of the glued line (step 10).
    assert log.steps == [
        Step(1, 590.4, 0.0, 0.0, 7.868),
        Step(10, 598.1, 1.2, 3.9, 7.801),
        Step(20, 598.3, 0.8, 3.0, 7.740),
        Step(30, 597.5, 0.6, 3.3, 7.712),
    ]
    # Rank 1 prints its (job) total first; rank 0's is taken, never the sum 1194.33.
    assert log.total_images_per_sec == 597.31


def test_rank_total_fallback_when_rank0_printed_none():
    text = fixture("tf_cnn_horovod_2rank_mpirun_interleaved_glued.log")
    text = text.replace("[1,0]<stdout>:total images/sec: 597.31\n", "")
    assert parse_log(text).total_images_per_sec == 597.02


def test_launcher_prefix():
    log = parse_log(fixture("tf_cnn_launcher_prefix.log"))
    assert (log.status, log.model, log.num_gpus) == ("ok", "inception4", 2)
    assert (log.batch_size_per_device, log.batch_size_global) == (128, 256)
    assert log.steps[0] == Step(1, 412.3, 0.0, 0.0, 7.922)
    assert log.steps[-1] == Step(20, 411.5, 0.3, 1.1, 7.845)
    assert log.total_images_per_sec == 411.37


def test_airflow_task_log_prefix():
    text = real("tfcnn_resnet50_1gpu_lambda-2080ti-tf115.log")
    prefixed = "".join(
        f"[2024-05-01T12:00:{i % 60:02d}.123+0000] {{subprocess.py:93}} INFO - {line}\n"
        for i, line in enumerate(text.splitlines())
    )
    assert parse_log(prefixed) == parse_log(text)


def test_tf14_header_without_dataset_and_num_batches():
    log = parse_log(fixture("tf_cnn_tf14_header_no_dataset_no_num_batches.log"))
    assert (log.status, log.model, log.variable_update) == ("ok", "resnet50", "parameter_server")
    assert log.data is None  # no Dataset: line in TF 1.4 builds
    assert log.forward_only is False
    assert log.batch_size_per_device == 64  # printed "64.0 per device"
    assert type(log.batch_size_per_device) is int
    assert log.step_count == 11
    assert log.steps[0] == Step(1, 217.4, 0.0, 0.0, 7.766)  # "loss" column, not total_loss
    assert log.total_images_per_sec == 217.36


def test_float_batch_sizes_and_forward_only_hyphen():
    log = parse_log(fixture("tf_cnn_float_batch_sizes_forward_only_hyphen.log"))
    assert (log.batch_size_global, log.batch_size_per_device) == (128, 64)  # "128.0" / "64.0"
    assert log.forward_only is True  # "Mode: forward-only"
    assert log.num_gpus == 2
    assert log.total_images_per_sec == 702.64


def test_non_integral_batch_size_stays_float():
    text = fixture("tf_cnn_float_batch_sizes_forward_only_hyphen.log")
    text = text.replace("128.0 global", "85 global").replace("64.0 per device", "42.5 per device")
    log = parse_log(text)
    assert (log.batch_size_global, log.batch_size_per_device) == (85, 42.5)


def test_eval_accuracy_lines():
    log = parse_log(fixture("tf_cnn_eval_accuracy_real_data.log"))
    assert (log.status, log.data, log.forward_only) == ("ok", "real", True)
    assert (log.accuracy_top1, log.accuracy_top5) == (0.75, 0.92)
    assert log.steps == [Step(100, 1289.6, None, None, None), Step(200, 1291.3, None, None, None)]
    assert log.total_images_per_sec == 1290.41


def test_horovod_pytorch_synthetic():
    text = fixture("horovod_pytorch_synthetic_4gpu_mpirun.log")
    assert detect_format(text) == HOROVOD
    log = parse_log(text)
    assert log.format == HOROVOD
    assert (log.status, log.failure_class) == ("ok", None)
    assert (log.model, log.num_gpus) == ("resnet50", 4)
    assert (log.batch_size_per_device, log.batch_size_global) == (32, 128)
    assert (log.variable_update, log.precision, log.forward_only, log.data) == (
        "horovod", "fp32", False, "synthetic"
    )  # fmt: skip
    # Steps keep the printed per-GPU value; the total is the "Total img/sec" line.
    assert log.step_count == 10
    assert log.steps[0] == Step(0, 219.8, None, None, None)
    assert log.steps[-1] == Step(9, 220.9, None, None, None)
    assert log.total_images_per_sec == 885.2
    assert log.devices is None


HOROVOD_TF2 = """\
Model: ResNet50
Batch size: 64
Number of GPUs: 2
Running benchmark...
Iter #0: 401.2 img/sec per GPU, iteration time 159.5 ms
Iter #1: 402.8 img/sec per GPU, iteration time 158.9 ms
"""


def test_horovod_tf2_without_prefix_and_iteration_time_suffix():
    log = parse_log(HOROVOD_TF2 + "Img/sec per GPU: 402.0 +-1.6\nTotal img/sec on 2 GPU(s): 804.0 +-3.1\n")
    assert (log.status, log.model, log.num_gpus, log.batch_size_global) == ("ok", "ResNet50", 2, 128)
    assert log.steps == [Step(0, 401.2, None, None, None), Step(1, 402.8, None, None, None)]
    assert log.total_images_per_sec == 804.0


def test_horovod_no_total_and_oom():
    log = parse_log(HOROVOD_TF2)
    assert (log.status, log.failure_class) == ("failed", "no_result")
    assert log.failure_detail == "no 'Total img/sec' line in log (2 step lines parsed)"
    oom = "RuntimeError: CUDA out of memory. Tried to allocate 98.00 MiB (GPU 0; 15.78 GiB total capacity)"
    log = parse_log(HOROVOD_TF2 + "Traceback (most recent call last):\n" + oom + "\n")
    assert (log.failure_class, log.failure_detail) == ("oom", oom)


@pytest.mark.parametrize("line", [
    "RuntimeError: CUDA error: out of memory",
    "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
])
def test_pytorch_allocations_outside_its_caching_allocator_are_oom(line):
    log = parse_log(HOROVOD_TF2 + "Traceback (most recent call last):\n" + line + "\n")
    assert (log.failure_class, log.failure_detail) == ("oom", line)  # were other_error


def test_tf_cudnn_handle_allocation_failure_is_oom():
    """TF logs cuDNN's failed allocation at E, then raises an UnknownError that does not say memory: the GPU's memory
    was full (another process, a batch too large). Was other_error (nonzero_exit), so capacity never learnt the OOM."""
    alloc = ("2021-03-03 15:23:58.929966: E tensorflow/stream_executor/cuda/cuda_dnn.cc:336] Could not create cudnn "
             "handle: CUDNN_STATUS_ALLOC_FAILED")
    raised = ("tensorflow.python.framework.errors_impl.UnknownError: Failed to get convolution algorithm. This is "
              "probably because cuDNN failed to initialize, so try looking to see if a warning log message was printed "
              "above.")
    lines = (REAL_LOGS / "tfcnn_resnet50_1gpu_lambda-2080ti-tf115.log").read_text().splitlines()
    warm = lines.index("Running warm up")
    log = parse_log("\n".join([*lines[:warm + 1], alloc, alloc, "Traceback (most recent call last):",
                                '  File "tf_cnn_benchmarks.py", line 73, in <module>', raised]) + "\n")
    assert (log.status, log.failure_class, log.failure_detail) == ("failed", "oom", alloc)


def test_a_fatal_nccl_error_outranks_cumemallocs_info_line():
    """TF logs CUDA_ERROR_OUT_OF_MEMORY at INFO while it retries smaller chunks: in a run that then dies of NCCL,
    that line is not the failure (it was: `oom`, which also makes capacity skip later cases)."""
    info = ("2020-07-10 08:43:17.109212: I tensorflow/stream_executor/cuda/cuda_driver.cc:831] failed to allocate "
            "2.88G (3091663872 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory")
    lines = (REAL_LOGS / "tfcnn_alexnet_4gpu_lambda-3070-nccl-internalerror.log").read_text().splitlines()
    log = parse_log("\n".join([*lines[:20], info, *lines[20:]]) + "\n")
    assert log.failure_class == "nccl", (log.failure_class, log.failure_detail)
    alone = parse_log(HEADER + "Running warm up\n" + info + "\n")  # with nothing else, it is still the evidence
    assert (alone.failure_class, alone.failure_detail) == ("oom", info)


def test_cuda_driver_too_old():
    log = parse_log(fixture("tf_cnn_cuda_driver_too_old.log"))
    assert (log.status, log.failure_class) == ("failed", "cuda_driver")
    assert log.failure_detail == (
        "tensorflow.python.framework.errors_impl.InternalError: cudaGetDevice() failed. "
        "Status: CUDA driver version is insufficient for CUDA runtime version"
    )


def test_killed_without_total_is_no_result():
    log = parse_log(fixture("tf_cnn_killed_no_total.log"))
    assert (log.status, log.failure_class) == ("failed", "no_result")
    assert log.failure_detail == "no 'total images/sec' line in log (5 step lines parsed)"
    assert log.step_count == 5 and log.steps[-1] == Step(40, 1396.5, 1.2, 6.9, 8.350)
    assert (log.model, log.num_gpus, log.batch_size_global) == ("resnet101", 8, 512)


def test_killed_line_is_other_error():
    log = parse_log(fixture("tf_cnn_killed_no_total.log") + "Killed\n")
    assert (log.failure_class, log.failure_detail) == ("other_error", "Killed")


# --- small inline variants --------------------------------------------------

HEADER = """\
TensorFlow:  2.4
Model:       resnet50
Dataset:     imagenet (synthetic)
Mode:        training
Batch size:  64 global
             64 per device
Devices:     ['/gpu:0']
Variables:   replicated
==========
"""
RESULT = "total images/sec: 100.00\n"


@pytest.mark.parametrize(
    ("extra", "precision"),
    [
        ("+ python tf_cnn_benchmarks.py --model=resnet50 --use_fp16=True --num_gpus=1\n", "fp16"),
        ("python3 tf_cnn_benchmarks.py --use_fp16 --batch_size=64\n", "fp16"),
        ("python3 tf_cnn_benchmarks.py --use_fp16=False --batch_size=64\n", "fp32"),
        ("python3 tf_cnn_benchmarks.py --auto_mixed_precision=true\n", "fp16"),
        ("Data type:   float16\n", "fp16"),
        ("Data type:   float32\n", "fp32"),
        ("", None),
    ],
)
def test_precision_hints(extra, precision):
    assert parse_log(extra + HEADER + RESULT).precision == precision


def test_step_variants():
    steps = (
        "10\timages/sec: 1234.5\t7.100\n"  # multi-worker: no +/- and jitter
        "20\timages/sec: 1230.0 +/- 1.0 (jitter = 2.0)\tnan\n"  # diverged fp16 loss
        "30  images/sec: 1229.0 +/- 1.0 (jitter = 2.0)  6.9 0.1 0.5 1600000000\n"  # spaces, extra columns
    )
    log = parse_log(HEADER + steps + RESULT)
    assert log.steps == [
        Step(10, 1234.5, None, None, 7.1),
        Step(20, 1230.0, 1.0, 2.0, None),
        Step(30, 1229.0, 1.0, 2.0, 6.9),
    ]


@pytest.mark.parametrize(
    ("mode", "forward_only"),
    [("training", False), ("forward only", True), ("forward-only", True), ("train_and_eval", False),
     ("evaluation", True), ("evalation", True), ("something new", None)],
)  # fmt: skip
def test_modes(mode, forward_only):
    assert parse_log(HEADER.replace("training", mode) + RESULT).forward_only is forward_only


def test_cpu_only_devices_count_zero_gpus():
    log = parse_log(HEADER.replace("['/gpu:0']", "['/cpu:0']") + RESULT)
    assert (log.devices, log.num_gpus) == (["/cpu:0"], 0)


def test_import_error_before_header_vs_after():
    before = ('Traceback (most recent call last):\n  File "tf_cnn_benchmarks.py", line 29\n'
              'ModuleNotFoundError: No module named \'absl\'\n')
    log = parse_log(before)
    assert (log.failure_class, log.failure_detail) == ("import_error", "ModuleNotFoundError: No module named 'absl'")

    after = HEADER + "Traceback (most recent call last):\nImportError: cannot import name 'contrib'\n"
    assert parse_log(after).failure_class == "other_error"


def test_nccl_error_variants():
    for line in (
        "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:784, unhandled cuda error",
        "horovod.common.exceptions.HorovodInternalError: ncclCommInitRank failed: internal error",
        "[1,1]<stderr>:tensorflow.python.framework.errors_impl.UnknownError: ncclSystemError: System call failed",
        "[rank1]:[E1206 02:51:00.000000 1 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=41, OpType=ALLREDUCE, NumelIn=25557032, NumelOut=25557032, Timeout(ms)=600000) ran "
        "for 600018 milliseconds before timing out.",
    ):
        log = parse_log(HEADER + "Running warm up\n" + line + "\n")
        assert log.failure_class == "nccl", line
        assert log.failure_detail in line


def test_other_error_reports_last_exception():
    text = HEADER + "Traceback (most recent call last):\nValueError: first\n\nDuring handling...\nKeyError: 'second'\n"
    log = parse_log(text)
    assert (log.failure_class, log.failure_detail) == ("other_error", "KeyError: 'second'")


def test_failure_detail_is_trimmed():
    log = parse_log(HEADER + "RuntimeError: " + "x" * 1000 + "\n")
    assert log.failure_detail == ("RuntimeError: " + "x" * 1000)[:300]


def test_forced_format_never_raises_and_reports_no_result():
    log = parse_log("hello\nworld\n", fmt=TF)
    assert (log.format, log.status, log.failure_class) == (TF, "failed", "no_result")
    log = parse_log(real("tfcnn_resnet50_1gpu_lambda-2080ti-tf115.log"), fmt=HOROVOD)
    assert (log.format, log.status, log.step_count) == (HOROVOD, "failed", 0)


def test_unknown_format_cases():
    for text in ("", "hello world", "\x00\x01\x02"):
        assert detect_format(text) is None
        with pytest.raises(UnknownFormat):
            parse_log(text)
    with pytest.raises(UnknownFormat):
        parse_log(HEADER + RESULT, fmt="caffe")
    assert issubclass(UnknownFormat, ValueError)


def test_bytes_input_is_decoded():
    data = (HEADER + RESULT).encode() + b"\xff\xfe"
    assert parse_log(data).total_images_per_sec == 100.0


def test_to_dict_is_json_and_ordered():
    log = parse_log(real("tfcnn_resnet50_1gpu_lambda-2080ti-tf115.log"))
    data = log.to_dict()
    assert list(data) == CLI_FIELDS[1:-2]  # the CLI adds the harness's primary and metrics
    assert data["steps"][0] == {"step": 1, "images_per_sec": 295.2, "plusminus": 0.0, "jitter": 0.0, "loss": 8.22}
    assert json.loads(json.dumps(data, allow_nan=False)) == data
    assert isinstance(log, ParsedLog)


def test_to_dict_replaces_non_finite_floats():
    log = ParsedLog(format=TF, total_images_per_sec=float("inf"), steps=[Step(1, float("nan"), None, None, None)])
    data = log.to_dict()
    assert data["total_images_per_sec"] is None and data["steps"][0]["images_per_sec"] is None
    json.dumps(data, allow_nan=False)


# --- CLI ----------------------------------------------------------------------


def run_cli(files, fmt="auto"):
    out = io.StringIO()
    code = cli_parse([str(f) for f in files], fmt, out)
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


def test_cli_failed_run_exits_zero_with_json_lines():
    path = REAL_LOGS / "tfcnn_alexnet_4gpu_lambda-3070-nccl-internalerror.log"
    code, records = run_cli([path, FIXTURES / "horovod_pytorch_synthetic_4gpu_mpirun.log"])
    assert code == 0
    assert [list(r) for r in records] == [CLI_FIELDS, CLI_FIELDS]
    assert records[0]["file"] == str(path)
    assert (records[0]["status"], records[0]["failure_class"]) == ("failed", "nccl")
    assert (records[1]["format"], records[1]["total_images_per_sec"]) == (HOROVOD, 885.2)


def test_cli_missing_file_exits_two_and_continues(tmp_path, capsys):
    missing = tmp_path / "nope.log"
    good = REAL_LOGS / "tfcnn_resnet50_1gpu_lambda-2080ti-tf115.log"
    code, records = run_cli([missing, good])
    assert code == 2
    assert [r["file"] for r in records] == [str(good)]
    assert f"fleetbench parse: cannot read {missing}: No such file or directory" in capsys.readouterr().err


def test_cli_unrecognised_file_exits_two(capsys):
    path = REAL_LOGS / "lambda_thermal_inception3_8gpu_a100.csvlog"
    code, records = run_cli([path])
    assert (code, records) == (2, [])
    assert f"fleetbench parse: {path}: no known benchmark log format" in capsys.readouterr().err


def test_cli_forced_format_reads_anything():
    code, records = run_cli([REAL_LOGS / "lambda_thermal_inception3_8gpu_a100.csvlog"], fmt=TF)
    assert code == 0
    assert (records[0]["format"], records[0]["failure_class"]) == (TF, "no_result")


def test_cli_directory_and_bad_format(tmp_path, capsys):
    assert run_cli([tmp_path]) == (2, [])
    assert f"cannot read {tmp_path}" in capsys.readouterr().err
    assert run_cli([REAL_LOGS / "tfcnn_resnet50_1gpu_lambda-2080ti-tf115.log"], fmt="caffe") == (2, [])
    assert "unknown format 'caffe'" in capsys.readouterr().err


def test_cli_reads_invalid_utf8(tmp_path):
    path = tmp_path / "binary.log"
    path.write_bytes((HEADER + RESULT).encode() + b"\xc3\x28\xa0\xa1\n")
    code, records = run_cli([path])
    assert code == 0 and records[0]["status"] == "ok"


# --- results that are no measurement ------------------------------------------

HOROVOD_HEADER = (
    "Model: resnet50\nBatch size: 32\nNumber of GPUs: 4\nRunning benchmark...\nIter #0: 220.5 img/sec per GPU\n"
)


@pytest.mark.parametrize("value", ["-123.4", "0", "0.00", "1.2e", "12abc", "nan", ""])
def test_a_total_that_is_no_positive_number_is_no_result(value):
    log = parse_log(HEADER + f"total images/sec: {value}\n----------\n")
    assert (log.status, log.failure_class, log.total_images_per_sec) == ("failed", "no_result", None)
    assert log.failure_detail == f"'total images/sec' value {value!r} is not a positive number (0 step lines parsed)"


def test_a_total_cut_by_the_end_of_the_log_is_no_result():
    log = parse_log(HEADER + "100\timages/sec: 97.1 +/- 0.1 (jitter = 0.2)\t7.1\ntotal images/sec: 12")
    assert (log.status, log.failure_class, log.total_images_per_sec) == ("failed", "no_result", None)
    assert log.failure_detail == ("'total images/sec' line cut off, the log ends mid-line: "
                                  "'total images/sec: 12' (1 step lines parsed)")


def test_a_cut_last_line_that_is_no_result_changes_nothing():
    log = parse_log(HEADER + RESULT + "FLEETBENCH_TELEMETRY {\"nvml\": tr")
    assert (log.status, log.total_images_per_sec) == ("ok", 100.0)


def test_a_step_line_cut_by_the_end_of_the_log_is_not_a_step():
    log = parse_log(HEADER + "10\timages/sec: 97.1 +/- 0.1 (jitter = 0.2)\t7.1\n20\timages/sec: 9")
    assert [s.step for s in log.steps] == [10]


def test_a_later_valid_total_still_counts():
    log = parse_log(HEADER + "total images/sec: -1\ntotal images/sec: 250.5\n")
    assert (log.status, log.total_images_per_sec) == ("ok", 250.5)


@pytest.mark.parametrize(("tail", "detail"), [
    ("Total img/sec on 4 GPU(s): -885.2 +-8.4\n",
     "'Total img/sec' value '-885.2' is not a positive number (1 step lines parsed)"),
    ("Total img/sec on 4 GPU(s): 885",
     "'Total img/sec' line cut off, the log ends mid-line: 'Total img/sec on 4 GPU(s): 885' (1 step lines parsed)"),
])  # fmt: skip
def test_horovod_total_that_is_no_measurement(tail, detail):
    log = parse_log(HOROVOD_HEADER + tail, fmt=HOROVOD)
    assert (log.status, log.failure_class, log.failure_detail) == ("failed", "no_result", detail)
    assert log.num_gpus == 4


def test_cli_reports_a_cut_total(tmp_path):
    path = tmp_path / "cut.log"
    path.write_text(HEADER + "total images/sec: 1.2e")
    code, records = run_cli([path])
    assert code == 0
    assert (records[0]["status"], records[0]["failure_class"]) == ("failed", "no_result")
    assert "cut off" in records[0]["failure_detail"]


# --- files are streamed, and read as the text would be -------------------------


@pytest.mark.parametrize("path", sorted(REAL_LOGS.glob("*.log")) + sorted(FIXTURES.glob("*.log")), ids=lambda p: p.name)
def test_parse_log_file_equals_parse_log_of_its_text(path):
    for fmt in ("auto", TF, HOROVOD):
        try:
            expected = parse_log(read(path), fmt)
        except UnknownFormat:
            with pytest.raises(UnknownFormat):
                parse_log_file(path, fmt)
            continue
        assert parse_log_file(path, fmt) == expected


def test_steps_beyond_the_cap_are_counted_not_kept(monkeypatch):
    from fleetbench.parsing import model

    monkeypatch.setattr(model, "MAX_STEPS", 3)
    steps = "".join(f"{i}\timages/sec: 100.0 +/- 0.0 (jitter = 0.0)\t7.0\n" for i in range(1, 11))
    log = parse_log(HEADER + steps + RESULT)
    assert log.step_count == 10 and [s.step for s in log.steps] == [1, 2, 3]


TF_ILLEGAL_ADDRESS = (
    "2023-03-14 09:12:01.123456: E tensorflow/stream_executor/cuda/cuda_event.cc:29] Error polling for event status: "
    "failed to query event: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered\n"
    "2023-03-14 09:12:01.123500: F tensorflow/core/common_runtime/gpu/gpu_event_mgr.cc:273] Unexpected Event "
    "status: 1\nAborted (core dumped)\n")


@pytest.mark.parametrize("text", [
    TF_ILLEGAL_ADDRESS,
    "E tensorflow/stream_executor/cuda/cuda_driver.cc:1010] failed to synchronize the stop event: "
    "CUDA_ERROR_ECC_UNCORRECTABLE: uncorrectable ECC error encountered\n",
    "RuntimeError: CUDA error: uncorrectable ECC error encountered\nCUDA kernel errors might be asynchronously "
    "reported at some other API call, so the stacktrace below might be incorrect.\n",
    "torch.AcceleratorError: CUDA error: unspecified launch failure\n",
    # the fault first, then NCCL's error about it: the fault is the cause (as in nccl-tests)
    "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1269, unhandled cuda error\n",
])
def test_a_gpu_fault_under_the_framework_is_cuda_error(text):
    """An illegal address, a launch failure or an uncorrectable ECC error (an Xid, a dying board) is the GPU's
    fault, not the benchmark's: `cuda_error`, its line the detail, not the crash (other_error) it ends in."""
    log = parse_log(HEADER + "Running warm up\n" + text)
    assert log.failure_class == "cuda_error"
    assert "CUDA" in log.failure_detail and log.failure_detail in text


def test_cuda_statuses_that_are_not_gpu_faults_keep_their_class():
    oom = parse_log(HEADER + "Running warm up\nResourceExhaustedError: OOM when allocating tensor\n"
                    "E cuda_driver.cc:890] failed to alloc 8589934592 bytes on host: CUDA_ERROR_OUT_OF_MEMORY\n")
    assert oom.failure_class == "oom"
    # TF logs cuInit's failure on every CPU-only run: a CPU case that failed otherwise keeps its own error
    cpu = parse_log(HEADER + "E cuda_driver.cc:318] failed call to cuInit: CUDA_ERROR_NO_DEVICE: no "
                    "CUDA-capable device is detected\nValueError: bad --data_format\n")
    assert (cpu.failure_class, cpu.failure_detail) == ("other_error", "ValueError: bad --data_format")
    launcher = parse_log(HEADER + "Running warm up\nmpirun launched 2 processes\nKeyError: 'x'\n")
    assert launcher.failure_class == "other_error"


@pytest.mark.parametrize("init, raised", [
    ("E cuda_driver.cc:318] failed call to cuInit: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected", None),
    ("E cuda_driver.cc:282] failed call to cuInit: CUDA_ERROR_SYSTEM_NOT_READY: system not yet initialized", None),
    ("E cuda_driver.cc:282] failed call to cuInit: CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE: forward compatibility "
     "was attempted on non supported HW", None),
    (None, "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
           "installed a driver from http://www.nvidia.com/Download/index.aspx"),
    (None, "RuntimeError: No CUDA GPUs are available"),
    (None, "RuntimeError: CUDA error: system not yet initialized"),
])
def test_cuda_that_could_not_start_is_cuda_driver_naming_why(init, raised):
    """No device visible, Fabric Manager down on an NVSwitch host, cuda-compat on a GPU without it: README's
    cuda_driver ("CUDA could not initialise"), with CUDA's line as the detail, not the device-placement error TF
    ends with (it was other_error, then nonzero_exit)."""
    end = raised or ("tensorflow.python.framework.errors_impl.InvalidArgumentError: Cannot assign a device for "
                     "operation tower_0/v/cg/conv0/conv2d/Conv2D: Could not satisfy explicit device specification "
                     "'/device:GPU:0' because no supported kernel for GPU devices is available.")
    log = parse_log(HEADER + (init + "\n" if init else "") + "Traceback (most recent call last):\n" + end + "\n")
    assert (log.failure_class, log.failure_detail) == ("cuda_driver", init or raised)
