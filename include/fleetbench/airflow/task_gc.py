"""A task process's full garbage collections walk only what the task itself makes.

When a fleetbench task starts its work, its process already holds ~500,000 objects from its imports (Airflow,
the providers, pandas, pydantic) and the DAG file's parse, nearly all of which live until the process exits.
CPython's full collection walks every tracked object: on a heap that size one takes 0.3-0.45 s on this project's
CI machine, with the GIL held, so a running case's log streamer and telemetry sampler stop meanwhile. A task
that allocates (a case streaming a long log, store and report over a night's rows, several tasks in one process
under `airflow dags test`) triggers such collections again and again: in `make bench`'s 20 trivial cases under
`dags test` they took 0.9-1.3 s of the run.

`gc.freeze()` moves every object that exists at that moment to the permanent generation, which no collection
walks again; what the task makes afterwards is collected as before. Done once per process, at the start of its
first task's work, after a collection of the young generations (a few ms): garbage that is still uncollected then
would never be freed, and the young generations are where a process that just parsed a DAG file has it. Garbage
that reached the oldest generation stays (a full collection first would cost the 0.3-0.45 s this saves); in a task
process there is little, and a process that runs many tasks (pytest's, `dags test`) freezes only once. A forked
process (its pid differs) freezes again at its own first task.
"""

from __future__ import annotations

import gc
import os

_frozen_in: int | None = None  # the pid that froze its startup objects


def freeze_startup_objects() -> bool:
    """Freeze what this process holds now, the first time it is called in this process; True when it froze."""
    global _frozen_in
    pid = os.getpid()
    if _frozen_in == pid:
        return False
    _frozen_in = pid
    gc.collect(1)
    gc.freeze()
    return True
