"""compare over a warehouse: each DAG's nights apart, host sides only against host sides, and a no-results message
that names every filter it applied."""

from __future__ import annotations

import pytest

from fleetbench.regression.compare import NoResults, compare
from fleetbench.warehouse import get_engine, store_run, upgrade
from regression_rows import night_date, night_row, night_run_id


def store(engine, dag: str, n: int, rows: list[dict]) -> None:
    store_run(engine, {"dag_id": dag, "run_id": night_run_id(n), "logical_date": night_date(n),
                       "run_type": "scheduled", "fleet": "t", "cases_total": len(rows), "cases_ok": len(rows),
                       "cases_failed": 0, "cases_skipped": 0}, [], [{**r, "dag_id": dag} for r in rows])


@pytest.fixture()
def engine(tmp_path):
    engine = get_engine(f"sqlite:///{tmp_path}/w.db")
    upgrade(engine)
    for n in range(8):
        driver = "550.127.05" if n < 4 else "590.48.01"
        store(engine, "fleet_benchmark", n, [night_row(n, host="gpu-a", value=1000.0, driver_version=driver),
                                             night_row(n, host="gpu-b", value=900.0, driver_version=driver)])
        store(engine, "other_dag", n, [night_row(n, host="gpu-a", value=4242.0, driver_version=driver)])
    yield engine
    engine.dispose()


def test_two_dags_benchmarking_one_host_are_compared_apart(engine):
    rows = compare(engine, "550.127.05", "590.48.01")
    got = {(r["dag_id"], r["host"], r["case_key"]): (r["before_n"], r["after_n"], r["before_value"]) for r in rows}
    assert got == {("fleet_benchmark", "gpu-a", "c1"): (4, 4, 1000.0),
                   ("fleet_benchmark", "gpu-b", "c1"): (4, 4, 900.0), ("other_dag", "gpu-a", "c1"): (4, 4, 4242.0)}
    from fleetbench.regression.compare import format_compare

    assert "other_dag/c1" in format_compare(rows)
    assert "other_dag" not in format_compare(compare(engine, "550.127.05", "590.48.01", dag_id="fleet_benchmark"))


def test_a_host_side_compares_only_with_a_host_side(engine):
    with pytest.raises(ValueError, match="a host= side compares with another host= side only"):
        compare(engine, "host=gpu-a", "590.48.01")
    with pytest.raises(ValueError, match="a host= side compares with another host= side only"):
        compare(engine, "550.127.05", "host=gpu-b")
    [row] = compare(engine, "host=gpu-a", "host=gpu-b", dag_id="fleet_benchmark")
    assert (row["host"], row["before_value"], row["after_value"]) == ("gpu-a -> gpu-b", 1000.0, 900.0)


def test_no_results_names_the_dag_filter_and_lists_only_its_values(engine):
    with pytest.raises(NoResults) as err:
        compare(engine, "550.127.05", "590.48.01", dag_id="nightly_typo")
    assert str(err.value) == "no ok results with driver_version '550.127.05' of DAG 'nightly_typo' (known: none)"


def test_the_cli_names_a_dag_id_that_is_not_in_the_warehouse(tmp_path, monkeypatch, capsys):
    from fleetbench.cli import main

    url = f"sqlite:///{tmp_path}/cli.db"
    engine = get_engine(url)
    upgrade(engine)
    for n in range(2):
        store(engine, "fleet_benchmark", n, [night_row(n, host="gpu-a", value=1000.0, driver_version="550.127.05")])
    engine.dispose()
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", url)
    assert main(["compare", "--before", "550.127.05", "--after", "590.48.01", "--dag-id", "nightly_typo"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "--dag-id 'nightly_typo': no run of that DAG in the warehouse (DAGs there: fleet_benchmark)")
    assert main(["compare", "--before", "550.127.05", "--after", "590.48.01", "--dag-id", "fleet_benchmark"]) == 2
    assert "no ok results with driver_version '590.48.01' of DAG 'fleet_benchmark'" in capsys.readouterr().err


def test_no_results_lists_the_values_of_a_hosts_multi_node_sets(tmp_path):
    """A host whose results are all in multi-node sets stored under another host: the hint listed "known: none",
    as if it had no results, while the side's own query matches its sets."""
    engine = get_engine(f"sqlite:///{tmp_path}/w.db")
    upgrade(engine)
    store(engine, "fleet_benchmark", 0, [night_row(0, host="gpu-a", value=1000.0, driver_version="550.127.05",
                                                   nodes=2, host_set="gpu-a,gpu-x")])
    with pytest.raises(NoResults) as err:
        compare(engine, "999", "550.127.05", host="gpu-x")
    assert str(err.value) == "no ok results with driver_version '999' on host 'gpu-x' (known: 550.127.05)"
    with pytest.raises(NoResults, match=r"\(known: none\)"):
        compare(engine, "999", "550.127.05", host="gpu-1")
    engine.dispose()


def test_a_result_both_sides_match_counts_on_the_after_side_only(engine):
    """A date range that holds the after side's nights (or a range against a driver) matched those nights on both
    sides: they sat in both samples and pulled the change towards nothing. They now count as after only."""
    first, last = night_date(0)[:10], night_date(7)[:10]
    rows = compare(engine, f"{first}..{last}", "590.48.01", dag_id="fleet_benchmark")
    got = {r["host"]: (r["before_n"], r["after_n"], r["before_also_after_n"]) for r in rows}
    assert got == {"gpu-a": (4, 4, 4), "gpu-b": (4, 4, 4)}  # were (8, 4): the four new-driver nights on both sides
    # the same comparison without the overlap reads the same
    plain = compare(engine, "550.127.05", "590.48.01", dag_id="fleet_benchmark")
    assert [(r["before_n"], r["after_value"], r["before_value"]) for r in rows] == [
        (r["before_n"], r["after_value"], r["before_value"]) for r in plain]
    assert all(r["before_also_after_n"] == 0 for r in plain)
    # a date range inside the other
    rows = compare(engine, f"{first}..{last}", f"{night_date(6)[:10]}..{last}", dag_id="fleet_benchmark")
    assert {r["host"]: (r["before_n"], r["after_n"]) for r in rows} == {"gpu-a": (6, 2), "gpu-b": (6, 2)}


def test_the_same_side_twice_or_a_before_side_wholly_inside_the_after_side_is_refused(engine):
    with pytest.raises(ValueError, match="are the same side"):
        compare(engine, "590.48.01", "driver=590.48.01")
    with pytest.raises(NoResults, match="every ok result of --before 590.48.01 also matches --after"):
        compare(engine, "590.48.01", f"{night_date(0)[:10]}..{night_date(7)[:10]}")


def test_the_cli_says_how_many_results_counted_on_the_after_side_only(engine, tmp_path, monkeypatch, capsys):
    from fleetbench.cli import main

    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", str(engine.url))
    assert main(["compare", "--before", f"{night_date(0)[:10]}..{night_date(7)[:10]}", "--after", "590.48.01",
                 "--dag-id", "fleet_benchmark"]) == 0
    assert "8 result(s) of --before also match --after: counted on the after side only" in capsys.readouterr().out
    assert main(["compare", "--before", "590.48.01", "--after", "590.48.01"]) == 2
    assert "are the same side" in capsys.readouterr().err
