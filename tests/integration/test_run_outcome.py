"""The fleet DAG's `outcome` task fails a run in which any task failed, even when every other leaf succeeded
(store and report run whatever happened, so without it a failed benchmark task would leave a green run),
or in which every host was unfit. It runs beside `report`, the other leaf, whose own failure fails the run.
Real runs with dag.test() of a DAG wired like the fleet DAG's tail."""

from __future__ import annotations

import textwrap

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.dagrun]

PROBE_DAGS = textwrap.dedent('''
    import pendulum
    from airflow.sdk import DAG, TriggerRule, get_current_context, task

    from fleetbench.airflow import pipeline


    def tail_dag(dag_id, fail_middle, fail_report=False, unfit=None):
        with DAG(dag_id, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False) as dag:
            @task(retries=0)
            def start():
                return 1

            @task(retries=0)
            def run_case(x):
                if fail_middle:
                    raise RuntimeError("the Docker engine went away")
                return x

            @task(retries=0)
            def after(x):
                return x

            @task(trigger_rule=TriggerRule.ALL_DONE, retries=0)
            def store(x):  # like store: succeeds whatever happened upstream
                return {"every_host_unfit": unfit}

            @task(trigger_rule=TriggerRule.ALL_DONE, retries=0)
            def report(stored):
                if fail_report:
                    raise RuntimeError("the report could not be written")

            @task(trigger_rule=TriggerRule.ALL_DONE, retries=0)
            def outcome(stored):
                ctx = get_current_context()
                pipeline.fail_if_tasks_failed(ctx["ti"], ctx["dag_run"].dag_id, ctx["dag_run"].run_id,
                                              every_host_unfit=stored["every_host_unfit"])

            s = start()
            stored = store(s)
            after(run_case(s)) >> stored
            report(stored)
            outcome(stored)
        return dag


    failing = tail_dag("outcome_probe_failing", fail_middle=True)
    passing = tail_dag("outcome_probe_passing", fail_middle=False)
    report_fails = tail_dag("outcome_probe_report", fail_middle=False, fail_report=True)
    all_unfit = tail_dag("outcome_probe_unfit", fail_middle=False, unfit="every host is unfit, nothing ran: a: no GPU")
''')


@pytest.fixture()
def probe_bag(airflow_db, tmp_path):
    """The probe DAGs parsed from a file and written to the metadata DB, as the dag-processor would."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db

    folder = tmp_path / "probe_dags"
    folder.mkdir()
    (folder / "outcome_probe.py").write_text(PROBE_DAGS)
    bag = BundleDagBag(dag_folder=str(folder), bundle_path=folder, bundle_name="dags-folder")
    assert not bag.import_errors, bag.import_errors
    DagBundlesManager().sync_bundles_to_db()
    sync_bag_to_db(bag, "dags-folder", None)
    return bag


def states_of(dag_run) -> dict[str, str]:
    return {ti.task_id: ti.state for ti in dag_run.get_task_instances()}


def test_a_failed_task_fails_the_run_though_the_other_leaves_succeeded(probe_bag, capfd, caplog):
    dag_run = probe_bag.get_dag("outcome_probe_failing").test()
    states = states_of(dag_run)
    assert (states["run_case"], states["after"], states["store"]) == ("failed", "upstream_failed", "success")
    assert (states["outcome"], states["report"]) == ("failed", "success")
    assert dag_run.state == "failed"
    # it names both the failed task and the one that could not run because of it
    out, err = capfd.readouterr()
    assert "2 task(s) of this run failed: after, run_case" in out + err + caplog.text


def test_a_run_without_failures_succeeds(probe_bag, capfd, caplog):
    dag_run = probe_bag.get_dag("outcome_probe_passing").test()
    assert set(states_of(dag_run).values()) == {"success"}
    assert dag_run.state == "success"
    out, err = capfd.readouterr()
    assert f"no task of run {dag_run.run_id} failed" in out + err + caplog.text


def test_a_failed_report_fails_the_run(probe_bag):
    """The report is a leaf: its failure fails the run whether `outcome`, beside it, ran before it (and succeeded)
    or after it (and failed, naming it)."""
    dag_run = probe_bag.get_dag("outcome_probe_report").test()
    states = states_of(dag_run)
    assert (states["report"], states["store"]) == ("failed", "success")
    assert dag_run.state == "failed"


def test_a_run_in_which_every_host_was_unfit_fails_saying_so(probe_bag, capfd, caplog):
    dag_run = probe_bag.get_dag("outcome_probe_unfit").test()
    assert states_of(dag_run)["outcome"] == "failed"
    assert dag_run.state == "failed"
    out, err = capfd.readouterr()
    assert "every host is unfit, nothing ran: a: no GPU" in out + err + caplog.text
