"""Attempts: a rerun never destroys a measurement.

An attempt is one execution of a planned case in a run (run, host, case_key): one container outcome,
or for a case that did not run (host unfit, image not prepared, task failed before reporting), one
judgement of it by the run's collect step. Each attempt has a number (1, 2, ... per run, host and
case, in the order they were stored) and an identity, `attempt_id` (`attempt_id`: a digest of the
container outcome, the container's start and end as the engine reported them).

Storing a (run, host, case) (`decide`, inside `store_run`'s one transaction):

- nothing stored yet: attempt 1 (or the number after the highest superseded one);
- the stored attempt has the same identity: it is the same execution written again (the store task
  retried or cleared, `fleetbench results` of a re-collected run): it is replaced in place, its
  number kept;
- another identity (the run was cleared and ran again, or a backfill with `--reprocess-behavior
  completed` or `failed`): a new attempt. The stored one moves to `superseded_results` whole (with its
  steps as JSON) and the new one takes the next number.

A complete store that no longer plans a case the run had stored moves that attempt to
`superseded_results` as well (superseded_by NULL) rather than deleting it.

Host facts (one host check per run and host in host_facts) are kept the same way (`keep_host_facts`): a
store that brings another check of a host (another `collected_at`: the run was cleared and its hosts checked
again) first moves the stored one to `superseded_host_facts`, and so does a complete store that no longer
has the host. A superseded attempt names the check it was stored with (`host_collected_at`);
`fetch_attempts` gives each attempt its check's facts (`host_verdict`, `host_driver_version`, ...).

The current attempt (`current_attempt`) of a (run, host, case) is the one stored last, i.e. the
highest number; benchmark_results holds exactly the current attempts, so rollups, the report, the
capacity_features view and regressions count each (run, host, case) once. Superseded attempts are
read with `fetch_attempts` (`fleetbench results --attempts`) and by `fleetbench compare --attempts`.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence

from sqlalchemy import and_, func, select

from fleetbench.timestamps import utc
from fleetbench.warehouse import bulk
from fleetbench.warehouse.read import iso_timestamps
from fleetbench.warehouse.schema import (
    ATTEMPT_KEY,
    RESULT_KEY,
    SUPERSEDED_HOST_KEY,
    benchmark_results,
    host_facts,
    result_metrics,
    steps,
    superseded_host_facts,
    superseded_results,
)


# -- identity and the rule -------------------------------------------------------------------------
def attempt_id(host: str, case_key: str, outcome: Mapping[str, Any] | None = None,
               not_run: Sequence[Any] = ()) -> str:
    """The identity of an attempt: of its container outcome (container, start and end as the engine
    reported them: a retried task re-reading the same outcome gets the same identity, a new execution
    another), or for a case that did not run, of what `not_run` names (e.g. the run's start and the
    host check's time, which a cleared and rerun run renews)."""
    if outcome is not None:
        basis = ["outcome", host, case_key, outcome.get("container_name"), outcome.get("started_at"),
                 outcome.get("finished_at")]
    else:
        basis = ["not-run", host, case_key, *not_run]
    return hashlib.sha256("\0".join("" if v is None else str(v) for v in basis).encode()).hexdigest()[:32]


def row_attempt_id(row: Mapping[str, Any]) -> str:
    """The identity of a result row written without one (e.g. by a script): its own start, end and log."""
    return attempt_id(row["host"], row["case_key"], {"container_name": row.get("log_path"),
                                                    "started_at": row.get("started_at"),
                                                    "finished_at": row.get("finished_at")})


def decide(stored: tuple[int, str | None] | None, superseded_max: int, incoming_id: str) -> tuple[int, bool]:
    """(the incoming attempt's number, whether the stored current attempt is superseded by it).

    `stored`: the current attempt's (number, attempt_id), None when there is none; `superseded_max`:
    the highest number already superseded (0 when none)."""
    if stored is None:
        return superseded_max + 1, False
    number, stored_id = stored
    if stored_id is not None and stored_id == incoming_id:
        return number, False
    return max(number, superseded_max) + 1, True


def current_attempt(attempts: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The current attempt among attempts of one (run, host, case): the one stored last (highest number)."""
    return max(attempts, key=lambda a: a["attempt"] or 0, default=None)


NO_LONGER_PLANNED = "no longer planned"


def remeasure_reasons(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """Why a night was measured again, from a superseded attempt and the one after it: the driver or the
    image changed, or the earlier attempt had failed (else: "rerun")."""
    reasons = []
    if before.get("driver_version") != after.get("driver_version"):
        reasons.append(f"driver {before.get('driver_version') or '?'} -> {after.get('driver_version') or '?'}")
    if before.get("image_digest") != after.get("image_digest"):
        reasons.append("image changed")
    if before.get("status") != "ok":
        reasons.append(f"rerun of a {before.get('status') or 'missing'} result")
    return reasons or ["rerun"]


# -- inside store_run's transaction ----------------------------------------------------------------
def number(conn, columns: Sequence[str], rows: list[tuple], keys: list[tuple], now: datetime,
           complete_run: tuple[str, str] | None = None) -> list[tuple]:
    """The rows with their attempt numbers (and identities) set by `decide`. Stored attempts they supersede
    are moved to superseded_results first, and with `complete_run` (dag_id, run_id) so are the run's
    stored results this write no longer has. `keys`: each row's RESULT_KEY, in the same order."""
    run_keys = {k[:2] for k in keys} | ({complete_run} if complete_run else set())
    if not run_keys:
        return rows
    i_num, i_id = columns.index("attempt"), columns.index("attempt_id")
    i_why = [(c, columns.index(c)) for c in WHY_COLUMNS]
    stored, past = _stored(conn, run_keys)
    numbered, superseded = [], {}
    for key, row in zip(keys, rows):
        aid = row[i_id] or row_attempt_id(dict(zip(columns, row)))
        n, supersedes = decide(stored.get(key), past.get(key, 0), aid)
        if supersedes:
            superseded[key] = (n, {c: row[i] for c, i in i_why})
        row = list(row)
        row[i_num], row[i_id] = n, aid
        numbered.append(tuple(row))
    if complete_run:
        written = set(keys)
        superseded.update((k, (None, None)) for k in stored if k[:2] == complete_run and k not in written)
    archive(conn, superseded, now)
    return numbered


def _stored(conn, run_keys: set[tuple]) -> tuple[dict, dict]:
    """Of the runs written: each (run, host, case)'s current (number, attempt_id), and its highest superseded number."""
    br, sr = benchmark_results, superseded_results
    stored, past = {}, {}
    for dag_id, run_id in sorted(run_keys):
        for *key, n, aid in conn.execute(select(*[br.c[k] for k in RESULT_KEY], br.c.attempt, br.c.attempt_id)
                                         .where(br.c.dag_id == dag_id, br.c.run_id == run_id)):
            stored[tuple(key)] = (n, aid)
        for *key, n in conn.execute(select(*[sr.c[k] for k in RESULT_KEY], func.max(sr.c.attempt))
                                    .where(sr.c.dag_id == dag_id, sr.c.run_id == run_id)
                                    .group_by(*[sr.c[k] for k in RESULT_KEY])):
            past[tuple(key)] = n
    return stored, past


ARCHIVED = [c for c in superseded_results.c.keys() if c != "id"]  # the columns archive writes, in this order
_FROM_RESULTS = [c for c in ARCHIVED if c in benchmark_results.c]
_STEP_FIELDS = ("step", "images_per_sec", "plusminus", "jitter", "loss")
_METRIC_FIELDS = ("metric", "labels", "value", "unit", "better")


WHY_COLUMNS = ("driver_version", "image_digest", "status")  # what `remeasure_reasons` compares


def archive(conn, superseded_by: Mapping[tuple, tuple[int | None, Mapping[str, Any] | None]], now: datetime) -> None:
    """Copy the current attempts of these (run, host, case) keys, with their steps and metric samples, into
    superseded_results (one bulk upsert: COPY on PostgreSQL), each with why it was superseded. Called once per
    store transaction.

    `superseded_by`: key -> (the number of the attempt replacing it, that attempt's WHY_COLUMNS); (None,
    None): the case is no longer planned."""
    if not superseded_by:
        return
    out = []
    for dag_id, run_id in sorted({k[:2] for k in superseded_by}):  # a run's rows through the result key's index
        step_lists: dict[tuple, list[dict]] = {}
        for r in conn.execute(select(*[steps.c[k] for k in (*RESULT_KEY, *_STEP_FIELDS)])
                              .where(steps.c.dag_id == dag_id, steps.c.run_id == run_id).order_by(steps.c.step)):
            key = tuple(r[:4])
            if key in superseded_by:
                step_lists.setdefault(key, []).append(dict(zip(_STEP_FIELDS, r[4:])))
        metric_lists = _per_result(conn, result_metrics, _METRIC_FIELDS, dag_id, run_id, superseded_by)
        checked = dict(conn.execute(select(host_facts.c.host, host_facts.c.collected_at)
                                    .where(host_facts.c.dag_id == dag_id, host_facts.c.run_id == run_id)).all())
        for r in conn.execute(select(*[benchmark_results.c[c] for c in _FROM_RESULTS])
                              .where(benchmark_results.c.dag_id == dag_id, benchmark_results.c.run_id == run_id)):
            row = dict(zip(_FROM_RESULTS, r))
            key = tuple(row[k] for k in RESULT_KEY)
            if key not in superseded_by:
                continue
            by, successor = superseded_by[key]
            why = "; ".join(remeasure_reasons(row, successor)) if successor is not None else NO_LONGER_PLANNED
            row.update(steps_json=json.dumps(step_lists[key]) if key in step_lists else None,
                       metrics_json=json.dumps(metric_lists[key]) if key in metric_lists else None, superseded_at=now,
                       superseded_by=by, superseded_why=why, host_collected_at=utc(checked.get(row["host"])))
            out.append(tuple(row[c] for c in ARCHIVED))
    at = [ARCHIVED.index(k) for k in ATTEMPT_KEY]
    out.sort(key=lambda row: tuple(row[i] for i in at))
    bulk.upsert(conn, superseded_results, ARCHIVED, out, ATTEMPT_KEY)


_HOST_COLUMNS = [c for c in superseded_host_facts.c.keys() if c != "id"]  # what keep_host_facts writes


def keep_host_facts(conn, incoming: Mapping[tuple, Any], now: datetime,
                    complete_run: tuple[str, str] | None = None) -> int:
    """Move the stored host checks that this store replaces to superseded_host_facts (inside store_run's
    transaction, before the new ones are written): those of `incoming` (HOST_KEY -> the new check's
    collected_at) stored with another collected_at, and with `complete_run` (dag_id, run_id) those of the
    run this store does not have. A retry of the same check (same collected_at) replaces it in place.
    Returns how many were moved."""
    runs = {k[:2] for k in incoming} | ({complete_run} if complete_run else set())
    out = []
    for dag_id, run_id in sorted(runs):
        where = (host_facts.c.dag_id == dag_id, host_facts.c.run_id == run_id)
        moving = set()  # the checks' times first: a retry of the same checks reads no facts
        for host, collected_at in conn.execute(select(host_facts.c.host, host_facts.c.collected_at).where(*where)):
            key = (dag_id, run_id, host)
            if key in incoming:
                if utc(incoming[key]) != utc(collected_at):
                    moving.add(host)
            elif (dag_id, run_id) == complete_run:
                moving.add(host)
        if not moving:
            continue
        for r in conn.execute(select(*[host_facts.c[c] for c in _HOST_COLUMNS if c != "superseded_at"])
                              .where(*where, host_facts.c.host.in_(sorted(moving)))):
            row = {**r._mapping, "superseded_at": now}
            out.append(tuple(row[c] for c in _HOST_COLUMNS))
    out.sort(key=lambda row: tuple(str(row[_HOST_COLUMNS.index(k)]) for k in SUPERSEDED_HOST_KEY))
    bulk.upsert(conn, superseded_host_facts, _HOST_COLUMNS, out, SUPERSEDED_HOST_KEY)
    return len(out)


def _per_result(conn, table, fields: Sequence[str], dag_id: str, run_id: str, keys) -> dict[tuple, list[dict]]:
    """A run's rows of a per-result table (result_metrics), as dicts of `fields`, per (run, host, case) in `keys`."""
    out: dict[tuple, list[dict]] = {}
    for r in conn.execute(select(*[table.c[k] for k in (*RESULT_KEY, *fields)])
                          .where(table.c.dag_id == dag_id, table.c.run_id == run_id)):
        key = tuple(r[:4])
        if key in keys:
            out.setdefault(key, []).append(dict(zip(fields, r[4:])))
    return out


# -- reading -------------------------------------------------------------------------------------------
def attempts_query(table, run_id: str | None = None, dag_id: str | None = None, since=None, until=None, host=None):
    from fleetbench.warehouse.read import result_filters

    conds = result_filters(table, run_id, dag_id, since=since, until=until, host=host)
    return select(table).where(and_(*conds)) if conds else select(table)


# The host check's facts each attempt gets from fetch_attempts: host_<field> (host_checked_at: collected_at).
HOST_CHECK_FIELDS = ("verdict", "reasons", "driver_version", "cuda_driver_version", "gpu_health_issues", "kernel",
                     "docker_version")


def fetch_attempts(engine, run_id: str | None = None, dag_id: str | None = None, *, since=None, until=None,
                   host: str | None = None) -> list[dict]:
    """Every attempt (current and superseded) of the runs asked for, newest night first and oldest attempt first
    per (run, host, case), each with `current` (True for the one benchmark_results holds), for a superseded one
    `superseded_at`, `superseded_by` and `superseded_why`, and the host check it ran under: `host_verdict`,
    `host_driver_version`, ... (HOST_CHECK_FIELDS) and `host_checked_at`, None where that check is not
    kept (attempts superseded before revision 0013, rows written without a check). `since`, `until` and `host`
    narrow them as `fleetbench.warehouse.read.iter_results` does."""
    window = {"since": since, "until": until, "host": host}
    with engine.connect() as conn:
        past = [dict(r._mapping) for r in conn.execute(attempts_query(superseded_results, run_id, dag_id, **window))]
        current = [dict(r._mapping) for r in conn.execute(attempts_query(benchmark_results, run_id, dag_id,
                                                                         **window))]
        checks = _host_checks(conn, run_id, dag_id)
    rows = []
    for r in past:
        r.pop("id", None)
        collected = utc(r.pop("host_collected_at"))  # popped before r is copied: a current row has no such key
        rows.append({**r, "current": False, **_check_fields(checks.get((r["dag_id"], r["run_id"], r["host"]), {})
                                                            .get(collected))})
    for r in current:
        r.pop("id", None)
        check = checks.get((r["dag_id"], r["run_id"], r["host"]), {}).get("current")
        rows.append({**r, "current": True, "steps_json": None, "metrics_json": None, "superseded_at": None,
                     "superseded_by": None, "superseded_why": None, **_check_fields(check)})
    iso_timestamps(rows)  # as fetch_results gives them
    # newest night first, as fetch_results lists them (`results --all --attempts | head` shows the newest nights);
    # within a (run, host, case), its attempts oldest first
    rows.sort(key=lambda r: (r["dag_id"], r["run_id"], r["host"], r["case_key"], r["attempt"] or 0))
    rows.sort(key=lambda r: r["logical_date"] or "", reverse=True)
    return rows


def _host_checks(conn, run_id: str | None, dag_id: str | None) -> dict[tuple, dict]:
    """(dag_id, run_id, host) -> {collected_at: its check's row, "current": the stored check}: the checks in
    host_facts and those kept in superseded_host_facts (the latest kept of one collected_at)."""
    out: dict[tuple, dict] = {}
    for table in (superseded_host_facts, host_facts):  # host_facts last: the stored check wins
        # what the attempts show, not the facts' JSON (a store of every check ever made is large)
        query = select(*[table.c[c] for c in ("dag_id", "run_id", "host", "collected_at", *HOST_CHECK_FIELDS)])
        if run_id:
            query = query.where(table.c.run_id == run_id)
        if dag_id:
            query = query.where(table.c.dag_id == dag_id)
        order = [table.c.superseded_at] if table is superseded_host_facts else []
        for r in conn.execute(query.order_by(*order)):
            m = dict(r._mapping)
            by_check = out.setdefault((m["dag_id"], m["run_id"], m["host"]), {})
            if m["collected_at"] is not None:
                by_check[utc(m["collected_at"])] = m
            if table is host_facts:
                by_check["current"] = m
    return out


def _check_fields(check: Mapping[str, Any] | None) -> dict:
    out = {f"host_{f}": (check or {}).get(f) for f in HOST_CHECK_FIELDS}
    out["host_checked_at"] = utc(check["collected_at"]).isoformat() if check and check["collected_at"] else None
    return out
