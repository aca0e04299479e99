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
first task's work: garbage cycles among the frozen objects are never freed, and the objects made before any
task ran are the ones that live on anyway. A forked process (its pid differs) freezes again at its own first task.
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
    gc.freeze()
    return True
