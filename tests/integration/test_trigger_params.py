"""Manual runs with parameters through Airflow itself (dag.test with a run conf)."""

from __future__ import annotations

import pytest

from fleet_configs import containers_of, run_fleet_dag, smoke_config, write_config

pytestmark = [pytest.mark.integration, pytest.mark.dagrun]


def test_subset_run_stores_only_the_chosen_cases(airflow_db, data_dir, smoke_image, docker_api, tmp_path, monkeypatch):
    config = write_config(tmp_path / "fleet.yaml", smoke_config(smoke_image))
    dag_run = run_fleet_dag(monkeypatch, config, run_conf={"models": ["lenet"], "batch_sizes": [4], "num_batches": 3})
    assert dag_run.state == "success"
    from fleetbench.warehouse import fetch_results, get_engine

    rows = fetch_results(get_engine(), run_id=dag_run.run_id)
    assert ([(r["model"], r["batch_size_per_device"], r["num_batches"], r["status"]) for r in rows]
            == [("lenet", 4, 3, "ok")])
    assert containers_of(docker_api, dag_run.run_id) == []


def test_dry_run_plans_and_validates_but_runs_and_stores_nothing(airflow_db, data_dir, smoke_image, docker_api,
                                                                 tmp_path, monkeypatch):
    config = write_config(tmp_path / "fleet.yaml", smoke_config(smoke_image))
    dag_run = run_fleet_dag(monkeypatch, config, run_conf={"dry_run": True})
    assert dag_run.state == "success"
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    assert states["plan"] == states["host_localhost.cases"] == states["store"] == "success"
    assert states["host_localhost.run_case"] == states["report"] == states["outcome"] == "skipped"
    lane = next(ti for ti in dag_run.get_task_instances() if ti.task_id == "host_localhost.cases")
    assert lane.xcom_pull(task_ids="host_localhost.cases", key="validation")["verdict"] == "ready"
    assert lane.xcom_pull(task_ids="host_localhost.cases", key="images") is None  # nothing pulled
    from fleetbench.warehouse import fetch_results, get_engine, upgrade

    engine = get_engine()
    upgrade(engine)  # the dry run did not even create the warehouse
    assert fetch_results(engine, run_id=dag_run.run_id) == []


@pytest.mark.parametrize("conf, needle", [
    ({"models": ["trivial; rm -rf /"]}, "trivial; rm -rf /"),
    ({"hosts": ["gpu-99"]}, "gpu-99"),
    ({"batch_sizes": [-1]}, "-1"),
])
def test_invalid_trigger_is_refused_before_anything_runs(airflow_db, data_dir, smoke_image, tmp_path, monkeypatch,
                                                         conf, needle):
    from airflow.sdk.exceptions import ParamValidationError

    config = write_config(tmp_path / "fleet.yaml", smoke_config(smoke_image))
    with pytest.raises(ParamValidationError) as info:
        run_fleet_dag(monkeypatch, config, run_conf=conf)
    assert needle in str(info.value)


def test_a_dry_run_whose_host_check_crashed_fails_naming_the_host(airflow_db, data_dir, smoke_image, tmp_path,
                                                                  monkeypatch):
    """A dry run is there to validate the hosts: one whose check crashed (its lane's task failed, no verdict) fails
    the run, named, instead of a green run that never mentions it."""
    import fleetbench.hosts.check as check

    real = check.check_host

    def crashing(host, folder, timeout_s=None):
        if host.name == "other":
            raise RuntimeError("the check crashed")
        return real(host, folder, timeout_s)

    monkeypatch.setattr(check, "check_host", crashing)
    config = write_config(tmp_path / "fleet.yaml", smoke_config(smoke_image, hosts=[
        {"name": "localhost", "connection": "local"}, {"name": "other", "connection": "local"}]))
    dag_run = run_fleet_dag(monkeypatch, config, run_conf={"dry_run": True})
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    assert dag_run.state == "failed"
    assert (states["host_localhost.cases"], states["host_other.cases"], states["store"]) == (
        "success", "failed", "failed")
    store = next(ti for ti in dag_run.get_task_instances() if ti.task_id == "store")
    assert store.try_number == 1  # failed without a retry: it would say the same
