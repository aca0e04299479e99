"""Classification of a case's end: Docker's view of the container plus what its log says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetbench.measure import classify, measure
from fleetbench.parsing import parse_log

REAL_LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "real-logs"  # tests/fixtures/real-logs/SOURCES.md
OK_LOG = (REAL_LOGS / "tfcnn_resnet50_1gpu_lambda-2080ti-tf115.log").read_text()
OOM_LOG = (REAL_LOGS / "tfcnn_vgg16_1gpu_lambda-2080maxq-tf115-oom-training.log").read_text()
NCCL_LOG = (REAL_LOGS / "tfcnn_alexnet_4gpu_lambda-3070-nccl-internalerror.log").read_text()
HEADER_ONLY = OK_LOG.split("Done warm up")[0]


def outcome(**kw) -> dict:
    return {"exit_code": 0, "oom_killed": False, "timed_out": False, "start_error_class": None, "error": None, **kw}


def parsed(text: str):
    return parse_log(text, "tf_cnn_benchmarks")


@pytest.mark.parametrize("out, text, expected", [
    (outcome(), OK_LOG, ("ok", None)),
    (outcome(exit_code=1), OOM_LOG, ("failed", "gpu_oom")),
    (outcome(exit_code=137, oom_killed=True), HEADER_ONLY, ("failed", "oom_killed")),
    (outcome(exit_code=137), HEADER_ONLY, ("failed", "killed")),
    (outcome(exit_code=134), HEADER_ONLY + "\nAborted (core dumped)\n", ("failed", "core_dump")),
    (outcome(exit_code=139), HEADER_ONLY, ("failed", "core_dump")),
    (outcome(exit_code=1), HEADER_ONLY + "\n已放棄 (吐核)\n", ("failed", "core_dump")),
    (outcome(exit_code=143, timed_out=True), HEADER_ONLY, ("failed", "timeout")),
    (outcome(exit_code=1), NCCL_LOG, ("failed", "nccl")),
    (outcome(exit_code=3), HEADER_ONLY + "\nsomething else broke\n", ("failed", "nonzero_exit")),
    (outcome(), HEADER_ONLY, ("failed", "no_result")),
    (outcome(exit_code=None, start_error_class="no_gpu_runtime",
             error='500 Server Error: could not select device driver "" with capabilities: [[gpu]]'), "",
     ("failed", "no_gpu_runtime")),
])
def test_classify(out, text, expected):
    status, failure_class, detail = classify(out, parsed(text) if text else None, text)
    assert (status, failure_class) == expected
    if status == "failed":
        assert detail  # a person can read why


def test_measure_reads_the_saved_log(tmp_path):
    log = tmp_path / "case.log"
    log.write_text(OK_LOG)
    fields, steps = measure({"command": ["x"]}, outcome(log_path=str(log), duration_s=12.5))
    assert fields["status"] == "ok" and fields["images_per_sec"] == 292.85
    assert fields["step_count"] == 11 == len(steps)
    assert steps[-1] == {"step": 100, "images_per_sec": 293.1, "plusminus": 0.2, "jitter": 1.3, "loss": 8.036}


def test_measure_without_a_log_is_no_result(tmp_path):
    fields, steps = measure({"command": ["x"]}, outcome(log_path=str(tmp_path / "missing.log")))
    assert (fields["status"], fields["failure_class"], steps) == ("failed", "no_result", [])


def test_measured_telemetry_becomes_row_fields(tmp_path):
    report = {"nvml": True, "energy_source": "measured", "energy_j": 12000.0, "mean_power_w": 300.0,
              "peak_mem_used_mib": 30512.0, "gpus": [{"mean_util_pct": 97.0}, {"mean_util_pct": 95.0}]}
    log = tmp_path / "case.log"
    log.write_text(OK_LOG + "FLEETBENCH_TELEMETRY " + __import__("json").dumps(report) + "\n")
    fields, _ = measure({"command": ["x"]}, outcome(log_path=str(log)))
    assert fields["status"] == "ok"
    assert (fields["energy_source"], fields["energy_j"], fields["mean_power_w"]) == ("measured", 12000.0, 300.0)
    assert (fields["peak_gpu_mem_mib"], fields["mean_gpu_util_pct"]) == (30512.0, 96.0)


def test_reported_accuracy_reaches_the_row_and_gives_time_to_accuracy(tmp_path):
    from fleetbench.metrics import MetricSettings, derive

    log = tmp_path / "eval.log"
    log.write_text((Path(__file__).resolve().parents[1] / "fixtures" / "logs"
                    / "tf_cnn_eval_accuracy_real_data.log").read_text())
    fields, steps = measure({"command": ["x"]}, outcome(log_path=str(log), duration_s=42.0))
    assert fields["status"] == "ok" and fields["accuracy_top1"] == 0.75
    row = {"host": "h", "case_key": "k", "num_gpus": 1, "device": "gpu", "model": "resnet50",
           "batch_size_per_device": 64, "gpu_model": None, "command": ["x"], **fields}
    steps = [{"host": "h", "case_key": "k", **s} for s in steps]
    [reached] = derive([dict(row)], steps, None, MetricSettings(target_accuracy_top1=0.7))
    [missed] = derive([dict(row)], steps, None, MetricSettings(target_accuracy_top1=0.8))
    assert reached["time_to_accuracy_s"] == 42.0  # the final accuracy 0.75 >= 0.70 when the case ended
    assert missed["time_to_accuracy_s"] is None


def test_measure_streams_the_log_and_never_opens_a_fifo(tmp_path):
    """A case's log is parsed as a stream (only its end is read as text); a FIFO in its place is not a log."""
    import os
    import signal

    big = tmp_path / "big.log"
    step = "10\timages/sec: 100.1 +/- 0.0 (jitter = 0.0)\t7.000\n"
    total = "total images/sec: 123.45\n"
    with big.open("w") as f:
        f.write(HEADER_ONLY + "Done warm up\nStep\tImg/sec\ttotal_loss\n" + step * 200_000 + "-" * 40 + "\n" + total)
    fields, steps = measure({"command": ["x"]}, outcome(log_path=str(big)))
    assert (fields["status"], fields["images_per_sec"]) == ("ok", 123.45) and fields["step_count"] == 200_000
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    signal.alarm(20)  # a hang fails the test instead of blocking the suite
    try:
        fields, _ = measure({"command": ["x"]}, outcome(log_path=str(fifo)))
    finally:
        signal.alarm(0)
    assert (fields["status"], fields["failure_class"]) == ("failed", "no_result")


def test_one_failure_vocabulary_for_the_parser_cli_and_the_warehouse(tmp_path):
    """`fleetbench parse` names a GPU OOM as the rows do (gpu_oom), and every class a row can carry is listed."""
    import io

    from fleetbench.failures import FAILURE_CLASSES, LOG_CLASSES
    from fleetbench.parsing import cli_parse
    from fleetbench.parsing.model import FAILURE_CLASSES as PARSER_CLASSES

    out = io.StringIO()
    assert cli_parse([str(REAL_LOGS / "tfcnn_vgg16_1gpu_lambda-2080maxq-tf115-oom-training.log")], "auto", out) == 0
    assert json.loads(out.getvalue())["failure_class"] == "gpu_oom"
    assert set(PARSER_CLASSES) <= set(LOG_CLASSES) and set(LOG_CLASSES.values()) <= set(FAILURE_CLASSES)
    log = tmp_path / "oom.log"
    log.write_text(OOM_LOG)
    fields, _ = measure({"command": ["x"]}, outcome(exit_code=1, log_path=str(log)))
    assert fields["failure_class"] == "gpu_oom" in FAILURE_CLASSES


RETRIES_ONLY = "".join(OOM_LOG.splitlines(keepends=True)[:127])
"""The real OOM log up to its last recoverable retry: warm-up, TF's INFO ``CUDA_ERROR_OUT_OF_MEMORY`` lines and
'The caller indicates that this is not a failure' warnings, before any fatal OOM line."""


@pytest.mark.parametrize("exit_code, tail, expected", [
    (139, "", "core_dump"),
    (137, "", "killed"),
    (1, "Traceback (most recent call last):\n"
        "tensorflow.python.framework.errors_impl.InvalidArgumentError: Nan in summary histogram for: gradients\n",
     "nonzero_exit"),
    (1, "", "gpu_oom"),  # nothing else explains the end: the retry line stays the evidence
])
def test_tfs_recoverable_cuda_oom_line_does_not_hide_how_the_run_ended(tmp_path, exit_code, tail, expected):
    """A crash, a SIGKILL or another exception after TF's retry lines is that, not gpu_oom (capacity would skip
    the batch on later nights as an OOM on record)."""
    assert "CUDA_ERROR_OUT_OF_MEMORY" in RETRIES_ONLY and "not a failure" in RETRIES_ONLY
    assert "ResourceExhausted" not in RETRIES_ONLY and "OOM when allocating" not in RETRIES_ONLY
    log = tmp_path / "case.log"
    log.write_text(RETRIES_ONLY + tail)
    fields, _ = measure({"command": ["x"]}, outcome(exit_code=exit_code, log_path=str(log)))
    assert (fields["status"], fields["failure_class"]) == ("failed", expected), fields["failure_detail"]
    if tail:
        assert "InvalidArgumentError: Nan in summary histogram" in fields["failure_detail"]


@pytest.mark.parametrize("exit_code", [1, 134, 137, 139])
def test_a_fatal_gpu_oom_outranks_the_exit_status(tmp_path, exit_code):
    """The real OOM log (ResourceExhausted after the retries), and an exception that raises cuMemAlloc's error,
    are gpu_oom however the process then ended."""
    raised = ("tensorflow.python.framework.errors_impl.InternalError: failed initializing StreamExecutor for CUDA "
              "device ordinal 0: Internal: failed call to cuDevicePrimaryCtxRetain: CUDA_ERROR_OUT_OF_MEMORY: out "
              "of memory; total memory reported: 11554717696\n")
    for text in (OOM_LOG, HEADER_ONLY + "Traceback (most recent call last):\n" + raised):
        log = tmp_path / "case.log"
        log.write_text(text)
        fields, _ = measure({"command": ["x"]}, outcome(exit_code=exit_code, log_path=str(log)))
        assert fields["failure_class"] == "gpu_oom", fields["failure_detail"]


def test_an_unknown_exit_status_never_reads_as_exited_0_and_the_parsers_detail_is_kept():
    """An outcome without an exit status (e.g. read back without one) is not 'exited 0'; the parser's own detail
    (the exception it found, how many steps ran) says more than a generic line."""
    truncated = (REAL_LOGS / "tfcnn_inception3_1gpu_lambda-radeonvii-truncated.log").read_text()
    status, failure_class, detail = classify({"exit_code": None}, parsed(truncated), truncated)
    assert (status, failure_class) == ("failed", "no_result")
    assert "exited 0" not in detail and detail.startswith("exit status unknown")
    assert parsed(truncated).failure_detail in detail  # how many steps it parsed
    assert classify({"exit_code": 0}, parsed(truncated), truncated)[2].startswith("exited 0")
    exception = "tensorflow.python.framework.errors_impl.InvalidArgumentError: Nan in summary histogram for: x"
    text = HEADER_ONLY + "Traceback (most recent call last):\n" + exception + "\nmpirun: primary job terminated\n"
    status, failure_class, detail = classify({"exit_code": 1}, parsed(text), text)
    assert (failure_class, detail) == ("nonzero_exit", f"exit 1: {exception}; last line: mpirun: primary job "
                                                       "terminated")
    quiet = HEADER_ONLY + "\nsomething else broke\n"  # no error line: the exit explains the missing result
    assert classify({"exit_code": 3}, parsed(quiet), quiet)[2] == "exit 3: something else broke"
