"""The command harness for real: a program in a container prints metric lines (some bad), or none at all."""

from __future__ import annotations

import json
import uuid

import pytest

from fleetbench.airflow.operators import BenchmarkCaseOperator
from fleetbench.measure import measure

pytestmark = pytest.mark.integration

# A team's own benchmark: a real loop that measures itself and prints JSON metric lines, a progress line, a
# line with NaN, one with an unknown unit, and a regex-readable summary.
PROGRAM = r"""
import json, time
t0 = time.perf_counter()
tokens = 0
for step in range(200):
    tokens += len(" ".join(str(i) for i in range(500)).split())
elapsed = time.perf_counter() - t0
print(json.dumps({"metric": "tokens_per_sec", "value": tokens / elapsed / 2, "unit": "tok/s"}))  # progress
print(json.dumps({"metric": "tokens_per_sec", "value": tokens / elapsed, "unit": "tok/s", "better": "higher"}))
print(json.dumps({"metric": "step_ms", "value": elapsed * 1000 / 200, "unit": "ms"}))
print(json.dumps({"metric": "broken", "value": float("nan"), "unit": "ms"}))
print(json.dumps({"metric": "weird", "value": 3, "unit": "cubits"}))
print(f"summary: {tokens} tokens in {elapsed:.6f} s")
"""
SETTINGS = {"json_lines": True, "primary": None,
            "patterns": [{"metric": "tokens", "regex": r"summary: (\d+) tokens", "unit": "count", "better": None}]}


@pytest.fixture()
def run_command(tmp_path, docker_api, smoke_image):
    token = uuid.uuid4().hex[:10]

    def run(command):
        case = {"host": "localhost", "case_key": f"test.cmd.{token}", "harness": "command",
                "harness_settings": SETTINGS}
        op = BenchmarkCaseOperator(
            task_id=f"run_{token}", image=smoke_image, command=command, container_name=f"fbtest-{token}",
            labels={"org.fleetbench.managed": "true", "org.fleetbench.test": token}, case=case,
            log_dir=str(tmp_path))
        outcome = op.execute({})
        # measured on the "worker" by the task itself, and again from the log (an outcome file without it)
        again, _ = measure({"command": command, **case}, {k: v for k, v in outcome.items() if k != "measurement"})
        return outcome, outcome["measurement"]["fields"], again

    yield run
    left = docker_api.containers(all=True, filters={"label": f"org.fleetbench.test={token}"})
    assert left == [], f"containers left behind: {[c['Names'] for c in left]}"


def test_a_program_that_prints_metric_lines(run_command):
    outcome, fields, again = run_command(["python3", "-c", PROGRAM])
    assert outcome["exit_code"] == 0
    assert (fields["status"], fields["failure_class"]) == ("ok", None)
    assert (fields["metric"], fields["unit"], fields["better"]) == ("tokens_per_sec", "tok/s", "higher")
    samples = {s["metric"]: s for s in fields["metric_samples"]}
    assert set(samples) == {"tokens_per_sec", "step_ms", "tokens"}
    assert fields["value"] == samples["tokens_per_sec"]["value"] > 0
    assert samples["step_ms"]["better"] == "lower" and samples["tokens"]["value"] == 200 * 500
    assert fields["failure_detail"] == "dropped 2 metric sample(s): 1 not finite, 1 unknown unit"
    log = open(outcome["log_path"]).read()
    printed = [json.loads(line) for line in log.splitlines() if line.startswith('{"metric": "tokens_per_sec"')]
    assert fields["value"] == printed[-1]["value"]  # the last value printed is the result
    assert fields["images_per_sec"] is None
    assert {k: again[k] for k in ("status", "metric", "value", "failure_detail")} == {
        k: fields[k] for k in ("status", "metric", "value", "failure_detail")}


def test_a_program_that_prints_no_metric_is_no_result(run_command):
    outcome, fields, _ = run_command(["python3", "-c", "print('benchmark finished, all good')"])
    assert outcome["exit_code"] == 0
    assert (fields["status"], fields["failure_class"]) == ("failed", "no_result")
    assert fields["failure_detail"] == "exited 0 but printed no metric (any)"
    assert fields["metric_samples"] == [] and fields["value"] is None


def test_a_failing_program_keeps_what_it_measured(run_command):
    outcome, fields, _ = run_command(
        ["sh", "-c", "echo '{\"metric\": \"tokens_per_sec\", \"value\": 5, \"unit\": \"tok/s\"}'; exit 3"])
    assert (fields["status"], fields["failure_class"], outcome["exit_code"]) == ("failed", "nonzero_exit", 3)
    assert fields["metric_samples"][0]["value"] == 5.0 and fields["value"] is None
