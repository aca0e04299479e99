"""Parse-speed measures that reach into Airflow's private code, in one visible place.

`fleet_benchmark` parses a 1,000-host fleet in under a second (README "Scale notes"). Two of the
measures that keep it there patch private Airflow functions, so they live here, are called from
the DAG files (not as a side effect of importing the operators), and `check()` fails loudly when
Airflow changes underneath them: a test calls it, so an Airflow upgrade that renames or reshapes a
function breaks the suite instead of silently making parsing slower (or, for `fast_edges`, wrong).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Sequence

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
    """Raise ParseSpeedError unless Airflow still has `_get_operator_defaults(cls) -> dict` used by `partial()`, and
    `DAGNode._set_relatives` is still the function `fast_edges` was written against."""
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
    set_relatives = _node_class()._set_relatives
    set_relatives = getattr(set_relatives, "__wrapped__", set_relatives)
    if _source_sha256(set_relatives) != SET_RELATIVES_SHA256:
        raise ParseSpeedError("airflow.sdk.definitions._internal.node.DAGNode._set_relatives has changed: fast_edges "
                              "leaves it alone (a 1,000-host DAG parses ~0.3 s slower); review fast_edges against "
                              "the new function and update SET_RELATIVES_SHA256")


# sha256 of the source of `DAGNode._set_relatives` in apache-airflow-task-sdk 1.3.2 (Airflow 3.3.2): the function
# whose same-DAG case `fast_edges` takes over. Another source means another function: review the fast path below
# against it, then put the new digest here.
SET_RELATIVES_SHA256 = "c63e68a41f455184376f8f13ef38fc8a6cf516ea75e322d9fc083512bdc85784"


def _node_class():
    from airflow.sdk.definitions._internal.node import DAGNode

    return DAGNode


def _source_sha256(function) -> str:
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()


@functools.lru_cache(maxsize=None)
def _plain_operator_class(cls: type) -> bool:
    """An operator class (plain or mapped) whose edges are what `_set_relatives` assumes: no `update_relative` of its
    own (the no-op of DependencyMixin) and itself as its only root and leaf."""
    from airflow.sdk.bases.operator import BaseOperator
    from airflow.sdk.definitions._internal.mixins import DependencyMixin
    from airflow.sdk.definitions.mappedoperator import MappedOperator

    base = next((b for b in (BaseOperator, MappedOperator) if issubclass(cls, b)), None)
    return (base is not None and cls.update_relative is DependencyMixin.update_relative
            and cls.roots is base.roots and cls.leaves is base.leaves)


def fast_edges() -> None:
    """Add a dependency edge between tasks already in one DAG without hashing that DAG twice.

    Airflow's `DAGNode._set_relatives` (behind `>>`, `set_upstream` and every XComArg handed to a task) checks
    that both ends share one DAG by putting their DAGs in a set, and a DAG's hash is computed over all its
    task ids: each edge costs time in proportion to the DAG's size. A 1,000-host fleet_benchmark makes ~3,000
    edges (three per lane: from `plan`, into its `run_case`, into `store`), ~0.3 s of its
    parse. The fast path here takes only the case whose answer needs no hashing: no edge label, operators
    (plain or mapped, without relatives logic of their own) on both ends, all already in the very same DAG
    object. There it does what Airflow does then: each end's id goes into the other's upstream/downstream
    set. Every other call (task groups, XComArgs, labels, tasks without a DAG or from two DAGs, wrong types)
    goes to Airflow's function unchanged. Installed only over the function it was written against (see
    `SET_RELATIVES_SHA256`); otherwise Airflow's own stays, and `check` says so.
    """
    node_class = _node_class()
    original = node_class._set_relatives
    if getattr(original, MARK, False) or _source_sha256(original) != SET_RELATIVES_SHA256:
        return

    def _set_relatives(self, task_or_task_list, upstream=False, edge_modifier=None):
        tasks = task_or_task_list if isinstance(task_or_task_list, Sequence) else [task_or_task_list]
        dag = self.get_dag() if edge_modifier is None and _plain_operator_class(type(self)) else None
        if dag is None or not all(_plain_operator_class(type(t)) and t.get_dag() is dag for t in tasks):
            return original(self, task_or_task_list, upstream=upstream, edge_modifier=edge_modifier)
        for task in tasks:
            if upstream:
                task.downstream_task_ids.add(self.node_id)
                self.upstream_task_ids.add(task.node_id)
            else:
                self.downstream_task_ids.add(task.node_id)
                task.upstream_task_ids.add(self.node_id)
        return None

    setattr(_set_relatives, MARK, True)
    _set_relatives.__wrapped__ = original
    node_class._set_relatives = _set_relatives
