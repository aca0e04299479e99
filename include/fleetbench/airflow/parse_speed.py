"""Parse-speed measures that reach into Airflow's private code, in one visible place.

`fleet_benchmark` parses a 1,000-host fleet in under a second (README "Scale notes"). One of the
measures that keeps it there patches a private Airflow function, so it lives here, is called from
the DAG file (not as a side effect of importing the operators), and `check()` fails loudly when
Airflow changes underneath it: a test calls it, so an Airflow upgrade that renames or reshapes the
function breaks the suite instead of silently making parsing slower.
"""

from __future__ import annotations

import functools
import inspect

MARK = "_fleetbench_cached"


class ParseSpeedError(RuntimeError):
    """Airflow no longer has what a parse-speed measure relies on."""


def _operator_module():
    from airflow.sdk.bases import operator as sdk_operator

    return sdk_operator


def cache_operator_defaults() -> None:
    """Compute an operator class's constructor defaults once per class, not once per `.partial()`.

    Airflow's `partial()` re-reads them with `inspect.signature` over the class's MRO on every call
    (a pure function of the class); with one mapped `run_case` per host that was a fifth of the
    parse time of a 1,000-host DAG. Does nothing when Airflow lacks the function (`check` says so).
    """
    sdk_operator = _operator_module()
    original = getattr(sdk_operator, "_get_operator_defaults", None)
    if original is None or getattr(original, MARK, False):
        return
    cached = functools.lru_cache(maxsize=None)(original)

    def operator_defaults(operator_class):
        return dict(cached(operator_class))  # a copy: callers may change it

    setattr(operator_defaults, MARK, True)
    sdk_operator._get_operator_defaults = operator_defaults


def check() -> None:
    """Raise ParseSpeedError unless Airflow still has `_get_operator_defaults(cls) -> dict` used by `partial()`."""
    sdk_operator = _operator_module()
    original = getattr(sdk_operator, "_get_operator_defaults", None)
    if original is None:
        raise ParseSpeedError("airflow.sdk.bases.operator._get_operator_defaults is gone: cache_operator_defaults "
                              "does nothing, and a 1,000-host DAG parses ~20 % slower; find its replacement")
    target = getattr(original, "__wrapped__", original)
    params = list(inspect.signature(target).parameters)
    if len(params) != 1:
        raise ParseSpeedError(f"_get_operator_defaults takes {params}, not one operator class")
    partial = getattr(sdk_operator, "partial", None)
    if partial is None or "_get_operator_defaults(" not in inspect.getsource(partial):
        raise ParseSpeedError("airflow.sdk.bases.operator.partial no longer calls _get_operator_defaults: "
                              "caching it no longer speeds up parsing")
