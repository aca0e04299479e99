"""fleetbench.airflow.task_gc: a task process freezes its startup objects once, at its first task's start."""

import ast
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from fleetbench.airflow import multinode, operators, task_gc

SCRIPT = textwrap.dedent("""
    import gc, json, os, sys, weakref
    from fleetbench.airflow.task_gc import freeze_startup_objects

    class Node:
        pass

    def cycle():
        a, b = Node(), Node()
        a.other, b.other = b, a
        return weakref.ref(a)

    out = {"before": gc.get_freeze_count()}
    young_garbage = cycle()  # unreachable, not yet collected when the task starts
    out["first"] = freeze_startup_objects()
    out["frozen"] = gc.get_freeze_count()
    out["young_garbage_freed"] = young_garbage() is None
    out["enabled"] = gc.isenabled()
    later = cycle()  # garbage made after the freeze is collected as before
    gc.collect()
    out["later_garbage_freed"] = later() is None
    made = [[i] for i in range(10000)]
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
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["before"] == 0
    assert out["first"] is True and out["frozen"] > 1000  # the interpreter's and the imports' objects
    assert out["young_garbage_freed"] is True  # collected, not frozen for good
    assert out["enabled"] is True and out["later_garbage_freed"] is True
    assert out["second"] is False and out["frozen_after_second"] == out["frozen"]
    child_first, child_frozen = out["child"]
    assert child_first is True and child_frozen >= out["frozen"] + 10000  # the parent's later objects too


def _first_statement_calls_freeze(function_node) -> bool:
    body = [n for n in function_node.body
            if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]  # after the docstring
    body = [n for n in body if not isinstance(n, ast.ImportFrom)]  # local imports may come first
    first = body[0]
    return (isinstance(first, ast.Expr) and isinstance(first.value, ast.Call)
            and getattr(first.value.func, "id", None) == "freeze_startup_objects")


def test_every_fleetbench_task_freezes_before_its_work():
    """Each task's entry point calls it first (a task that did not would walk the startup heap in each collection)."""
    for fn in (operators.LaneCasesOperator.execute, operators.BenchmarkCaseOperator.execute,
               multinode.MultiNodeCasesOperator.execute, multinode.MultiNodeCaseOperator.execute):
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        assert _first_statement_calls_freeze(tree.body[0]), fn.__qualname__
    dag_file = Path(task_gc.__file__).parents[3] / "dags" / "fleet_benchmark.py"
    tasks = {n.name: n for n in ast.walk(ast.parse(dag_file.read_text()))
             if isinstance(n, ast.FunctionDef) and n.name in ("plan", "store", "report", "outcome")}
    assert sorted(tasks) == ["outcome", "plan", "report", "store"]
    for name, node in tasks.items():
        assert _first_statement_calls_freeze(node), name
