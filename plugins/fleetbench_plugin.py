"""The fleetbench view in the Airflow UI: results, plots and filters from the warehouse.

Thin on purpose: the app is `fleetbench.report.web.airflow_app()` (the same queries as
`fleetbench report`). The api-server mounts it at /fleetbench; the UI lists it under Browse and
shows it in a frame at /plugin/fleetbench. Every request needs an Airflow user who may read DAG runs,
and shows only the results of the DAGs the auth manager lets that user read.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from fleetbench.report.web import airflow_app


class FleetbenchPlugin(AirflowPlugin):
    name = "fleetbench"
    fastapi_apps = [{"app": airflow_app(), "url_prefix": "/fleetbench", "name": "fleetbench results"}]
    external_views = [{
        "name": "Fleetbench results",
        "href": "/fleetbench/",
        "url_route": "fleetbench",
        "destination": "nav",
        "category": "browse",
    }]
