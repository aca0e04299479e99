"""The fleetbench view: a small FastAPI app that shows the report's tables and plots from the warehouse,
with filters, through the same `build_report` as `fleetbench report`.

    GET /             the page (HTML, self-contained; a filter form on top)
    GET /report.json  the same data as JSON

Query parameters (both routes): `host`, `model` (names as in the fleet config), `dag_id`, `since`,
`until` (ISO dates or date-times; see `fleetbench.report.queries`). They are checked strictly: an
unknown parameter, one given twice, or a bad value answers 400 with a message naming it; a warehouse
that cannot be read answers 503. Empty values mean "all" (what the form sends).

`plugins/fleetbench_plugin.py` mounts `airflow_app()` in the Airflow api-server under `/fleetbench`
and links it from the UI's Browse menu. There every request must come from an Airflow user who may
read DAG runs (the results are theirs): Airflow's own `get_user` (session cookie or bearer token)
and the auth manager's `is_authorized_dag`. `create_app()` without dependencies serves the same
pages without Airflow (tests, a local look).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Sequence

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from fleetbench.report.queries import FILTER_FIELDS, FilterError, Filters, build_report, parse_filters

log = logging.getLogger(__name__)

TITLE = "fleetbench results"
MAX_PARAM_LEN = 250


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


def create_app(engine_factory: Callable | None = None, dependencies: Sequence = ()) -> FastAPI:
    """The view as a FastAPI app. `engine_factory` makes the warehouse engine on first use (default
    `fleetbench.warehouse.get_engine`, i.e. `FLEETBENCH_WAREHOUSE_URL`); `dependencies` guard every route."""
    from sqlalchemy.exc import SQLAlchemyError

    from fleetbench.report.plots import charts
    from fleetbench.report.queries import blank_report
    from fleetbench.report.render import render_html

    app = FastAPI(title=TITLE, docs_url=None, redoc_url=None, openapi_url=None, dependencies=list(dependencies))
    lock = threading.Lock()
    state: dict = {}

    def engine():
        with lock:
            if "engine" not in state:
                if engine_factory is None:
                    from fleetbench.warehouse import get_engine

                    state["engine"] = get_engine()
                else:
                    state["engine"] = engine_factory()
            return state["engine"]

    def read(f: Filters) -> dict:
        """The report; the page names the warehouse's kind only (its address and user stay on the server)."""
        eng = engine()
        try:
            report = build_report(eng, f)
        except SQLAlchemyError as exc:
            log.warning("fleetbench view: reading the warehouse at %s failed: %s",
                        eng.url.render_as_string(hide_password=True), exc)
            raise HTTPException(503, f"cannot read the warehouse ({eng.url.get_backend_name()}): "
                                     f"{str(exc).splitlines()[0]}") from None
        report["warehouse"] = f"the {eng.url.get_backend_name()} warehouse"
        return report

    # Plain `def` routes: FastAPI runs them in its thread pool, so a slow query never blocks the
    # api-server's event loop.
    @app.get("/", response_class=HTMLResponse)
    def page(request: Request) -> HTMLResponse:
        try:
            f, values = filters_from(request)
        except FilterError as exc:
            raw = {k: v for k, v in request.query_params.items() if k in FILTER_FIELDS}
            return HTMLResponse(render_html(blank_report(), [], form_values=raw, error=f"Bad filter: {exc}", title=TITLE),
                                status_code=400)
        try:
            report = read(f)
        except HTTPException as exc:
            return HTMLResponse(render_html(blank_report(f), [], form_values=values, error=exc.detail, title=TITLE),
                                status_code=exc.status_code)
        return HTMLResponse(render_html(report, charts(report), form_values=values, title=TITLE))

    @app.get("/report.json")
    def report_json(request: Request) -> JSONResponse:
        try:
            f, _ = filters_from(request)
        except FilterError as exc:
            return JSONResponse({"detail": f"bad filter: {exc}", "field": exc.field}, status_code=400)
        return JSONResponse(read(f))

    return app


_bearer = HTTPBearer(auto_error=False)


async def require_airflow_reader(request: Request,
                                 credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
    """The caller must be an Airflow user allowed to read DAG runs (of `dag_id` when the view is filtered to one).

    Airflow's security module is imported on the first request, not when the plugin is loaded: plugins are
    imported by every Airflow process, and that import is slow.
    """
    from starlette.concurrency import run_in_threadpool

    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
    from airflow.api_fastapi.core_api.security import get_user

    user = await get_user(request, None, credentials)
    dag_id = request.query_params.get("dag_id") or None
    allowed = await run_in_threadpool(lambda: get_auth_manager().is_authorized_dag(
        method="GET", access_entity=DagAccessEntity.RUN, details=DagDetails(id=dag_id) if dag_id else None, user=user))
    if not allowed:
        raise HTTPException(403, "Forbidden: the fleetbench view needs read access to DAG runs")


def airflow_app() -> FastAPI:
    """The view as the Airflow plugin serves it: every route needs an Airflow user who may read DAG runs."""
    return create_app(dependencies=[Depends(require_airflow_reader)])
