"""fleetbench.airflow.task_gc: a task process freezes its startup objects once, at its first task's start."""

import os
import subprocess
import sys
import textwrap

from fleetbench.airflow import task_gc

SCRIPT = textwrap.dedent("""
    import gc, json, os, sys
    from fleetbench.airflow.task_gc import freeze_startup_objects
    out = {"before": gc.get_freeze_count()}
    out["first"] = freeze_startup_objects()
    out["frozen"] = gc.get_freeze_count()
    made = [[i] for i in range(10000)]  # tracked objects made after the freeze stay collectable
    out["second"] = freeze_startup_objects()
    out["frozen_after_second"] = gc.get_freeze_count()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a forked process freezes again at its own first task
        os.write(w, json.dumps([freeze_startup_objects(), gc.get_freeze_count()]).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    out["child"] = json.loads(os.read(r, 1000))
    print(json.dumps(out))
""")


def test_freezes_once_per_process_and_again_in_a_forked_one():
    import json

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["before"] == 0
    assert out["first"] is True and out["frozen"] > 1000  # the interpreter's and the imports' objects
    assert out["second"] is False and out["frozen_after_second"] == out["frozen"]
    child_first, child_frozen = out["child"]
    assert child_first is True and child_frozen >= out["frozen"] + 10000  # the parent's later objects too


def test_every_fleetbench_task_freezes_first():
    """Each task's entry point calls it before its work (a task that did not would walk the startup heap)."""
    import inspect

    from fleetbench.airflow import multinode, operators

    for fn in (operators.LaneCasesOperator.execute, operators.BenchmarkCaseOperator.execute,
               multinode.MultiNodeCasesOperator.execute, multinode.MultiNodeCaseOperator.execute):
        assert "freeze_startup_objects()" in inspect.getsource(fn), fn.__qualname__
    dag_source = (task_gc.__file__.rsplit("include", 1)[0] + "dags/fleet_benchmark.py")
    with open(dag_source) as f:
        text = f.read()
    for name in ("def plan(", "def store(", "def report(", "def outcome("):
        body = text.split(name, 1)[1].split("\n    def ", 1)[0].split("\n    @task", 1)[0]
        assert "freeze_startup_objects()" in body, name
