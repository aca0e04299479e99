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
