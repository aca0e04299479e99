"""Harnesses: the registry, the command harness's metric lines and regexes, and nccl-tests logs (real outputs)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fleetbench.harnesses import HARNESSES, get
from fleetbench.harnesses.base import MAX_METRICS
from fleetbench.harnesses.command import backtracking_problem, measure_lines, pattern_problem
from fleetbench.harnesses.nccl_tests import measure_lines as nccl_measure
from fleetbench.measure import classify, measure
from fleetbench.parsing.source import text_lines

GPU_TOOLS = Path(__file__).resolve().parents[1] / "fixtures" / "gpu-tools"


def lines(text: str):
    return text_lines(text)


def metric_line(metric="tokens_per_sec", value=1234.5, unit="tok/s", **extra) -> str:
    return json.dumps({"metric": metric, "value": value, "unit": unit, **extra})


def test_registry_names_every_harness_and_refuses_an_unknown_one():
    assert set(HARNESSES) == {"tf_cnn_benchmarks", "torch_synthetic", "command", "nccl_tests"}
    assert get(None).name == "tf_cnn_benchmarks"
    with pytest.raises(KeyError, match="unknown harness 'caffe'.*known: command, nccl_tests, tf_cnn_benchmarks, "
                                       "torch_synthetic"):
        get("caffe")


# -- command: JSON lines --------------------------------------------------------------------------
def test_json_lines_become_samples_and_the_first_is_primary():
    text = "\n".join([
        "starting up", metric_line(), metric_line("latency_p50", 12.5, "ms"),
        metric_line("latency_p50", 11.0, "ms", labels={"stage": "decode"}),
        metric_line("tokens_per_sec", 1500.0, "tok/s", better="higher"), "done"]) + "\n"
    measured = measure_lines(lines(text), {"json_lines": True, "primary": None, "patterns": []})
    by = {(s.metric, json.dumps(s.labels)): s for s in measured.samples}
    assert measured.primary == "tokens_per_sec"
    assert measured.primary_sample().value == 1500.0  # the last value of a metric wins
    assert (by[("latency_p50", "{}")].value, by[("latency_p50", "{}")].better) == (12.5, "lower")  # time unit
    assert by[("latency_p50", '{"stage": "decode"}')].value == 11.0
    assert measured.dropped == {}


def test_bad_metric_lines_are_dropped_and_counted():
    text = "\n".join([
        metric_line(), metric_line("a", float("nan")), metric_line("b", float("inf")), metric_line("c", "fast"),
        metric_line("d", 1.0, "furlongs/fortnight"), metric_line("e", True), metric_line("f", 1.0, better="sideways"),
        metric_line("bad name!", 1.0), '{"metric": "g", "value": 1.0, "unit": "tok/s"', "[1, 2]",
        metric_line("h", 1.0, labels={f"k{i}": "v" * 150 for i in range(8)}), metric_line("i", 1.0, labels=[1])]) + "\n"
    measured = measure_lines(lines(text), {"json_lines": True, "patterns": []})
    assert [s.metric for s in measured.samples] == ["tokens_per_sec"]
    assert measured.dropped == {"not finite": 2, "not a number": 2, "unknown unit": 1, "better not higher|lower": 1,
                                "bad metric name": 1, "not JSON": 1, "bad labels": 2}
    assert measured.dropped_detail() == ("dropped 10 metric sample(s): 2 bad labels, 1 bad metric name, "
                                         "1 better not higher|lower, 1 not JSON, 2 not a number, 2 not finite, "
                                         "1 unknown unit")


def test_ten_thousand_metrics_keep_the_first_thousand():
    text = "".join(metric_line(f"m{i}", float(i), "count") + "\n" for i in range(10_000))
    measured = measure_lines(lines(text), {"json_lines": True, "patterns": []})
    assert len(measured.samples) == MAX_METRICS and measured.samples[-1].metric == f"m{MAX_METRICS - 1}"
    assert measured.dropped == {f"over {MAX_METRICS} metrics": 10_000 - MAX_METRICS}


def test_named_regexes_read_a_plain_log_and_the_configured_primary():
    settings = {"json_lines": False, "primary": "p99", "patterns": [
        {"metric": "throughput", "regex": r"throughput: ([0-9.]+) req/s", "unit": "requests/s", "better": None},
        {"metric": "p99", "regex": r"p99 latency ([0-9.]+)ms", "unit": "ms", "better": "lower"}]}
    text = "warming up\nthroughput: 812.5 req/s\np99 latency 41.25ms\nthroughput: 820.0 req/s\n"
    measured = measure_lines(lines(text), settings)
    assert measured.primary == "p99" and measured.primary_sample().value == 41.25
    assert {s.metric: s.value for s in measured.samples} == {"throughput": 820.0, "p99": 41.25}
    # JSON lines are not read when turned off
    assert measure_lines(lines(metric_line() + "\n"), settings).samples == []


def test_a_metric_line_nested_past_the_json_parsers_depth_is_dropped():
    text = '{"metric": "x", "value": ' + "[" * 5000 + "\n" + metric_line() + "\n"
    measured = measure_lines(lines(text), {"json_lines": True, "patterns": []})  # was a RecursionError
    assert [s.metric for s in measured.samples] == ["tokens_per_sec"] and measured.dropped == {"not JSON": 1}


def test_the_telemetry_report_is_not_read_as_the_benchmarks_output():
    """The wrapper's last line (its JSON has `count`, `samples`, `duration_s`, ...) is not the benchmark's: a pattern
    that would match its keys reads only what the benchmark printed, also where it printed no final newline."""
    settings = {"json_lines": True, "primary": None, "patterns": [
        {"metric": "error_count", "regex": r"count\D{0,3}(\d+)", "unit": "count", "better": "lower"}]}
    report = 'FLEETBENCH_TELEMETRY {"nvml":false,"cpu":{"usage_s":0.01,"count":2,"sockets":1}}'
    for text in (f"throughput 1234.5\nerror count: 0\n{report}\n", f"throughput 1234.5\nerror count: 0{report}\n"):
        measured = measure_lines(lines(text), settings)
        assert {s.metric: s.value for s in measured.samples} == {"error_count": 0.0}, text


def test_a_metric_json_line_without_a_final_newline_counts_when_it_parses_whole():
    """`printf '{"metric": ...}'` leaves no line break: the object's closing brace shows it whole, with or without the
    wrapper's report glued after it (which now makes that line read as cut); a cut one still counts as cut off."""
    settings = {"json_lines": True, "primary": None, "patterns": []}
    whole = '{"metric": "throughput", "value": 1234.5, "unit": "items/s"}'
    report = 'FLEETBENCH_TELEMETRY {"nvml":false,"cpu":{"usage_s":0.01}}'
    for text in (whole, whole + report + "\n", whole + "\n" + report + "\n"):
        measured = measure_lines(lines(text), settings)
        assert {s.metric: s.value for s in measured.samples} == {"throughput": 1234.5}, text
    for text in (whole[:-8], whole[:-8] + report + "\n"):
        measured = measure_lines(lines(text), settings)
        assert measured.samples == [] and measured.dropped == {"cut-off line": 1}, text


GROUP = "a repeated group"
PAIR = "two repeats can match the same characters"


@pytest.mark.parametrize("pattern, problem", [
    (r"(a+)+$", GROUP),
    (r"^(\w*\s?)*x", GROUP),
    (r"((?:ab)*c)+", GROUP),
    (r"(?:x|(y+))*z", GROUP),
    # each of these took seconds on a line of a few dozen to a few hundred characters
    (r"(?:a|a)*(b)", GROUP),
    (r"(a|aa)*c", GROUP),
    (r"(?>(a+)+b)", GROUP),
    (r"x=.*.*.*(\d+)y", PAIR),
    (r"(\d*)\d*\d*\d*y", PAIR),
    (r".*(\d+)y", PAIR),
    (r"x.*y.*(\d+)", PAIR),
    (r"(\d+)(?:\.\d+)?\d+", PAIR),
    (r"(a)\1", "backreferences are not allowed"),
    (r"rate ([0-9.]+", "does not compile"),
    (r"rate [0-9.]+", "must have exactly one capture group (the value), has 0"),
    (r"(\d+) of (\d+)", "must have exactly one capture group (the value), has 2"),
])
def test_bad_patterns_are_named(pattern, problem):
    assert problem in pattern_problem(pattern)


@pytest.mark.parametrize("pattern", [r"throughput: ([0-9.]+) req/s", r"^\s*step \d+: (\d+(?:\.\d+)?) tok/s$",
                                     r"(?:total|sum)=([-+0-9.eE]+)", r"(a{1,3})", r"(\d+)x",
                                     r"loss=([0-9.]+), acc=[0-9.]+", r"[xy]+=(\d+)"])
def test_good_patterns_pass(pattern):
    assert pattern_problem(pattern) is None and backtracking_problem(pattern) is None


# -- classify with a harness's reading ------------------------------------------------------------
def test_a_case_without_metrics_is_no_result_and_dropped_lines_are_in_the_detail(tmp_path):
    log = tmp_path / "case.log"
    log.write_text("hello\n" + metric_line("x", float("nan")) + "\n")
    case = {"command": ["x"], "harness": "command", "harness_settings": {"json_lines": True, "patterns": []}}
    out = {"exit_code": 0, "log_path": str(log)}
    fields, _ = measure(case, out)
    assert (fields["status"], fields["failure_class"]) == ("failed", "no_result")
    assert fields["failure_detail"] == ("exited 0 but printed no metric (any); "
                                        "dropped 1 metric sample(s): 1 not finite")
    log.write_text(metric_line() + "\n" + metric_line("x", "NaN") + "\n")
    fields, _ = measure(case, out)
    assert (fields["status"], fields["failure_detail"]) == ("ok", "dropped 1 metric sample(s): 1 not a number")
    assert (fields["metric"], fields["value"], fields["unit"], fields["better"]) == (
        "tokens_per_sec", 1234.5, "tok/s", "higher")
    assert fields["metric_samples"] == [{"metric": "tokens_per_sec", "value": 1234.5, "unit": "tok/s",
                                         "better": "higher", "labels": {}}]
    # a configured primary the case did not print: no_result, named
    case["harness_settings"] = {"json_lines": True, "patterns": [], "primary": "p99"}
    fields, _ = measure(case, out)
    assert (fields["status"], fields["failure_class"]) == ("failed", "no_result")
    assert fields["failure_detail"].startswith("exited 0 but printed no metric p99")
    assert fields["metric_samples"][0]["metric"] == "tokens_per_sec"  # what it did print is kept


# -- nccl-tests: every published output -----------------------------------------------------------
def nccl(name: str):
    return nccl_measure(text_lines((GPU_TOOLS / name).read_text()))


def samples_of(measured) -> dict:
    return {(s.metric, s.labels.get("placement")): s.value for s in measured.samples}


def test_every_nccl_fixture_is_read():
    files = sorted(p.name for p in GPU_TOOLS.glob("nccl_*"))
    assert len(files) == 5
    for name in files:
        measured = nccl(name)
        assert measured.step_count > 0 or measured.failure_class, name


def test_nccl_old_error_column_layout():
    measured = nccl("nccl_all_reduce_12gpu-1proc_v100-dgx2_old-error-column.log")
    assert measured.failure_class is None and measured.step_count == 31
    assert measured.primary_sample().value == 42.5578 and measured.primary_sample().unit == "GB/s"
    s = samples_of(measured)
    # the largest size, 8589934592 B: out-of-place 67.40 / 123.56, in-place 67.40 / 123.57
    assert (s[("algbw", "out_of_place")], s[("busbw", "out_of_place")]) == (67.40, 123.56)
    assert (s[("algbw", "in_place")], s[("busbw", "in_place")]) == (67.40, 123.57)
    assert s[("time", "out_of_place")] == 127453 and s[("out_of_bounds_values", None)] == 0
    sizes = {x.labels.get("size_bytes") for x in measured.samples if x.labels}
    assert sizes == {8589934592}
    rs = nccl("nccl_reduce_scatter_12gpu-1proc_v100-dgx2_old-error-column.log")
    assert rs.failure_class is None and rs.primary_sample().value == 20.3609
    assert samples_of(rs)[("busbw", "in_place")] == 63.72


def test_nccl_mpirun_rank_prefixes():
    measured = nccl("nccl_all_reduce_2rank-2node_t4-efa_mpirun-prefix_nccl-info.log")
    assert measured.failure_class is None and measured.primary_sample().value == 1.15327
    s = samples_of(measured)
    assert (s[("busbw", "out_of_place")], s[("busbw", "in_place")]) == (3.11, 3.12)
    assert measured.step_count == 31  # the rank-0 table, 0 B to 1 GiB


def test_an_nccl_summary_cut_mid_number_is_no_result(tmp_path):
    """A log that ends inside `# Avg bus bandwidth    : 1.15327` holds no result (as tf_cnn_benchmarks' cut
    `total images/sec` line does not): 1.1 GB/s would be stored and compared as a measurement."""
    full = (GPU_TOOLS / "nccl_all_reduce_2rank-2node_t4-efa_mpirun-prefix_nccl-info.log").read_text()
    cut = full[: full.index("# Avg bus bandwidth    : 1.15327") + len("# Avg bus bandwidth    : 1.1")]
    measured = nccl_measure(text_lines(cut))
    assert measured.primary_sample() is None and "avg_busbw" not in {s.metric for s in measured.samples}
    assert measured.step_count == 31  # the table rows before it are whole
    assert "cut off" in measured.failure_detail and "1.1'" in measured.failure_detail
    log = tmp_path / "cut.log"
    log.write_text(cut)
    fields, _ = measure({"harness": "nccl_tests", "command": ["x"]}, {"exit_code": 0, "log_path": str(log)})
    assert (fields["status"], fields["failure_class"], fields["value"]) == ("failed", "no_result", None)
    assert nccl_measure(text_lines(cut + "5327\n")).primary_sample().value == 1.15327
    code, records, _ = run_parse("--format", "nccl_tests", str(log))
    assert code == 0 and (records[0]["status"], records[0]["failure_class"]) == ("failed", "no_result")
    assert "cut off" in records[0]["failure_detail"]


def test_the_telemetry_report_glued_to_a_cut_summary_leaves_it_cut(tmp_path):
    """The wrapper prints its report after the benchmark ends; when the benchmark's output ended mid-line (an abort
    with text left in its stdio buffer), the report is glued to that line. The line is still cut: no 1.1 GB/s taken
    from `1.1FLEETBENCH_TELEMETRY {...}`, and the report itself is still read (it was: `avg_busbw` 1.1, ok)."""
    from fleetbench.telemetry import MARKER, parse_report

    full = (GPU_TOOLS / "nccl_all_reduce_2rank-2node_t4-efa_mpirun-prefix_nccl-info.log").read_text()
    cut = full[: full.index("# Avg bus bandwidth    : 1.15327") + len("# Avg bus bandwidth    : 1.1")]
    report = MARKER + json.dumps({"nvml": False, "reason": "a CPU case: GPUs not sampled", "gpus": []})
    measured = nccl_measure(text_lines(cut + report + "\n"))
    assert measured.primary_sample() is None and "avg_busbw" not in {s.metric for s in measured.samples}
    assert "cut off" in measured.failure_detail and "1.1'" in measured.failure_detail
    log = tmp_path / "cut.log"
    log.write_text(cut + report + "\n")
    fields, _ = measure({"harness": "nccl_tests", "command": ["x"]}, {"exit_code": None, "log_path": str(log)})
    assert (fields["status"], fields["failure_class"], fields["value"]) == ("failed", "no_result", None)
    assert parse_report(log.read_text())["reason"] == "a CPU case: GPUs not sampled"
    # a whole last line before the report, and the report on its own line, read as they always did
    assert list(text_lines("a\n" + report + "\n")) == [("a", True), (report, True)]
    assert list(text_lines("a" + report + "\n")) == [("a", False), (report, True)]
    assert list(text_lines("a" + report)) == [("a", False), (report, False)]


def test_nccl_wrong_results_fail_the_case():
    measured = nccl("nccl_all_reduce_2rank-2node_gh200_v2.17.8_wrong-4-failed.log")
    assert measured.failure_class == "wrong_results"
    assert measured.failure_detail == "Out of bounds values : 4 FAILED"
    assert samples_of(measured)[("out_of_bounds_values", None)] == 4
    assert measured.primary_sample().value == 4.79995  # still recorded, on a failed row
    status, failure_class, _ = classify({"exit_code": 1}, measured, "")
    assert (status, failure_class) == ("failed", "wrong_results")


def test_nccl_warn_cuda_failure_is_a_cuda_error():
    measured = nccl("nccl_all_reduce_2gpu-1proc_rtx5090_nccl-warn-cuda-failure.log")
    assert measured.failure_class == "cuda_error"
    assert "Cuda failure 1 'invalid argument'" in measured.failure_detail
    assert measured.primary_sample() is None and measured.step_count == 0
    assert samples_of(measured)[("nccl_warnings", None)] == 5


def test_nccl_cuda_failure_without_nccl_debug_is_a_cuda_error():
    """NCCL_DEBUG is unset by default: NCCL then prints no INFO or WARN lines, and the same failure shows only as
    nccl-tests' 'unhandled cuda error'. It is the same class as with NCCL_DEBUG=INFO, not nccl."""
    real = (GPU_TOOLS / "nccl_all_reduce_2gpu-1proc_rtx5090_nccl-warn-cuda-failure.log").read_text()
    quiet = "".join(line for line in real.splitlines(keepends=True)
                    if "NCCL INFO" not in line and "NCCL WARN" not in line)
    assert "unhandled cuda error" in quiet and "Cuda failure" not in quiet
    measured = nccl_measure(lines(quiet))
    assert measured.failure_class == "cuda_error" == nccl("nccl_all_reduce_2gpu-1proc_rtx5090_nccl-warn-cuda-failure"
                                                          ".log").failure_class
    assert measured.failure_detail.startswith("GENOA-06: Test NCCL failure common.cu:392 'unhandled cuda error")
    system = nccl_measure(lines(quiet.replace("unhandled cuda error", "unhandled system error")))
    assert system.failure_class == "nccl"


@pytest.mark.parametrize("quoted, failure_class", [
    ("'out of memory'", "gpu_oom"),  # a size_ranges too large for the GPU, or memory another process holds
    ("'CUDA driver version is insufficient for CUDA runtime version'", "cuda_driver"),  # NVIDIA/nccl-tests#98
    ("'no CUDA-capable device is detected'", "cuda_driver"),
    ("'an illegal memory access was encountered'", "cuda_error"),  # a GPU fault
])
def test_an_nccl_tests_cuda_failure_is_classed_by_what_it_quotes(quoted, failure_class):
    """Every CUDA failure was `cuda_error`, README's GPU fault (an Xid, a dying board): an operator sent to check the
    hardware for buffers that did not fit, or for a driver older than the image's CUDA."""
    real = (GPU_TOOLS / "nccl_all_reduce_2gpu-1proc_rtx5090_nccl-warn-cuda-failure.log").read_text()
    head = real[:real.index("#       size")] if "#       size" in real else real[:2000]
    for line in (f"node1: Test CUDA failure common.cu:1045 {quoted}\n",
                 f"node1:4766:4781 [3] include/alloc.h:125 NCCL WARN Cuda failure 2 {quoted}\n"):
        measured = nccl_measure(lines(head + line))
        assert (measured.failure_class, measured.failure_detail) == (failure_class, line.strip())
        assert classify({"exit_code": 134}, measured, head + line)[1] == failure_class  # an abort keeps it


def test_nccl_aborts_and_errors_without_a_summary():
    header = ("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw"
              "   busbw #wrong\n")
    row = ("     1048576        262144     float     sum      -1    89.15   11.76   21.56      0    88.14   11.90"
           "   21.81      0\n")
    warn = nccl_measure(lines(header + row + "host:1:1 [0] transport.cc:12 NCCL WARN Net : Connection closed\n"))
    assert (warn.failure_class, warn.failure_detail) == ("nccl", "host:1:1 [0] transport.cc:12 NCCL WARN Net : "
                                                                 "Connection closed")
    aborted = nccl_measure(lines(header + row + "Aborted (core dumped)\n"))
    assert aborted.failure_class == "nccl" and aborted.step_count == 1
    wrong = nccl_measure(lines(header + row.replace("21.56      0", "21.56      7") + "# Avg bus bandwidth    : 21\n"))
    assert (wrong.failure_class, wrong.failure_detail) == ("wrong_results", "7 wrong value(s) in the #wrong columns")
    benign = nccl_measure(lines("x:1:1 [0] NCCL WARN Could not find a path for pattern 4, falling back\n" + header
                                + row + "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 21.5\n"))
    assert benign.failure_class is None and benign.primary_sample().value == 21.5
    assert not math.isnan(benign.primary_sample().value)


# -- config: each benchmark against its harness ---------------------------------------------------
def fleet(*benchmarks: dict) -> dict:
    return {
        "hosts": [{"name": "gpu-01", "connection": "ssh_gpu_01", "docker_url": "tcp://gpu-01:2376",
                   "docker_tls_conn_id": "tls"}],
        "images": [{"name": "tf1", "ref": "nvcr.io/nvidia/tensorflow:23.03-tf1-py3", "command": ["python", "tf.py"]},
                   {"name": "pt", "ref": "nvcr.io/nvidia/pytorch:25.01-py3"}],
        "benchmarks": list(benchmarks),
    }


CNN = {"name": "cnn", "image": "tf1", "models": ["resnet50"], "batch_sizes": [64]}
NCCL = {"name": "nccl", "image": "pt", "harness": "nccl_tests", "collectives": ["all_reduce", "all_gather"],
        "num_gpus": [8], "size_ranges": ["8:128M", "1G:8G"]}
CMD = {"name": "llm", "image": "pt", "harness": "command", "command": ["python3", "/opt/bench.py", "--steps", "50"],
       "metrics": {"primary": "tokens_per_sec",
                   "patterns": [{"metric": "p99", "regex": r"p99=([0-9.]+)", "unit": "ms"}]}}


def config_errors(data: dict) -> list[str]:
    from fleetbench.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as info:
        parse_config(data, "fleet.yaml")
    return info.value.errors


def test_a_fleet_mixing_harnesses_plans_each_harness_own_cases():
    from fleetbench.config import parse_config
    from fleetbench.plan import expand_cases

    cases = {c.case_key: c for c in expand_cases(parse_config(fleet(CNN, NCCL, CMD)))}
    assert sorted(cases) == ["cnn.resnet50.bs64.g1.parameter_server", "llm.g1", "nccl.all_gather.g8.1G-8G",
                             "nccl.all_gather.g8.8-128M", "nccl.all_reduce.g8.1G-8G", "nccl.all_reduce.g8.8-128M"]
    nccl_case = cases["nccl.all_reduce.g8.8-128M"]
    assert nccl_case.command == ["/opt/nccl-tests/build/all_reduce_perf", "-b", "8", "-e", "128M", "-f", "2",
                                 "-g", "8", "-c", "1"]
    assert (nccl_case.harness, nccl_case.model, nccl_case.batch_size_global) == ("nccl_tests", "all_reduce", None)
    llm = cases["llm.g1"]
    assert llm.command == ["python3", "/opt/bench.py", "--steps", "50"] and llm.harness == "command"
    assert llm.harness_settings == {"json_lines": True, "primary": "tokens_per_sec", "patterns": [
        {"metric": "p99", "regex": "p99=([0-9.]+)", "unit": "ms", "better": None}]}
    assert cases["cnn.resnet50.bs64.g1.parameter_server"].command[:3] == ["python", "tf.py", "--model=resnet50"]


@pytest.mark.parametrize("bench, expected", [
    ({**CNN, "harness": "caffe"},
     "benchmarks[0].harness: unknown harness 'caffe' (known: command, nccl_tests, tf_cnn_benchmarks, torch_synthetic)"),
    ({**CNN, "collectives": ["all_reduce"]}, "benchmarks[0].collectives: harness tf_cnn_benchmarks has no matrix axis "
                                             "collectives (its axes: models, batch_sizes, num_gpus, variable_update)"),
    ({**NCCL, "models": ["resnet50"]}, "benchmarks[0].models: harness nccl_tests has no matrix axis models"),
    ({**NCCL, "variable_update": ["replicated"]}, "benchmarks[0].variable_update: harness nccl_tests has no matrix"),
    ({**CMD, "batch_sizes": [8]}, "benchmarks[0].batch_sizes: harness command has no matrix axis batch_sizes"),
    ({k: v for k, v in NCCL.items() if k != "collectives"},
     "benchmarks[0].collectives: is required for harness nccl_tests"),
    ({**NCCL, "collectives": None}, "benchmarks[0].collectives: is required for harness nccl_tests, got null"),
    ({**CNN, "models": None}, "benchmarks[0].models: is required for harness tf_cnn_benchmarks, got null"),
    ({**CNN, "metrics": {"json_lines": True}}, "benchmarks[0].metrics: harness tf_cnn_benchmarks does not use it"),
    ({**NCCL, "device": "cpu", "num_gpus": [0]}, "benchmarks[0].device: harness nccl_tests runs on GPUs only"),
    ({**CNN, "image": "pt"}, "benchmarks[0].image: image 'pt' has no command, and harness tf_cnn_benchmarks needs one"),
    ({**CMD, "metrics": {"patterns": [{"metric": "x", "regex": r"(\d+)+ms", "unit": "ms"}]}},
     r"benchmarks[0].metrics.patterns[0].regex: a repeated group (e.g. (a+)+, (a|aa)*, (?:ab)*) can backtrack "
     r"exponentially: repeat one character or class only, got '(\\d+)+ms'"),
    ({**CMD, "metrics": {"patterns": [{"metric": "x", "regex": "([0-9]+", "unit": "ms"}]}},
     "benchmarks[0].metrics.patterns[0].regex: does not compile: missing ), unterminated subpattern"),
    # a repeat count of 2**32 or more raises OverflowError, not re.error: it escaped the check as a traceback
    ({**CMD, "metrics": {"patterns": [{"metric": "x", "regex": r"t: (\d+\.\d{1,4294967296}) ms", "unit": "ms"}]}},
     "benchmarks[0].metrics.patterns[0].regex: does not compile: the repetition number is too large"),
    ({**CNN, "variable_update": []}, "benchmarks[0].variable_update: must not be empty"),  # planned no case of it
    ({**CMD, "metrics": {"patterns": [{"metric": "x", "regex": 5, "unit": "ms"}]}},
     "benchmarks[0].metrics.patterns[0].regex: must be a string, got 5"),
    ({**CMD, "metrics": {"patterns": [{"metric": "x", "regex": "([0-9]+)", "unit": "parsecs"}]}},
     "benchmarks[0].metrics.patterns[0].unit: unknown unit 'parsecs'"),
    ({**CMD, "metrics": {"json_lines": False}}, "benchmarks[0].metrics: json_lines is off and no patterns are given"),
    ({**NCCL, "size_ranges": ["8-128M"]}, "benchmarks[0].size_ranges[0]: must match"),
    ({**NCCL, "size_ranges": ["8:128M", "1025:1K"]},
     "benchmarks[0].size_ranges[1]: MIN 1025 is larger than MAX 1K (1025 > 1024 bytes), got '1025:1K'"),
    ({"name": "pt", "image": "pt", "harness": "torch_synthetic", "models": ["resnet50"], "batch_sizes": [32],
      "compile": [False, True], "num_warmup_batches": 0},
     "benchmarks[0].num_warmup_batches: 0 with compile true would time torch.compile's compilation"),
])
def test_each_harness_mistake_names_its_field(bench, expected):
    errors = config_errors(fleet(bench))
    assert any(e.startswith(expected) for e in errors), errors
    assert len(errors) == len(set(errors)), errors  # each once (a regex that is no string was said twice)


def test_config_check_refuses_an_nccl_size_range_that_nccl_tests_refuses(tmp_path):
    """nccl-tests stops before it runs (`invalid sizes for 'minbytes' and 'maxbytes'`) when -b is above -e, K/M/G
    being powers of 1024: the config check names the range instead of every host failing it every night."""
    import subprocess
    import sys

    import yaml

    from fleetbench.config import parse_config

    fine = parse_config(fleet({**NCCL, "size_ranges": ["1K:1024", "0:8", "8:8G", "1G:1G"]}))
    assert fine.benchmarks[0].size_ranges == ["1K:1024", "0:8", "8:8G", "1G:1G"]
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet({**NCCL, "size_ranges": ["8G:8"]})))
    proc = subprocess.run([str(Path(sys.executable).parent / "fleetbench"), "config", "check", str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (f"{path}: benchmarks[0].size_ranges[0]: MIN 8G is larger than MAX 8 (8589934592 > 8 bytes), got '8G:8'"
            in proc.stderr)


def test_config_check_exits_2_naming_the_harness_field(tmp_path):
    import subprocess
    import sys

    import yaml

    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet(CNN, {**NCCL, "batch_sizes": [1]}, {**CMD, "harness": "cmd"})))
    proc = subprocess.run([str(Path(sys.executable).parent / "fleetbench"), "config", "check", str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{path}: benchmarks[1].batch_sizes: harness nccl_tests has no matrix axis batch_sizes" in proc.stderr
    assert f"{path}: benchmarks[2].harness: unknown harness 'cmd'" in proc.stderr


def test_trigger_params_keep_harnesses_without_models_apart():
    """A manual run that names models runs only benchmarks with those models; batch sizes reach only the
    harnesses that have them."""
    from fleetbench.config import parse_config
    from fleetbench.params import apply_params

    cfg = parse_config(fleet(CNN, NCCL, CMD))
    only = apply_params(cfg, {"models": ["resnet50"]})
    assert [b.name for b in only.benchmarks] == ["cnn"]
    both = apply_params(cfg, {"batch_sizes": [32]})
    assert [(b.name, b.batch_sizes) for b in both.benchmarks] == [("cnn", [32]), ("nccl", None), ("llm", None)]


# -- fleetbench parse: metric samples for every harness ---------------------------------------------
def run_parse(*args: str) -> tuple[int, list[dict], str]:
    import subprocess
    import sys

    proc = subprocess.run([str(Path(sys.executable).parent / "fleetbench"), "parse", *args], capture_output=True,
                          text=True)
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines()], proc.stderr


def test_parse_auto_knows_failed_nccl_tests_and_torch_synthetic_logs_by_their_own_lines(tmp_path):
    """A failed run has no table rows or step lines, but nccl-tests' `# nThread ... nGpus` and table headers and
    torch_synthetic's banner are there: `auto` reads them as those harnesses (they were 'no known format')."""
    import io

    from fleetbench.parsing import cli_parse

    rtx = GPU_TOOLS / "nccl_all_reduce_2gpu-1proc_rtx5090_nccl-warn-cuda-failure.log"
    banner = ("torch 2.9.1+cu128 torchvision 0.24.1+cu128 device cuda x1 model vit_b_16 batch 256 precision bf16 "
              "channels_last 1 compile 0\n")  # as torch_synthetic.py prints it (its real CPU banner: fixtures/logs)
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.25 GiB. GPU 0 has a total capacity of "
           "79.10 GiB of which 1.06 GiB is free.")
    torch_log = tmp_path / "torch_oom.log"
    torch_log.write_text(banner + "Traceback (most recent call last):\n" + oom + "\n")
    ddp_log = tmp_path / "torch_ddp_oom.log"
    ddp_log.write_text("joined process group: rank 0 of 2 backend nccl\n" + banner.replace("x1 model", "x2 ranks model")
                       + "Traceback (most recent call last):\n" + oom + "\n")
    out = io.StringIO()
    assert cli_parse([str(rtx), str(torch_log), str(ddp_log)], "auto", out) == 0
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["format"], r["status"], r["failure_class"]) for r in records] == [
        ("nccl_tests", "failed", "cuda_error"), ("torch_synthetic", "failed", "gpu_oom"),
        ("torch_synthetic", "failed", "gpu_oom")]
    assert records[1]["failure_detail"] == oom
    plain = tmp_path / "plain.log"
    plain.write_text("Traceback (most recent call last):\n" + oom + "\n")  # no harness's own line: unknown
    assert cli_parse([str(plain)], "auto", io.StringIO()) == 2


def test_parse_prints_metric_samples_of_every_harness(tmp_path):
    nccl_log = GPU_TOOLS / "nccl_all_reduce_2rank-2node_t4-efa_mpirun-prefix_nccl-info.log"
    wrong = GPU_TOOLS / "nccl_all_reduce_2rank-2node_gh200_v2.17.8_wrong-4-failed.log"
    lines_log = tmp_path / "own.log"
    lines_log.write_text("warmup\n" + metric_line() + "\n" + metric_line("x", float("inf")) + "\n")
    tf_log = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "horovod_pytorch_synthetic_4gpu_mpirun.log"
    torch_log = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / (
        "torch_synthetic_resnet18_cpu_channels_last.log")
    code, records, stderr = run_parse(str(nccl_log), str(wrong), str(lines_log), str(tf_log), str(torch_log))
    assert code == 0, stderr
    nccl_rec, wrong_rec, own, horovod, torch_rec = records
    assert (torch_rec["format"], torch_rec["status"], torch_rec["primary"]) == ("torch_synthetic", "ok",
                                                                                 "images_per_sec")
    assert torch_rec["metrics"][0]["value"] == 16.32376916352618
    assert (nccl_rec["format"], nccl_rec["status"], nccl_rec["primary"]) == ("nccl_tests", "ok", "avg_busbw")
    assert {"metric": "avg_busbw", "value": 1.15327, "unit": "GB/s", "better": "higher", "labels": {}} in (
        nccl_rec["metrics"])
    assert (wrong_rec["status"], wrong_rec["failure_class"]) == ("failed", "wrong_results")
    assert (own["format"], own["status"], own["primary"]) == ("command", "ok", "tokens_per_sec")
    assert own["failure_detail"] == "dropped 1 metric sample(s): 1 not finite"
    assert horovod["primary"] == "images_per_sec"
    assert horovod["metrics"][0] == {"metric": "images_per_sec", "value": 885.2, "unit": "images/s",
                                     "better": "higher", "labels": {}}
    # a named harness reads the file as that harness, whatever it holds
    code, records, _ = run_parse("--format", "command", str(nccl_log))
    assert code == 0 and (records[0]["status"], records[0]["failure_class"]) == ("failed", "no_result")
    code, records, stderr = run_parse("--format", "nccl_tests", str(lines_log))
    assert code == 0 and records[0]["failure_class"] == "no_result"
    plain = tmp_path / "plain.txt"
    plain.write_text("nothing to see\n")
    code, records, stderr = run_parse(str(plain))
    assert (code, records) == (2, []) and f"{plain}: no known benchmark log format" in stderr


def test_the_gpu_example_config_bakes_nccl_tests_and_plans_its_cases():
    from fleetbench.config import load_config
    from fleetbench.plan import expand_cases

    cfg = load_config(Path(__file__).resolve().parents[2] / "include" / "config" / "fleet.gpu-example.yaml")
    bake = cfg.image("pytorch-nccl").bake
    assert bake.git.url == "https://github.com/NVIDIA/nccl-tests.git" and bake.git.dest == "/opt/nccl-tests"
    assert bake.run == ["make", "-C", "/opt/nccl-tests", "MPI=0", "-j", "8"]
    nccl_cases = [c for c in expand_cases(cfg) if c.harness == "nccl_tests"]
    assert sorted(c.model for c in nccl_cases) == ["all_gather", "all_reduce", "alltoall", "reduce_scatter"]
    assert all(c.command[0] == f"/opt/nccl-tests/build/{c.model}_perf" and c.num_gpus == 8 for c in nccl_cases)
    assert {c.host for c in nccl_cases} == {"gpu-a100-01"}


# -- torch_synthetic --------------------------------------------------------------------------------
TORCH = {"name": "pt", "image": "pt", "harness": "torch_synthetic", "models": ["resnet50", "vit_b_16"],
         "batch_sizes": [128], "num_gpus": [1, 8], "precisions": ["bf16", "fp16"], "channels_last": [True],
         "compile": [False, True]}


def test_torch_synthetic_matrix_and_argv():
    from fleetbench.config import parse_config
    from fleetbench.plan import expand_cases

    data = fleet(TORCH)
    data["images"][1]["command"] = ["python", "/opt/fleetbench/torch_synthetic.py"]
    cases = {c.case_key: c for c in expand_cases(parse_config(data))}
    assert len(cases) == 2 * 2 * 2 * 2  # models x GPUs x precisions x compile
    case = cases["pt.resnet50.bs128.g8.bf16.nhwc.compiled"]
    assert case.command == ["python", "/opt/fleetbench/torch_synthetic.py", "--model=resnet50", "--batch_size=128",
                            "--num_batches=100", "--num_warmup_batches=5", "--precision=bf16", "--channels_last=1",
                            "--compile=1", "--device=cuda", "--num_gpus=8"]
    assert (case.batch_size_global, case.variable_update) == (1024, None)
    launched = expand_cases(parse_config(fleet({**NCCL, "command": ["mpirun", "-np", "2"]})))[0]
    assert launched.command[:4] == ["mpirun", "-np", "2", "/opt/nccl-tests/build/all_reduce_perf"]
    assert config_errors(fleet({**CNN, "precisions": ["fp16"]}))[0].startswith(
        "benchmarks[0].precisions: harness tf_cnn_benchmarks has no matrix axis precisions")
    assert config_errors(fleet({**TORCH, "image": "tf1", "precisions": ["fp8"]}))[0].startswith(
        "benchmarks[0].precisions[0]: must be one of 'fp32', 'fp16' or 'bf16'")


def test_torch_synthetic_reads_its_step_and_metric_lines():
    """A real output of the project's training loop (tests/fixtures/logs/SOURCES.md)."""
    from fleetbench.harnesses.torch_synthetic import measure_lines as torch_measure

    log = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "torch_synthetic_resnet18_cpu_channels_last.log"
    text = log.read_text()
    measured = torch_measure(lines(text))
    assert (measured.primary, measured.images_per_sec, measured.step_count) == (
        "images_per_sec", 16.32376916352618, 3)
    assert measured.steps[1] == {"step": 2, "images_per_sec": 18.0, "plusminus": None, "jitter": None,
                                 "loss": 0.3129}
    assert {s.metric: (s.unit, s.better) for s in measured.samples} == {
        "images_per_sec": ("images/s", "higher"), "step_time_median": ("ms", "lower"), "final_loss": ("1", "lower")}
    cut = torch_measure(lines(text[:text.index("step 3")] + "step 3: 14"))  # killed mid-line, before its result
    assert (cut.step_count, cut.primary_sample()) == (2, None)


def test_a_command_case_that_measured_nothing_keeps_its_primary_metrics_direction():
    """Failed or never-run rows of a lower-is-better primary metric say lower, not the harness default."""
    from types import SimpleNamespace

    from fleetbench.harnesses import get as get_harness
    from fleetbench.measure import planned_metric

    settings = {"primary": "p99_latency", "json_lines": True,
                "patterns": [{"metric": "p99_latency", "regex": r"p99: ([0-9.]+) ms", "unit": "ms", "better": None}]}
    assert get_harness("command").primary_metric(settings) == ("p99_latency", "ms", "lower")
    assert get_harness("command").primary_metric({"primary": "tok_s", "patterns": []}) == ("tok_s", None, None)
    case = SimpleNamespace(harness="command", harness_settings=settings)
    assert planned_metric(case) == {"metric": "p99_latency", "unit": "ms", "better": "lower"}
    tf = SimpleNamespace(harness="tf_cnn_benchmarks", harness_settings={})
    assert planned_metric(tf) == {"metric": "images_per_sec", "unit": "images/s", "better": "higher"}


def test_torch_synthetic_names_a_cuda_oom_as_gpu_oom():
    """The failure vocabulary is shared: PyTorch's out-of-memory error is gpu_oom (capacity profiles learn from
    it), as TensorFlow's ResourceExhausted is; a run without error text has no class of its own."""
    from fleetbench.harnesses.torch_synthetic import measure_lines as torch_measure
    from fleetbench.measure import classify

    text = ("torch_synthetic: model resnet50, batch 512, precision fp32, channels_last False, compile False\n"
            "Traceback (most recent call last):\n"
            '  File "/opt/fleetbench/torch_synthetic.py", line 92, in <module>\n'
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            "79.19 GiB of which 1.03 GiB is free.\n")
    measured = torch_measure(lines(text))
    assert measured.failure_class == "gpu_oom" and "CUDA out of memory" in measured.failure_detail
    assert classify({"exit_code": 1}, measured, text)[:2] == ("failed", "gpu_oom")
    quiet = torch_measure(lines("torch_synthetic: model resnet50\n"))
    assert quiet.failure_class is None
    assert classify({"exit_code": 1}, quiet, "")[:2] == ("failed", "nonzero_exit")


def test_no_warmup_is_allowed_for_eager_torch_cases():
    from fleetbench.config import parse_config

    data = fleet({**TORCH, "compile": [False], "num_warmup_batches": 0})
    data["images"][1]["command"] = ["python", "/opt/fleetbench/torch_synthetic.py"]
    assert parse_config(data, "fleet.yaml").benchmarks[0].num_warmup_batches == 0


def test_extra_args_that_repeat_a_flag_the_harness_sets_name_the_item_and_its_value():
    """The programs keep a flag's last value, and extra_args come last: `--batch_size=64` would run every case at
    batch 64 under keys, rows and container requests that say otherwise."""
    import subprocess
    import sys

    from fleetbench.config import parse_config

    smoke = Path(__file__).resolve().parents[2] / "include" / "images" / "cpu-smoke" / "tf_cnn_benchmarks.py"
    out = subprocess.run([sys.executable, str(smoke), "--model=trivial", "--batch_size=16", "--num_batches=2",
                          "--num_warmup_batches=1", "--device=cpu", "--num_gpus=1", "--data_format=NHWC",
                          "--batch_size=64"], capture_output=True, text=True, timeout=120).stdout
    assert "Batch size:  64 global" in out  # the last one wins
    assert config_errors(fleet({**CNN, "extra_args": ["--use_fp16=True", "--num_gpus=8", "--batch_size=64"]})) == [
        "benchmarks[0].extra_args[1]: --num_gpus is set by harness tf_cnn_benchmarks (from num_gpus), got "
        "'--num_gpus=8'",
        "benchmarks[0].extra_args[2]: --batch_size is set by harness tf_cnn_benchmarks (from batch_sizes), got "
        "'--batch_size=64'"]
    cpu = {**CNN, "device": "cpu", "num_gpus": [0]}
    assert config_errors(fleet({**cpu, "extra_args": ["--data_format=NCHW"]})) == [
        "benchmarks[0].extra_args[0]: --data_format is set by harness tf_cnn_benchmarks (NHWC with device cpu), got "
        "'--data_format=NCHW'"]
    parse_config(fleet({**CNN, "extra_args": ["--data_format=NHWC", "--use_fp16=True"]}))  # GPU cases leave it be
    torch = {**TORCH, "image": "tf1"}
    assert config_errors(fleet({**torch, "extra_args": ["--image_size=32", "--batch=8", "--precision=fp32"]})) == [
        "benchmarks[0].extra_args[1]: --batch (a prefix of --batch_size) is set by harness torch_synthetic (from "
        "batch_sizes), got '--batch=8'",
        "benchmarks[0].extra_args[2]: --precision is set by harness torch_synthetic (from precisions), got "
        "'--precision=fp32'"]
    assert config_errors(fleet({**NCCL, "extra_args": ["--ngpus=2", "--op=sum"]})) == [
        "benchmarks[0].extra_args[0]: --ngpus is set by harness nccl_tests (-g, from num_gpus), got '--ngpus=2'"]
    assert config_errors(fleet({**CNN, "nodes": [2], "extra_args": ["--task_index=1"]}))[-1] == (
        "benchmarks[0].extra_args[0]: --task_index is set by harness tf_cnn_benchmarks (a cluster flag of nodes > 1), "
        "got '--task_index=1'")


def test_a_harmless_topology_warning_is_not_the_cause_of_a_failed_nccl_run():
    """NCCL's topology search prints `NCCL WARN Could not find a path for pattern N, falling back to simple order`
    (four times in the real RTX 5090 log) before runs that work: the failure's detail is the error that followed."""
    real = (GPU_TOOLS / "nccl_all_reduce_2gpu-1proc_rtx5090_nccl-warn-cuda-failure.log").read_text()
    benign = [line for line in real.splitlines(keepends=True) if "falling back to simple order" in line]
    assert len(benign) == 4
    failure = "GENOA-06: Test NCCL failure common.cu:391 'remote process exited or there was a network error'\n"
    measured = nccl_measure(lines("".join(benign) + failure))
    assert (measured.failure_class, measured.failure_detail) == ("nccl", failure.strip())
    only_benign = nccl_measure(lines("".join(benign)))
    assert only_benign.failure_class is None


@pytest.mark.parametrize("exit_code", [134, 139])
def test_an_abort_after_the_fault_the_log_names_keeps_its_class(exit_code):
    """nccl-tests (or a framework) aborting on an NCCL or CUDA fault exits 134/139: the row says the fault the log
    names, as README's nccl_tests table does, with the exit in the detail; a plain crash stays core_dump."""
    measured = nccl("nccl_all_reduce_2gpu-1proc_rtx5090_nccl-warn-cuda-failure.log")
    status, failure_class, detail = classify({"exit_code": exit_code}, measured, "")
    assert (status, failure_class) == ("failed", "cuda_error")
    assert "Cuda failure 1 'invalid argument'" in detail and f"then exit {exit_code}: crashed" in detail
    warn = nccl_measure(lines("host:1:1 [0] transport.cc:12 NCCL WARN Net : Connection closed\n"))
    assert classify({"exit_code": exit_code}, warn, "")[1] == "nccl"
    assert classify({"exit_code": exit_code}, None, "Segmentation fault (core dumped)\n")[1] == "core_dump"


@pytest.mark.parametrize("exit_code", [134, 139])
def test_a_framework_aborting_on_a_gpu_fault_is_cuda_error_not_core_dump(exit_code):
    """TF aborts (glog FATAL) after CUDA_ERROR_ILLEGAL_ADDRESS: the row names the fault, the exit in the detail."""
    from test_parsing import HEADER, TF_ILLEGAL_ADDRESS

    from fleetbench.parsing import parse_log

    status, failure_class, detail = classify({"exit_code": exit_code}, parse_log(HEADER + TF_ILLEGAL_ADDRESS),
                                             HEADER + TF_ILLEGAL_ADDRESS)
    assert (status, failure_class) == ("failed", "cuda_error")
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in detail and f"then exit {exit_code}: crashed" in detail


def test_torch_synthetic_names_an_uncorrectable_ecc_error_as_cuda_error():
    from fleetbench.harnesses.torch_synthetic import measure_lines as torch_measure

    text = ("torch_synthetic: model resnet50\nstep 1: 120.0 images/sec loss 6.9\n"
            "RuntimeError: CUDA error: uncorrectable ECC error encountered\n")
    measured = torch_measure(lines(text))
    assert (measured.failure_class, measured.failure_detail) == (
        "cuda_error", "RuntimeError: CUDA error: uncorrectable ECC error encountered")
    assert classify({"exit_code": 1}, measured, text)[:2] == ("failed", "cuda_error")


def test_torch_synthetic_leaves_a_diverged_loss_none():
    """A `nan` or `inf` loss (a diverged fp16 run) is no number for the steps table: None, as tf_cnn_benchmarks' is
    (it went into `steps.loss` as NaN / Infinity, and into the superseded attempts' JSON as a bare NaN)."""
    from fleetbench.harnesses.torch_synthetic import measure_lines as torch_measure

    text = ("torch_synthetic: model resnet50\nstep 1: 120.0 images/sec loss 6.9\nstep 2: 121.0 images/sec loss nan\n"
            "step 3: 119.5 images/sec loss inf\nstep 4: 120.5 images/sec loss -inf\n")
    measured = torch_measure(lines(text))
    assert [(s["step"], s["images_per_sec"], s["loss"]) for s in measured.steps] == [
        (1, 120.0, 6.9), (2, 121.0, None), (3, 119.5, None), (4, 120.5, None)]


def test_two_host_entries_for_one_engine_or_one_queue_are_a_warning_naming_both():
    """A copied entry with only the name changed: two lanes would benchmark one machine's GPUs at once and store its
    results twice. Local hosts on one socket (loopback multi-node sets) are meant."""
    from fleetbench.config import config_warnings, parse_config

    data = fleet(CNN)
    data["hosts"] = [{"name": "gpu-07", "connection": "ssh_07", "docker_url": "tcp://gpu-07:2376",
                      "docker_tls_conn_id": "tls"},
                     {"name": "gpu-08", "connection": "ssh_07", "docker_url": "tcp://gpu-07:2376",
                      "docker_tls_conn_id": "tls"},
                     {"name": "gpu-09", "queue": "gpu-9"}, {"name": "gpu-10", "queue": "gpu-9"},
                     {"name": "a", "connection": "local"}, {"name": "b", "connection": "local"}]
    warnings = [w for w in config_warnings(parse_config(data)) if "at once" in w]
    assert warnings == [
        "hosts[1].docker_url: tcp://gpu-07:2376 is also hosts[0]'s (gpu-07): two lanes would run cases on that "
        "engine's GPUs at once, and its results would be stored under both names",
        "hosts[3].queue: 'gpu-9' is also hosts[2]'s (gpu-09): one worker would run both hosts' lanes on its own "
        "engine, at once"]
