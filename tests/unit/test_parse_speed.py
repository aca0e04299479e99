"""The parse-speed measure that reaches into Airflow's private code fails loudly when Airflow changes."""

from __future__ import annotations

import pytest

from fleetbench.airflow import parse_speed


def test_airflow_still_has_what_the_cache_relies_on():
    parse_speed.check()  # raises ParseSpeedError naming what changed


def test_the_cache_returns_copies_and_computes_once(monkeypatch):
    from airflow.sdk.bases import operator as sdk_operator

    calls = []

    def original(operator_class):
        calls.append(operator_class)
        return {"retries": 0}

    monkeypatch.setattr(sdk_operator, "_get_operator_defaults", original)
    parse_speed.cache_operator_defaults()
    patched = sdk_operator._get_operator_defaults
    first = patched(int)
    first["retries"] = 9
    assert patched(int) == {"retries": 0} and calls == [int]
    parse_speed.cache_operator_defaults()  # idempotent
    assert sdk_operator._get_operator_defaults is patched


def test_a_changed_airflow_is_reported(monkeypatch):
    from airflow.sdk.bases import operator as sdk_operator

    monkeypatch.delattr(sdk_operator, "_get_operator_defaults")
    with pytest.raises(parse_speed.ParseSpeedError, match="is gone"):
        parse_speed.check()
    monkeypatch.setattr(sdk_operator, "_get_operator_defaults", lambda a, b: {}, raising=False)
    with pytest.raises(parse_speed.ParseSpeedError, match="not one operator class"):
        parse_speed.check()


def _pristine_set_relatives():
    from airflow.sdk.definitions._internal.node import DAGNode

    current = DAGNode._set_relatives
    return getattr(current, "__wrapped__", current)


def _graph_edges(dag) -> dict:
    """Every task's and task group's relatives, as Airflow records them."""
    out = {t.task_id: (sorted(t.upstream_task_ids), sorted(t.downstream_task_ids)) for t in dag.tasks}
    for group_id, group in dag.task_group.get_task_group_dict().items():
        out[f"group:{group_id}"] = tuple(sorted(map(str, s)) for s in (
            group.upstream_group_ids, group.downstream_group_ids, group.upstream_task_ids, group.downstream_task_ids))
    out["edge_info"] = sorted((u, sorted(d.items())) for u, d in dag.edge_info.items())
    return out


def _build_graph():
    """A DAG with every kind of edge the fast path takes or hands on: operator to operator, lists, XComArgs into
    a plain and a mapped task, task groups on either side, a labelled edge."""
    import pendulum
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG, Label, TaskGroup, task

    with DAG(dag_id="edges", start_date=pendulum.datetime(2026, 1, 1), schedule=None) as dag:
        @task
        def source() -> list:
            return []

        @task
        def cases(plan: list, validations: list) -> list:
            return []

        start, mid, end = EmptyOperator(task_id="start"), EmptyOperator(task_id="mid"), EmptyOperator(task_id="end")
        src = source()
        start >> [mid, src]
        picked = cases(src, src)
        runs = EmptyOperator.partial(task_id="run").expand_kwargs(picked)
        with TaskGroup("lane") as lane:
            a = EmptyOperator(task_id="a")
            a >> EmptyOperator(task_id="b")
        mid >> lane >> end
        runs >> Label("after the runs") >> end
        end << [picked.operator, runs]
    return dag


def test_fast_edges_make_the_same_graph_as_airflow(monkeypatch):
    from airflow.sdk.definitions._internal.node import DAGNode

    original = _pristine_set_relatives()
    monkeypatch.setattr(DAGNode, "_set_relatives", original)
    expected = _graph_edges(_build_graph())

    handed_on = []

    def counting(self, *args, **kwargs):
        handed_on.append(type(self).__name__)
        return original(self, *args, **kwargs)

    counting._fleetbench_cached = False  # looks like Airflow's own to fast_edges, which checks the source: use it
    monkeypatch.setattr(parse_speed, "_source_sha256", lambda f: parse_speed.SET_RELATIVES_SHA256)
    monkeypatch.setattr(DAGNode, "_set_relatives", counting)
    parse_speed.fast_edges()
    fast = DAGNode._set_relatives
    assert getattr(fast, parse_speed.MARK, False)
    calls = []
    monkeypatch.setattr(DAGNode, "_set_relatives", lambda self, *a, **kw: calls.append(1) or fast(self, *a, **kw))
    got = _graph_edges(_build_graph())
    assert got == expected
    assert expected["run"] == (["cases"], ["end"]) and expected["end"][0] == ["cases", "lane.b", "run"]
    # the edges into and out of the group and the labelled one went to Airflow's function, the rest did not
    assert sorted(handed_on) == ["EmptyOperator", "EmptyOperator", "MappedOperator", "MappedOperator"]
    # fast: start >> [mid, source], source -> cases (an XComArg per argument: twice), cases -> run (expand),
    # a >> b, end << [cases, run]
    assert len(calls) - len(handed_on) == 6


def test_fast_edges_keep_airflows_errors(monkeypatch):
    import pendulum
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG
    from airflow.sdk.definitions._internal.node import DAGNode

    monkeypatch.setattr(DAGNode, "_set_relatives", _pristine_set_relatives())
    parse_speed.fast_edges()
    assert getattr(DAGNode._set_relatives, parse_speed.MARK, False)
    with DAG(dag_id="one", start_date=pendulum.datetime(2026, 1, 1), schedule=None):
        a = EmptyOperator(task_id="a")
    with DAG(dag_id="two", start_date=pendulum.datetime(2026, 1, 1), schedule=None):
        b = EmptyOperator(task_id="b")
    with pytest.raises(RuntimeError, match="more than one Dag"):
        a >> b
    with pytest.raises(ValueError, match="don't have Dags yet"):
        EmptyOperator(task_id="c") >> EmptyOperator(task_id="d")
    lone = EmptyOperator(task_id="lone")
    a >> lone  # a task without a DAG joins the other's, as in Airflow
    assert lone.dag is a.dag and lone.upstream_task_ids == {"a"}


def test_a_changed_set_relatives_is_reported_and_left_alone(monkeypatch):
    from airflow.sdk.definitions._internal.node import DAGNode

    def _set_relatives(self, task_or_task_list, upstream=False, edge_modifier=None):
        raise AssertionError("not called here")

    monkeypatch.setattr(DAGNode, "_set_relatives", _set_relatives)
    with pytest.raises(parse_speed.ParseSpeedError, match="_set_relatives has changed"):
        parse_speed.check()
    parse_speed.fast_edges()
    assert DAGNode._set_relatives is _set_relatives
