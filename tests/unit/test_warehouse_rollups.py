"""The warehouse's rollups (revision 0004) on SQLite, and the checks tests/integration runs on PostgreSQL.

Expected rollups are computed here in Python from the stored results (`fetch_results`), not with
the warehouse's SQL: after every store, rerun and partial upsert, and after migration 0004 backfills
a warehouse written before it, the rollup tables must hold exactly those aggregates. The report
over the rollups is checked against the same rows (per host, driver changes, scaling, fleet throughput).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import MetaData, Table, inspect, select

from fleetbench.warehouse import current_revision, downgrade, fetch_results, get_engine, store_run, upgrade
from fleetbench.warehouse.schema import host_month_rollup, run_case_rollup, run_host_rollup
from warehouse_contract import HEAD
from warehouse_rows import result_row, run_row

DAG = "fleet_benchmark"
HOSTS = {"gpu-a": ("NVIDIA A100-SXM4-40GB", "A100 SXM4 40GB"), "gpu-b": ("NVIDIA H100 80GB HBM3", "H100 SXM5 80GB"),
         "gpu-c": ("NVIDIA A100-SXM4-40GB", None)}  # gpu-c: no catalog name, the reported model counts
OLD, NEW = "535.104.05", "550.54.15"


# -- a history over three months --------------------------------------------------------------------
def night(day: int) -> datetime:
    """Nights counted from 2026-01-29 02:00 UTC: days 0-2 in January, 3-30 February, 31- March."""
    return datetime(2026, 1, 29, 2, tzinfo=timezone.utc) + timedelta(days=day)


def nightly(day: int, run_id: str | None = None, ips_scale: float = 1.0, driver_of=None,
            hosts=tuple(HOSTS)) -> list[dict]:
    """A night: per host, resnet50 on 1, 2 and 4 GPUs and vgg16 on 1 GPU; gpu-b's vgg16 fails on odd days,
    gpu-c's 4-GPU case is skipped; energy measured on gpu-a, estimated elsewhere."""
    when = night(day)
    run_id = run_id or f"scheduled__{when.isoformat()}"
    rows = []
    for i, host in enumerate(hosts):
        gpu_model, catalog = HOSTS[host]
        driver = driver_of(host, day) if driver_of else OLD
        for model, gpus, base in (("resnet50", 1, 400.0), ("resnet50", 2, 780.0), ("resnet50", 4, 1500.0),
                                  ("vgg16", 1, 250.0)):
            case_key = f"tf.{model}.bs64.g{gpus}.replicated"
            status = "ok"
            if host == "gpu-b" and model == "vgg16" and day % 2:
                status = "failed"
            if host == "gpu-c" and gpus == 4:
                status = "skipped"
            ips = (base + 10 * i + day) * ips_scale if status == "ok" else None
            one = (400.0 + 10 * i + day) * ips_scale
            rows.append(result_row(
                case_key, run_id=run_id, host=host, ips=ips, status=status, model=model, num_gpus=gpus,
                batch_size_per_device=64, batch_size_global=64 * gpus, logical_date=when.isoformat(),
                started_at=(when + timedelta(minutes=1)).isoformat(),
                finished_at=(when + timedelta(minutes=2)).isoformat(),
                driver_version=driver, gpu_model=gpu_model, gpu_catalog_name=catalog,
                failure_class=None if status == "ok" else ("gpu_oom" if status == "failed" else "host_unfit"),
                speedup_efficiency=ips / (gpus * one) if ips is not None and gpus > 1 and model == "resnet50" else None,
                energy_source="measured" if host == "gpu-a" else "estimated",
                images_per_joule=ips / (300.0 * gpus) if ips is not None and host != "gpu-c" else None,
                cost_per_million_images_usd=2.0 * gpus / (3600 * ips) * 1e6 if ips is not None else None))
    return rows


def run_of(rows: list[dict], run_id: str | None = None, logical_date: str | None = None) -> dict:
    first = rows[0]
    return {**run_row(run_id or first["run_id"]), "logical_date": logical_date or first["logical_date"],
            "cases_total": len(rows)}


def store(engine, rows: list[dict], steps: list[dict] = (), complete: bool = True) -> None:
    store_run(engine, run_of(rows), [], rows, list(steps), complete=complete)


def upgrade_driver(host: str, day: int) -> str:
    return NEW if host == "gpu-a" and day >= 3 else OLD  # gpu-a upgrades on 1 February


# -- expected rollups, in Python from the stored rows -----------------------------------------------------
def _gpu(r: dict) -> str | None:
    """The GPU type a result counts under (rollup.GPU): none for a CPU case."""
    return (r["gpu_catalog_name"] or r["gpu_model"]) if r["num_gpus"] > 0 else None


def _max(values):
    values = [v for v in values if v is not None]
    return max(values) if values else None


def _sum(values):
    values = [v for v in values if v is not None]
    return sum(values) if values else None


def _energy(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["status"] == "ok"]
    return {"energy_cost_n": sum(1 for r in ok
                                 if r["images_per_joule"] is not None or r["cost_per_million_images_usd"] is not None),
            "images_per_joule_n": sum(1 for r in ok if r["images_per_joule"] is not None),
            "images_per_joule_sum": _sum(r["images_per_joule"] for r in ok),
            "cost_per_million_n": sum(1 for r in ok if r["cost_per_million_images_usd"] is not None),
            "cost_per_million_sum": _sum(r["cost_per_million_images_usd"] for r in ok),
            "energy_measured": sum(1 for r in ok
                                   if r["images_per_joule"] is not None and r["energy_source"] == "measured"),
            "energy_estimated": sum(1 for r in ok
                                    if r["images_per_joule"] is not None and r["energy_source"] == "estimated")}


def _status(rows: list[dict]) -> dict:
    return {"results": len(rows), **{s: sum(1 for r in rows if r["status"] == s) for s in ("ok", "failed", "skipped")}}


def _mask(rows: list[dict]) -> int:
    mask = 0
    for r in rows:
        if r["status"] == "ok" and r["speedup_efficiency"] is not None and 2 <= r["num_gpus"] <= 62:
            mask |= 1 << r["num_gpus"]
    return mask


def expected_host_rollup(rows: list[dict]) -> list[dict]:
    groups = defaultdict(list)
    for r in rows:
        groups[(r["dag_id"], r["run_id"], r["host"], r["model"], _gpu(r), r["driver_version"],
                r["logical_date"])].append(r)
    return [{"dag_id": k[0], "run_id": k[1], "host": k[2], "model": k[3], "gpu": k[4], "driver_version": k[5],
             "logical_date": k[6], "stored_at": max(r["stored_at"] for r in rs),
             "gpu_model": _max(r["gpu_model"] for r in rs),
             **_status(rs), **_energy(rs), "scaled_gpus": _mask(rs)} for k, rs in groups.items()]


def expected_month_rollup(rows: list[dict]) -> list[dict]:
    groups, host_runs, model_runs = defaultdict(list), defaultdict(set), defaultdict(set)
    for r in rows:
        when = datetime.fromisoformat(r["logical_date"])
        month = datetime(when.year, when.month, 1, tzinfo=timezone.utc).isoformat()
        groups[(r["dag_id"], r["host"], r["model"], _gpu(r), r["driver_version"], month)].append(r)
        host_runs[(r["dag_id"], r["host"], month)].add(r["run_id"])
        model_runs[(r["dag_id"], r["host"], r["model"], month)].add(r["run_id"])
    return [{"dag_id": k[0], "host": k[1], "model": k[2], "gpu": k[3], "driver_version": k[4], "month": k[5],
             "first_date": min(r["logical_date"] for r in rs), "last_date": max(r["logical_date"] for r in rs),
             "last_ok": _max(r["logical_date"] for r in rs if r["status"] == "ok"),
             "runs": len({r["run_id"] for r in rs}), "host_runs": len(host_runs[(k[0], k[1], k[5])]),
             "model_runs": len(model_runs[(k[0], k[1], k[2], k[5])]), **_status(rs),
             "gpu_model": _max(r["gpu_model"] for r in rs), "scaled_gpus": _mask(rs)} for k, rs in groups.items()]


def expected_case_rollup(rows: list[dict]) -> list[dict]:
    groups = defaultdict(list)
    for r in rows:
        groups[(r["dag_id"], r["run_id"], r["case_key"], _gpu(r), r["logical_date"])].append(r)
    out = []
    for k, rs in groups.items():
        points = [r for r in rs
                  if r["status"] == "ok" and r["images_per_sec"] is not None and math.isfinite(r["images_per_sec"])]
        values = [r["images_per_sec"] for r in points]
        eff = [r["speedup_efficiency"] for r in rs if r["status"] == "ok" and r["speedup_efficiency"] is not None]
        out.append({"dag_id": k[0], "run_id": k[1], "case_key": k[2], "gpu": k[3], "logical_date": k[4],
                    "model": _max(r["model"] for r in rs), "num_gpus": _max(r["num_gpus"] for r in rs),
                    "batch_size_per_device": _max(r["batch_size_per_device"] for r in rs), **_status(rs),
                    "points": len(points), "hosts": len({r["host"] for r in points}),
                    "ips_median": statistics.median(values) if values else None,
                    "ips_min": min(values) if values else None, "ips_max": max(values) if values else None,
                    "efficiency_n": len(eff), "efficiency_sum": sum(eff) if eff else None,
                    "efficiency_min": min(eff) if eff else None, "efficiency_max": max(eff) if eff else None,
                    **_energy(rs), "mig_profile": _max(r.get("mig_profile") for r in rs),
                    "nodes": _max(r.get("nodes") or 1 for r in rs)})
    return out


def _normal(value):
    if isinstance(value, datetime):
        value = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc).isoformat()
    return value


def stored_rollup(engine, table) -> list[dict]:
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(select(*[c for c in table.c if c.name != "id"]))]
    return [{k: _normal(v) for k, v in r.items()} for r in rows]


def _sorted(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: tuple(str(v) for v in r.values()))


def assert_rows_equal(stored: list[dict], expected: list[dict], what: str) -> None:
    key = lambda r: tuple(str(r[c]) for c in r if not isinstance(r[c], float))  # noqa: E731
    stored_by, expected_by = {key(r): r for r in stored}, {key(r): r for r in expected}
    assert len(stored_by) == len(stored), f"{what}: duplicate rollup rows"
    assert stored_by.keys() == expected_by.keys(), f"{what}: {sorted(stored_by.keys() ^ expected_by.keys())[:4]}"
    for k, row in expected_by.items():
        got = stored_by[k]
        assert got.keys() == row.keys(), what
        for column, value in row.items():
            if isinstance(value, float):
                assert got[column] == pytest.approx(value, rel=1e-9), (what, k, column)
            else:
                assert got[column] == value, (what, k, column)


def check_rollups_match_results(engine) -> None:
    """Every rollup table equals the aggregate of the results stored now."""
    rows = fetch_results(engine)
    assert rows, "nothing stored"
    assert_rows_equal(stored_rollup(engine, run_host_rollup), expected_host_rollup(rows), "run_host_rollup")
    assert_rows_equal(stored_rollup(engine, host_month_rollup), expected_month_rollup(rows), "host_month_rollup")
    assert_rows_equal(stored_rollup(engine, run_case_rollup), expected_case_rollup(rows), "run_case_rollup")


# -- checks, shared with tests/integration/test_warehouse_rollups_postgres.py --------------------------------
def check_store_rerun_and_upsert_keep_rollups_equal(engine) -> None:
    upgrade(engine)
    for day in (0, 2, 3, 10):  # January, February
        store(engine, nightly(day, driver_of=upgrade_driver))
        check_rollups_match_results(engine)
    # March's first night written host by host (a run's hosts store on their own, as lanes finish).
    store(engine, nightly(31, hosts=("gpu-a",), driver_of=upgrade_driver), complete=False)
    check_rollups_match_results(engine)
    store(engine, nightly(31, hosts=("gpu-b", "gpu-c"), driver_of=upgrade_driver), complete=False)
    check_rollups_match_results(engine)
    # A rerun of February 1st with other numbers, and gpu-b's failed case now ok: replaced, not added.
    rows = nightly(3, ips_scale=0.9, driver_of=upgrade_driver)
    for r in rows:
        if r["status"] == "failed":
            r.update(status="ok", images_per_sec=123.0, failure_class=None)
    store(engine, rows)
    check_rollups_match_results(engine)
    with engine.connect() as conn:
        hosts_night3 = conn.execute(select(run_host_rollup.c.ok).where(run_host_rollup.c.run_id == rows[0]["run_id"],
                                                                       run_host_rollup.c.host == "gpu-b",
                                                                       run_host_rollup.c.model == "vgg16")).scalar()
    assert hosts_night3 == 1
    # A partial write: one host's cases of the same run again (a retried task), the rest stays.
    store(engine, [r for r in nightly(3, ips_scale=1.1, driver_of=upgrade_driver) if r["host"] == "gpu-c"],
          complete=False)
    check_rollups_match_results(engine)
    # A second DAG on the same night.
    other = [{**r, "dag_id": "fleet_other"} for r in nightly(10)]
    store_run(engine, {**run_of(other), "dag_id": "fleet_other"}, [], other)
    check_rollups_match_results(engine)


def check_rerun_moving_a_run_to_another_month(engine) -> None:
    """A run stored again with another logical date leaves no trace in its old month's rollup."""
    upgrade(engine)
    store(engine, nightly(2))  # 31 January
    moved = [{**r, "logical_date": night(3).isoformat()} for r in nightly(2)]  # same run id, 1 February
    store_run(engine, run_of(moved), [], moved)
    check_rollups_match_results(engine)
    with engine.connect() as conn:
        months = {_normal(m) for (m,) in conn.execute(select(host_month_rollup.c.month).distinct())}
    assert months == {"2026-02-01T00:00:00+00:00"}


def check_failed_write_leaves_rollups_alone(engine) -> None:
    upgrade(engine)
    store(engine, nightly(0))
    before = [stored_rollup(engine, t) for t in (run_host_rollup, host_month_rollup, run_case_rollup)]
    bad = nightly(0, ips_scale=2.0)
    bad[-1]["status"] = None  # NOT NULL: the write fails inside its transaction
    with pytest.raises(Exception):
        store(engine, bad)
    assert [stored_rollup(engine, t) for t in (run_host_rollup, host_month_rollup, run_case_rollup)] == before
    check_rollups_match_results(engine)


def _insert_at_0003(engine, rows: list[dict]) -> None:
    """Results written by the warehouse before revision 0004 (plain inserts into the table as it was)."""
    from fleetbench.timestamps import utc as _dt

    with engine.begin() as conn:
        table = Table("benchmark_results", MetaData(), autoload_with=conn)
        now = datetime(2026, 3, 1, tzinfo=timezone.utc)
        conn.execute(table.insert(), [
            {k: (_dt(v) if k in ("logical_date", "started_at", "finished_at") else v) for k, v in r.items()
             if k in table.c and k != "command"} | {"stored_at": now} for r in rows])


def check_migration_backfills_rollups(engine) -> None:
    upgrade(engine, "0003")
    rows = [r for day in (0, 2, 3, 31) for r in nightly(day, driver_of=upgrade_driver)]
    _insert_at_0003(engine, rows)
    upgrade(engine)
    assert current_revision(engine) == HEAD
    assert len(fetch_results(engine)) == len(rows)
    check_rollups_match_results(engine)
    assert len(stored_rollup(engine, host_month_rollup)) > len(HOSTS)  # three months of them
    # New writes on the migrated warehouse keep them in step; the downgrade removes them, the upgrade refills.
    store(engine, nightly(4, driver_of=upgrade_driver))
    check_rollups_match_results(engine)
    downgrade(engine, "0003")
    names = set(inspect(engine).get_table_names())
    assert not names & {"run_host_rollup", "host_month_rollup", "run_case_rollup"}
    assert ("ix_benchmark_results_host_case_date"
            not in {i["name"] for i in inspect(engine).get_indexes("benchmark_results")})
    upgrade(engine)
    check_rollups_match_results(engine)


# -- the report over the rollups, against the rows ---------------------------------------------------
def expected_hosts(rows: list[dict], since: datetime | None, until: datetime | None, model: str | None = None) -> dict:
    """The hosts section from the rows: runs, counts, newest result and ok result, GPU model, drivers."""
    inside = [r for r in rows if (since is None or datetime.fromisoformat(r["logical_date"]) >= since)
              and (until is None or datetime.fromisoformat(r["logical_date"]) < until)
              and (model is None or r["model"] == model)]
    out = {}
    for host in sorted({r["host"] for r in inside}):
        rs = [r for r in inside if r["host"] == host]
        out[host] = {"host": host, "runs": len({(r["dag_id"], r["run_id"]) for r in rs}),
                     **{s: sum(1 for r in rs if r["status"] == s) for s in ("ok", "failed", "skipped")},
                     "last_seen": max(r["logical_date"] for r in rs),
                     "last_ok": _max(r["logical_date"] for r in rs if r["status"] == "ok"),
                     "gpu_model": _max(r["gpu_model"] for r in rs),
                     "drivers": len({r["driver_version"] for r in rs if r["driver_version"]}),
                     "max_driver": _max(r["driver_version"] for r in rs)}
    return out


def check_report_windows_across_months(engine) -> None:
    """Windows that cut months in the middle, hold whole months, or both: the sections equal the rows'."""
    from fleetbench.report import build_report, parse_filters

    upgrade(engine)
    for day in (0, 1, 2, 3, 5, 17, 30, 31, 33):
        store(engine, nightly(day, driver_of=upgrade_driver))
    rows = fetch_results(engine)
    for since, until, model in ((None, None, None), ("2026-01-30", "2026-03-01", None),
                                ("2026-02-01", "2026-02-28", None), ("2026-01-01", "2026-03-31", None),
                                ("2026-01-31", "2026-03-02", "resnet50"), ("2026-02-02", "2026-02-10", "vgg16")):
        f = parse_filters(since=since, until=until, model=model)
        report = build_report(engine, f)
        lo = datetime.fromisoformat(report["window"]["since"])
        hi = datetime.fromisoformat(report["window"]["until"]) if report["window"]["until"] else None
        expected = expected_hosts(rows, lo, hi, model)
        assert {h["host"]: h for h in report["hosts"]} == expected, (since, until, model)
        inside = [r for r in rows if datetime.fromisoformat(r["logical_date"]) >= lo
                  and (hi is None or datetime.fromisoformat(r["logical_date"]) < hi)
                  and (model is None or r["model"] == model)]
        s = report["summary"]
        assert (s["runs"], s["results"], s["hosts"], s["models"]) == (
            len({r["run_id"] for r in inside}), len(inside), len({r["host"] for r in inside}),
            len({r["model"] for r in inside}))
        assert (s["ok"], s["failed"], s["skipped"]) == tuple(sum(1 for r in inside if r["status"] == st)
                                                             for st in ("ok", "failed", "skipped"))
        assert (s["first"], s["last"]) == (min(r["logical_date"] for r in inside),
                                           max(r["logical_date"] for r in inside))
        # scaling: the mean, min, max of the rows' efficiencies per model and GPU count, and the hosts with one
        scaling = {}
        for r in inside:
            if r["status"] == "ok" and r["speedup_efficiency"] is not None and r["num_gpus"] >= 2:
                scaling.setdefault((r["model"], r["num_gpus"]), []).append(r)
        assert {(x["model"], x["num_gpus"]): (x["n"], x["hosts"], x["min"], x["max"]) for x in report["scaling"]} == {
            k: (len(v), len({r["host"] for r in v}), min(r["speedup_efficiency"] for r in v),
                max(r["speedup_efficiency"] for r in v)) for k, v in scaling.items()}
        for x in report["scaling"]:
            assert x["mean"] == pytest.approx(statistics.fmean(r["speedup_efficiency"]
                                                               for r in scaling[(x["model"], x["num_gpus"])]))
        # efficiency per GPU type and model
        eff = defaultdict(list)
        for r in inside:
            if r["status"] == "ok" and _gpu(r) and (r["images_per_joule"] is not None
                                                    or r["cost_per_million_images_usd"] is not None):
                eff[(_gpu(r), r["model"])].append(r)
        assert {(x["gpu"], x["model"]): x["n"] for x in report["efficiency"]} == {k: len(v) for k, v in eff.items()}
        for x in report["efficiency"]:
            ipj = [r["images_per_joule"] for r in eff[(x["gpu"], x["model"])] if r["images_per_joule"] is not None]
            assert x["images_per_joule"] == (pytest.approx(statistics.fmean(ipj)) if ipj else None)
            assert x["measured"] == sum(1 for r in eff[(x["gpu"], x["model"])]
                                        if r["images_per_joule"] is not None and r["energy_source"] == "measured")
    # The driver change on 1 February, seen from windows that start on it, after it, or hold it in a whole month.
    changes = [(c["logical_date"], c["host"], c["from"], c["to"], c["run_id"])
               for c in build_report(engine, parse_filters(since="2026-02-01"))["driver_changes"]]
    assert changes == [(night(3).isoformat(), "gpu-a", OLD, NEW, f"scheduled__{night(3).isoformat()}")]
    assert build_report(engine, parse_filters(since="2026-01-01", until="2026-03-31"))["driver_changes"] == \
        build_report(engine, parse_filters(since="2026-02-01"))["driver_changes"]
    assert build_report(engine, parse_filters(since="2026-02-02"))["driver_changes"] == []
    assert build_report(engine, parse_filters(until="2026-01-31"))["driver_changes"] == []


def with_cpu_case(rows: list[dict]) -> list[dict]:
    """The night's rows and, on each host, resnet50 on its CPU too (a CPU case: no GPU type in the rollups, its own
    rows beside the model's GPU cases)."""
    first = {r["host"]: r for r in reversed(rows)}
    return rows + [{**r, "case_key": "cpu.resnet50.bs16", "model": "resnet50", "num_gpus": 0, "device": "cpu",
                    "batch_size_per_device": 16, "batch_size_global": 16, "status": "ok", "failure_class": None,
                    "images_per_sec": 40.0, "speedup_efficiency": None, "gpu_catalog_name": None,
                    "images_per_joule": None, "cost_per_million_images_usd": None} for r in first.values()]


def check_model_runs_count_each_run_once(engine) -> None:
    """With a model filter the Hosts table counts a host's runs of that model once each, though the model's rows
    are per GPU type (its CPU case has none) and driver: in whole months (host_month_rollup.model_runs) and in
    the nights at a window's edges. Rebuilding every rollup gives what the writes left."""
    from fleetbench.report import build_report, parse_filters
    from fleetbench.warehouse import rollup

    upgrade(engine)
    for day in (0, 1, 2, 3, 5, 17, 30, 31, 33):
        store(engine, with_cpu_case(nightly(day, driver_of=upgrade_driver)))
    check_rollups_match_results(engine)
    rows = fetch_results(engine)
    for since, until in ((None, None), ("2026-01-01", "2026-03-31"), ("2026-02-01", "2026-02-28"),
                         ("2026-01-31", "2026-03-02"), ("2026-02-02", "2026-02-10")):
        report = build_report(engine, parse_filters(since=since, until=until, model="resnet50"))
        lo = datetime.fromisoformat(report["window"]["since"])
        hi = datetime.fromisoformat(report["window"]["until"]) if report["window"]["until"] else None
        assert {h["host"]: h for h in report["hosts"]} == expected_hosts(rows, lo, hi, "resnet50"), (since, until)
    february = build_report(engine, parse_filters(since="2026-02-01", until="2026-02-28", model="resnet50"))
    assert {h["host"]: h["runs"] for h in february["hosts"]} == {"gpu-a": 4, "gpu-b": 4, "gpu-c": 4}  # 3, 5, 17, 30
    tables = (run_host_rollup, host_month_rollup, run_case_rollup)
    stored = [stored_rollup(engine, t) for t in tables]
    with engine.begin() as conn:
        rollup.rebuild(conn)
    for table, before in zip(tables, stored):  # any row order; sums to the last bits of their order of addition
        assert_rows_equal(stored_rollup(engine, table), before, f"{table.name} rebuilt")


def check_driver_changes_back_and_forth(engine) -> None:
    """A host that goes to a new driver and back (its drivers' nights interleave), next to a plain upgrade."""
    from fleetbench.report import build_report, parse_filters

    upgrade(engine)

    def driver_of(host, day):
        if host == "gpu-b":
            return NEW if 3 <= day < 5 else OLD  # up on 1 Feb, back on 3 Feb
        return upgrade_driver(host, day)

    for day in (0, 2, 3, 4, 5, 31):
        store(engine, nightly(day, driver_of=driver_of))
    got = [(c["logical_date"][:10], c["host"], c["from"], c["to"])
           for c in build_report(engine, parse_filters(since="2026-01-01"))["driver_changes"]]
    assert got == [("2026-02-01", "gpu-a", OLD, NEW), ("2026-02-01", "gpu-b", OLD, NEW),
                   ("2026-02-03", "gpu-b", NEW, OLD)]
    got = [(c["logical_date"][:10], c["host"])
           for c in build_report(engine, parse_filters(since="2026-02-02", host="gpu-b"))["driver_changes"]]
    assert got == [("2026-02-03", "gpu-b")]


def check_fleet_throughput(engine) -> None:
    """More series than the limit: the fleet's median per case and GPU type each night, min, max, hosts; a host
    filter still gets that host's own series; few enough series get one per host and case."""
    from fleetbench.report import build_report, parse_filters
    from fleetbench.report.plots import charts
    from fleetbench.report.render import render_html

    upgrade(engine)
    for day in (0, 2, 3):
        store(engine, nightly(day, driver_of=upgrade_driver))
    rows = [r for r in fetch_results(engine) if r["status"] == "ok"]
    f = parse_filters(since="2026-01-01")
    full = build_report(engine, f)
    assert (full["throughput_mode"] == "hosts"
            and len(full["throughput"]) == len({(r["host"], r["case_key"]) for r in rows}))

    for report in (build_report(engine, f, max_series=3), build_report(engine, f, max_points=5)):
        assert report["throughput_mode"] == "fleet"
        groups = defaultdict(lambda: defaultdict(list))
        for r in rows:
            groups[(r["model"], r["case_key"], _gpu(r))][r["logical_date"]].append(r)
        series = {(s["model"], s["case_key"], s["gpu"]): s for s in report["throughput"]}
        assert series.keys() == groups.keys()
        for key, nights in groups.items():
            s = series[key]
            assert [p["logical_date"] for p in s["points"]] == sorted(nights)
            for p in s["points"]:
                values = [r["images_per_sec"] for r in nights[p["logical_date"]]]
                assert (p["images_per_sec"], p["min"], p["max"], p["hosts"]) == (
                    pytest.approx(statistics.median(values)), min(values), max(values), len(values))
            every = [r["images_per_sec"] for rs in nights.values() for r in rs]
            assert (s["min"], s["max"], s["n"]) == (min(every), max(every), len(nights))
            assert s["latest"] == pytest.approx(statistics.median(r["images_per_sec"] for r in nights[max(nights)]))
            assert s["label"] == f"{key[1]} · {key[2]}"
        assert any("the fleet's median images/sec each night" in n for n in report["notes"])
        page = render_html(report, charts(report))
        assert 'id="throughput-fleet"' in page and "hosts (latest night)" in page
        # gpu-a's driver change is one marker per night and change on the fleet chart
        assert "1 host: driver 535.104.05 → 550.54.15" in page

    one = build_report(engine, parse_filters(since="2026-01-01", host="gpu-a"), max_series=1, max_points=1)
    assert one["throughput_mode"] == "hosts"
    assert {s["case_key"] for s in one["throughput"]} == {r["case_key"] for r in rows if r["host"] == "gpu-a"}
    assert all(s["host"] == "gpu-a" for s in one["throughput"])
    assert not any("fleet's median" in n for n in one["notes"])


# -- SQLite ---------------------------------------------------------------------------------------------
@pytest.fixture()
def engine(tmp_path):
    eng = get_engine(f"sqlite:///{tmp_path}/w.db")
    yield eng
    eng.dispose()


def test_store_rerun_and_upsert_keep_rollups_equal(engine):
    check_store_rerun_and_upsert_keep_rollups_equal(engine)


def test_rerun_moving_a_run_to_another_month(engine):
    check_rerun_moving_a_run_to_another_month(engine)


def test_failed_write_leaves_rollups_alone(engine):
    check_failed_write_leaves_rollups_alone(engine)


def test_migration_backfills_rollups(engine):
    check_migration_backfills_rollups(engine)


def test_report_windows_across_months(engine):
    check_report_windows_across_months(engine)


def test_driver_changes_back_and_forth(engine):
    check_driver_changes_back_and_forth(engine)


def test_fleet_throughput(engine):
    check_fleet_throughput(engine)


def test_model_runs_count_each_run_once(engine):
    check_model_runs_count_each_run_once(engine)
