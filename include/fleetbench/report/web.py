"""The fleetbench view: a small FastAPI app that shows the report's tables and plots from the warehouse,
with filters, through the same `build_report` as `fleetbench report`.

    GET /                the page (HTML, self-contained; a filter form on top)
    GET /report.json     the same data as JSON
    GET /throughput.csv  the throughput plots' points as CSV (`fleetbench.report.render.render_csv`)
    GET /metrics         OpenMetrics for Prometheus (`fleetbench.report.openmetrics`); takes no parameters

Query parameters (all routes): `host`, `model` (names as in the fleet config), `dag_id`, `since`,
`until` (ISO dates or date-times; see `fleetbench.report.queries`). They are checked strictly: an
unknown parameter, one given twice, or a bad value answers 400 with a message naming it; a warehouse
that cannot be read answers 503 with a message that names the problem only (its address, port and user,
and the driver's message, go to the server's log, password redacted). Empty values mean "all" (what
the form sends).

`plugins/fleetbench_plugin.py` mounts `airflow_app()` in the Airflow api-server under `/fleetbench`
and links it from the UI's Browse menu. There every request must come from an Airflow user who may
read DAG runs (the results are theirs), as Airflow's own API checks it for the runs of all DAGs:
`get_user` (session cookie or bearer token), then the auth manager's `is_authorized_dag` (of `dag_id`
and its team when the view is filtered to one). Every route then shows only the results of the DAGs
the auth manager's `get_authorized_dag_ids` lists for that user (`Filters.dag_ids`): the drop-downs,
the tables, the plots, the JSON and the CSV alike. A DAG that Airflow does not know (deleted, or
from another deployment) is readable by nobody. `create_app()` without `readable_dags` serves every
DAG's results without Airflow (tests, a local look).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Callable

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from fleetbench.report.queries import FILTER_FIELDS, FilterError, Filters, build_report, parse_filters

log = logging.getLogger(__name__)

TITLE = "fleetbench results"
MAX_PARAM_LEN = 250
UNREACHABLE = "The warehouse is not reachable: the results cannot be read now. The api-server's log has the details."
UNREADABLE = "The warehouse could not be read: the results cannot be shown now. The api-server's log has the details."
MISCONFIGURED = ("The warehouse's URL is not valid (FLEETBENCH_WAREHOUSE_READ_URL or FLEETBENCH_WAREHOUSE_URL): the "
                 "results cannot be read. The api-server's log has the details.")


def filters_from(request: Request) -> tuple[Filters, dict[str, str]]:
    """The request's filters and their raw values; FilterError for anything not allowed."""
    params = request.query_params
    for key in params.keys():
        if key not in FILTER_FIELDS:
            raise FilterError(key, f"unknown parameter (allowed: {', '.join(FILTER_FIELDS)})")
        if len(params.getlist(key)) > 1:
            raise FilterError(key, "given more than once")
        if len(params[key]) > MAX_PARAM_LEN:
            raise FilterError(key, f"longer than {MAX_PARAM_LEN} characters")
    values = {k: params[k] for k in FILTER_FIELDS if k in params}
    return parse_filters(**values), values


def every_dag() -> None:
    """`readable_dags` without Airflow: no restriction."""
    return None


def warehouse_error(engine, exc: Exception) -> HTTPException:
    """The 503 for a warehouse that failed: a message without its address or user for the page; the details,
    password redacted (in the URL and wherever the driver's message repeats it), in the log."""
    from sqlalchemy.exc import DBAPIError, OperationalError

    from fleetbench.warehouse import redact, warehouse_display_url

    log.warning("fleetbench view: reading the warehouse at %s failed: %s", warehouse_display_url(engine.url),
                redact(str(exc), engine.url))
    unreachable = isinstance(exc, OperationalError) or (isinstance(exc, DBAPIError) and exc.connection_invalidated)
    return HTTPException(503, UNREACHABLE if unreachable else UNREADABLE)


def create_app(engine_factory: Callable | None = None, readable_dags: Callable = every_dag) -> FastAPI:
    """The view as a FastAPI app. `engine_factory` makes the warehouse engine on first use (default
    `fleetbench.warehouse.get_engine` on `warehouse_read_url()`: `FLEETBENCH_WAREHOUSE_READ_URL`, a role that may
    only read, when set, else `FLEETBENCH_WAREHOUSE_URL`). `readable_dags`, a FastAPI
    dependency of every route, authorizes the request (raising HTTPException to refuse it) and returns the
    DAG ids whose results it may see, or None for all."""
    from sqlalchemy.exc import SQLAlchemyError

    from fleetbench.report.plots import charts
    from fleetbench.report.queries import blank_report
    from fleetbench.report.render import render_csv, render_html

    app = FastAPI(title=TITLE, docs_url=None, redoc_url=None, openapi_url=None)
    lock = threading.Lock()
    state: dict = {}

    def engine():
        with lock:
            if "engine" not in state:
                if engine_factory is None:
                    import os

                    from fleetbench.warehouse import (
                        WarehouseURLError,
                        existing_engine,
                        get_engine,
                        warehouse_read_url,
                    )

                    # a SQLite file a URL setting names that is not there is refused, not created empty (a mistyped
                    # path); the default one, under the data folder, is the warehouse before its first run
                    settings = ("FLEETBENCH_WAREHOUSE_READ_URL", "FLEETBENCH_WAREHOUSE_URL")
                    given = any(os.environ.get(v) for v in settings)
                    try:
                        state["engine"] = (existing_engine if given else get_engine)(warehouse_read_url())
                    except WarehouseURLError as exc:  # the message names no password
                        log.warning("fleetbench view: %s", exc)
                        raise HTTPException(503, MISCONFIGURED) from None
                else:
                    state["engine"] = engine_factory()
            return state["engine"]

    def read(f: Filters, dag_ids: frozenset[str] | None) -> dict:
        """The report of the readable DAGs; the page names the warehouse's kind only."""
        from fleetbench.capacity import configured_settings

        eng = engine()
        capacity_settings, why = configured_settings()  # the fleet's fleet.capacity, as the DAG's report uses
        if why:
            log.warning("fleetbench view: %s", why)
        try:
            report = build_report(eng, dataclasses.replace(f, dag_ids=dag_ids), capacity_settings=capacity_settings)
        except SQLAlchemyError as exc:
            raise warehouse_error(eng, exc) from None
        report["warehouse"] = f"the {eng.url.get_backend_name()} warehouse"
        return report

    # Plain `def` routes: FastAPI runs them in its thread pool, so a slow query never blocks the
    # api-server's event loop.
    @app.get("/", response_class=HTMLResponse)
    def page(request: Request, dag_ids: frozenset[str] | None = Depends(readable_dags)) -> HTMLResponse:
        try:
            f, values = filters_from(request)
        except FilterError as exc:
            raw = {k: v for k, v in request.query_params.items() if k in FILTER_FIELDS}
            return HTMLResponse(render_html(blank_report(), [], form_values=raw, error=f"Bad filter: {exc}",
                                            title=TITLE), status_code=400)
        try:
            report = read(f, dag_ids)
        except HTTPException as exc:
            return HTMLResponse(render_html(blank_report(f), [], form_values=values, error=exc.detail, title=TITLE),
                                status_code=exc.status_code)
        return HTMLResponse(render_html(report, charts(report), form_values=values, title=TITLE))

    @app.get("/report.json")
    def report_json(request: Request, dag_ids: frozenset[str] | None = Depends(readable_dags)) -> JSONResponse:
        try:
            f, _ = filters_from(request)
        except FilterError as exc:
            return JSONResponse({"detail": f"bad filter: {exc}", "field": exc.field}, status_code=400)
        return JSONResponse(read(f, dag_ids))

    @app.get("/throughput.csv")
    def throughput_csv(request: Request, dag_ids: frozenset[str] | None = Depends(readable_dags)) -> Response:
        try:
            f, _ = filters_from(request)
        except FilterError as exc:
            return JSONResponse({"detail": f"bad filter: {exc}", "field": exc.field}, status_code=400)
        return Response(render_csv(read(f, dag_ids)), media_type="text/csv; charset=utf-8",
                        headers={"Content-Disposition": 'attachment; filename="fleetbench-throughput.csv"',
                                 "X-Content-Type-Options": "nosniff"})

    @app.get("/metrics")
    def metrics(request: Request, dag_ids: frozenset[str] | None = Depends(readable_dags)) -> Response:
        from fleetbench.report import openmetrics

        if request.query_params:
            key = next(iter(request.query_params.keys()))
            return JSONResponse({"detail": f"bad filter: {key}: /metrics takes no parameters", "field": key},
                                status_code=400)
        from fleetbench.warehouse import SchemaBehind

        eng = engine()
        try:
            families = openmetrics.collect(eng, Filters(dag_ids=dag_ids))
        except SchemaBehind as exc:
            raise HTTPException(503, str(exc)) from None
        except SQLAlchemyError as exc:
            raise warehouse_error(eng, exc) from None
        return Response(openmetrics.render(families), media_type=openmetrics.CONTENT_TYPE)

    return app


_bearer = HTTPBearer(auto_error=False)


async def airflow_readable_dags(request: Request,
                                credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> frozenset[str]:
    """The DAG ids whose results the caller may see: an Airflow user allowed to read DAG runs (of `dag_id` when
    the view is filtered to one; else 403), and of them the DAGs the auth manager lets that user read.

    The same checks as Airflow's own list of DAG runs (`requires_access_dag("GET", DagAccessEntity.RUN)` and
    `ReadableDagRunsFilterDep`). Airflow's security module is imported on the first request, not when the
    plugin is loaded: plugins are imported by every Airflow process, and that import is slow.
    """
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
    from airflow.api_fastapi.core_api.security import get_user
    from airflow.models.dag import DagModel
    from starlette.concurrency import run_in_threadpool

    user = await get_user(request, None, credentials)
    dag_id = request.query_params.get("dag_id") or None

    def authorize() -> frozenset[str] | None:
        manager = get_auth_manager()
        details = DagDetails(id=dag_id, team_name=DagModel.get_team_name(dag_id) if dag_id else None)
        if not manager.is_authorized_dag(method="GET", access_entity=DagAccessEntity.RUN, details=details, user=user):
            return None
        return frozenset(manager.get_authorized_dag_ids(user=user, method="GET"))

    dag_ids = await run_in_threadpool(authorize)
    if dag_ids is None:
        raise HTTPException(403, "Forbidden: the fleetbench view needs read access to DAG runs")
    return dag_ids


def airflow_app() -> FastAPI:
    """The view as the Airflow plugin serves it: an Airflow user who may read DAG runs, shown their DAGs' results."""
    return create_app(readable_dags=airflow_readable_dags)
