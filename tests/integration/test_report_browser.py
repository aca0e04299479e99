"""The report in a real browser: the fleetbench view inside a real Airflow api-server (plugin loaded,
SimpleAuthManager with a real login) over a PostgreSQL warehouse, opened in Debian's headless
Chromium through playwright-core (tests/browser/check_page.mjs); the HTML file report; and the
report the fleet DAG writes after a run, with its asset event.

The warehouse holds the results of two DAGs, `fleet_benchmark` and `private_benchmark`; the api-server
runs in multi-team mode with each DAG in a bundle of its own team, and its `viewer` may read only
`fleet_benchmark`: every number the view shows it is fleet_benchmark's.

Screenshots are kept in tests/artifacts/ (gitignored) and their paths printed (`pytest -s` shows them).
Needs: chromium and the npm packages of tests/browser (`bash scripts/ensure-browser.sh`, run by `make test`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from airflow_cluster import LocalService, free_port
from browser.fleet_history import DAG as FLEET_DAG
from browser.fleet_history import NEW_DRIVER, OLD_DRIVER, store_history
from browser.metric_history import BUSBW, LATENCY, NIGHTS, TOKENS, busbw, latency, store_metric_history
from browser.private_history import DAG as PRIVATE_DAG
from browser.private_history import HOST as PRIVATE_HOST
from browser.private_history import MODEL as PRIVATE_MODEL
from browser.private_history import secrets_in, store_private_history

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
BROWSER_DIR = ROOT / "tests" / "browser"
CHECK = BROWSER_DIR / "check_page.mjs"
ARTIFACTS = ROOT / "tests" / "artifacts"
AIRFLOW = str(Path(sys.executable).parent / "airflow")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


# -- the browser ---------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def browser() -> None:
    missing = [what for what, ok in (("node", shutil.which("node")), (CHROMIUM, Path(CHROMIUM).exists()),
                                     ("tests/browser/node_modules/playwright-core",
                                      (BROWSER_DIR / "node_modules" / "playwright-core").is_dir())) if not ok]
    if missing:
        pytest.fail(f"missing for the browser tests: {', '.join(missing)}; run `bash scripts/ensure-browser.sh` "
                    "(`make test` does)")


def open_page(url: str, screenshot: str, *args: str) -> dict:
    """Open `url` in headless Chromium; returns what check_page.mjs saw (tables, plots, requests)."""
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / screenshot
    shot.unlink(missing_ok=True)
    proc = subprocess.run(["node", str(CHECK), url, str(shot), *args], cwd=BROWSER_DIR, capture_output=True,
                          text=True, timeout=180, env={**os.environ, "CHROMIUM": CHROMIUM})
    lines = proc.stdout.strip().splitlines()
    assert lines, f"check_page.mjs printed nothing (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    seen = json.loads(lines[-1])
    assert proc.returncode == 0, f"{seen.get('failure')}\n{proc.stderr[-3000:]}"
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")
    return seen


def cells(seen: dict, table: str, key: str, value: str) -> dict:
    """{row[key].text: row[value]} of a table the browser extracted."""
    return {r[key]["text"]: r[value] for r in seen["tables"][table]["rows"]}


# -- a PostgreSQL warehouse with five nights of history ---------------------------------------------------
@pytest.fixture(scope="module")
def pg_warehouse(pg_url):

    from fleetbench.warehouse import get_engine
    from pg_databases import fresh_database

    with fresh_database(pg_url, prefix="fb_report") as url:
        engine = get_engine(url)
        store_history(engine)
        store_private_history(engine)
        yield url, engine
        engine.dispose()


def expected_throughput(engine, dag_id: str | None = None) -> dict[tuple[str, str], list[dict]]:
    """The warehouse's ok rows (of `dag_id`, else of every DAG) per (host, case_key), oldest night first."""
    from fleetbench.warehouse import fetch_results

    out: dict[tuple[str, str], list[dict]] = {}
    for r in sorted(fetch_results(engine), key=lambda r: r["logical_date"]):
        if r["status"] == "ok" and dag_id in (None, r["dag_id"]):
            out.setdefault((r["host"], r["case_key"]), []).append(r)
    return out


# -- a real Airflow api-server with the plugin ----------------------------------------------------------------
# Multi-team mode: a bundle per team, each with one DAG (only its id matters: the auth manager reads who may
# read a DAG from its bundle's team). `viewer` may read fleet_benchmark only, `lead` both DAGs.
TEAM_DAGS = {"fleet": FLEET_DAG, "private": PRIVATE_DAG}
USERS = "viewer:viewer:fleet,lead:viewer:fleet|private"
DAG_FILE = """from airflow.sdk import dag


@dag(dag_id={dag_id!r}, schedule=None)
def benchmark():
    pass


benchmark()
"""


class ApiServer(LocalService):
    """`airflow api-server` on 127.0.0.1 with this project's plugins folder, a SQLite metadata DB of its own
    and SimpleAuthManager in multi-team mode with the `USERS` (a real login: no all-admins shortcut); the DAGs
    of `TEAM_DAGS` serialized into the metadata DB, each in its team's bundle."""

    log_name = "api-server.log"

    def __init__(self, home: Path, warehouse_url: str):
        self.home = home
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"}
        self.env = {
            **env,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__AUTH_MANAGER":
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": USERS,
            "AIRFLOW__CORE__MULTI_TEAM": "True",
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps([
                {"name": team, "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                 "kwargs": {"path": str(home / "bundles" / team)}, "team_name": team} for team in TEAM_DAGS]),
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "FLEETBENCH_WAREHOUSE_URL": warehouse_url,
        }

    def __enter__(self) -> "ApiServer":
        self.home.mkdir(parents=True, exist_ok=True)
        self.cli("db", "migrate")
        for team, dag_id in TEAM_DAGS.items():
            (self.home / "bundles" / team).mkdir(parents=True, exist_ok=True)
            (self.home / "bundles" / team / f"{dag_id}.py").write_text(DAG_FILE.format(dag_id=dag_id))
            self.cli("teams", "create", team)
        self.cli("dags", "reserialize")
        return self._start([AIRFLOW, "api-server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
                           f"{self.base}/api/v2/monitor/health", 180, env=self.env)

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([AIRFLOW, *args], env=self.env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"airflow {' '.join(args)}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        return proc

    def token(self, user: str = "viewer") -> str:
        """Log in as `user` (SimpleAuthManager wrote its password into AIRFLOW_HOME) and return the JWT."""
        password = json.loads((self.home / "simple_auth_manager_passwords.json.generated").read_text())[user]
        req = urllib.request.Request(f"{self.base}/auth/token", method="POST",
                                     data=json.dumps({"username": user, "password": password}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.load(resp)["access_token"]

    def get(self, path: str, token: str | None = None) -> tuple[int, str]:
        req = urllib.request.Request(self.base + path, headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


@pytest.fixture(scope="module")
def airflow_ui(pg_warehouse, tmp_path_factory):
    url, _ = pg_warehouse
    with ApiServer(tmp_path_factory.mktemp("api-server"), url) as server:
        server.jwt = server.token()
        yield server


# -- tests ----------------------------------------------------------------------------------------------------
def test_airflow_loads_the_plugin(airflow_ui):
    plugins = json.loads(airflow_ui.cli("plugins", "--output", "json").stdout)
    ours = [p for p in plugins if p["name"] == "fleetbench"]
    assert ours and "fleetbench_plugin.py" in ours[0]["source"]
    status, body = airflow_ui.get("/api/v2/plugins", airflow_ui.jwt)
    assert status == 200
    listed = next(p for p in json.loads(body)["plugins"] if p["name"] == "fleetbench")
    assert listed["fastapi_apps"][0]["url_prefix"] == "/fleetbench"
    assert (listed["external_views"][0]["href"] == "/fleetbench/"
            and listed["external_views"][0]["url_route"] == "fleetbench")


def test_view_needs_an_airflow_user(airflow_ui):
    assert airflow_ui.get("/fleetbench/")[0] == 401
    assert airflow_ui.get("/fleetbench/report.json", "not-a-jwt")[0] == 403
    status, body = airflow_ui.get("/fleetbench/report.json?host=gpu-a", airflow_ui.jwt)
    assert status == 200 and json.loads(body)["summary"]["hosts"] == 1
    status, body = airflow_ui.get("/fleetbench/report.json?since=last-week", airflow_ui.jwt)
    assert status == 400 and json.loads(body)["detail"].startswith("bad filter: since: expected an ISO date")


def test_view_shows_a_reader_only_the_dags_they_may_read(airflow_ui):
    """The auth manager's readable DAGs decide: drop-downs, sections, plots, JSON and CSV of `viewer` hold nothing of
    private_benchmark (its team's bundle); `lead`, in both teams, sees both DAGs."""
    status, body = airflow_ui.get("/fleetbench/report.json", airflow_ui.jwt)
    assert status == 200 and secrets_in(body) == []
    data = json.loads(body)
    assert data["options"] == {"hosts": ["gpu-a", "gpu-b", "gpu-c"], "models": ["resnet50", "vgg16"],
                               "dag_ids": [FLEET_DAG]}
    assert data["summary"]["runs"] == 5 and data["latest_run"]["dag_id"] == FLEET_DAG
    assert {r["dag_id"] for r in data["regressions"]} == {FLEET_DAG}
    for path in ("/fleetbench/", "/fleetbench/throughput.csv", "/fleetbench/?host=gpu-a",
                 "/fleetbench/throughput.csv?host=gpu-a&model=resnet50"):
        status, body = airflow_ui.get(path, airflow_ui.jwt)
        assert status == 200 and secrets_in(body) == [], path
    status, body = airflow_ui.get("/fleetbench/throughput.csv", airflow_ui.jwt)
    assert body.startswith("model,host,case_key,") and f",{FLEET_DAG}," in body
    # the other team's DAG by name: refused, as Airflow refuses its runs
    for path in (f"/fleetbench/report.json?dag_id={PRIVATE_DAG}", f"/fleetbench/throughput.csv?dag_id={PRIVATE_DAG}"):
        status, body = airflow_ui.get(path, airflow_ui.jwt)
        assert status == 403 and secrets_in(body) == [], path
    assert airflow_ui.get(f"/api/v2/dags/{PRIVATE_DAG}/dagRuns", airflow_ui.jwt)[0] == 403
    # a member of both teams sees both DAGs
    lead = airflow_ui.token("lead")
    status, body = airflow_ui.get("/fleetbench/report.json", lead)
    data = json.loads(body)
    assert status == 200 and data["options"]["dag_ids"] == sorted([FLEET_DAG, PRIVATE_DAG])
    assert PRIVATE_HOST in data["options"]["hosts"] and PRIVATE_MODEL in data["options"]["models"]
    status, body = airflow_ui.get(f"/fleetbench/throughput.csv?dag_id={PRIVATE_DAG}", lead)
    assert status == 200 and f",{PRIVATE_HOST}," in body


def test_view_inside_the_airflow_ui_shows_the_warehouse(browser, airflow_ui, pg_warehouse):
    """Airflow's React UI at /plugin/fleetbench frames the view; its tables and plots carry the warehouse's numbers."""
    _, engine = pg_warehouse
    seen = open_page(f"{airflow_ui.base}/plugin/fleetbench", "report-view-airflow-ui.png", "--frame", "/fleetbench",
                     "--cookie", f"_token={airflow_ui.jwt}", "--wait", "table#throughput-table",
                     "--wait", "svg#plot-throughput-resnet50_g1 circle.point")
    assert seen["status"] == 200 and seen["frame_src"] == "/fleetbench/" and seen["state"] == "ok"
    assert secrets_in(json.dumps(seen, ensure_ascii=False)) == []  # nothing of the DAG viewer may not read
    expected = expected_throughput(engine, FLEET_DAG)
    # the table: every host and case with its newest and previous ok images/sec, as the warehouse has them
    rows = {(r["host"]["text"], r["case_key"]["text"]): r for r in seen["tables"]["throughput-table"]["rows"]}
    assert set(rows) == set(expected)
    for key, results in expected.items():
        assert rows[key]["latest"]["value"] == results[-1]["images_per_sec"]
        assert rows[key]["latest"]["text"] == f"{results[-1]['images_per_sec']:,.2f}"
        assert rows[key]["previous"]["value"] == results[-2]["images_per_sec"]
        assert rows[key]["latest_driver"]["text"] == results[-1]["driver_version"]
    # the plots: one per GPU count, one series per host and case with every night's value, the upgrade marked
    plots = {k: p for k, p in seen["plots"].items() if k.startswith("plot-throughput-resnet50_g")}
    assert sorted(plots) == [f"plot-throughput-resnet50_g{g}" for g in (1, 2, 4)]
    assert all(p["visible"] and p["kind"] == "line" for p in plots.values())
    assert {s["label"]: s["values"] for p in plots.values() for s in p["series"]} == {
        f"{h} · {c}": [r["images_per_sec"] for r in results] for (h, c), results in expected.items()
        if results[0]["model"] == "resnet50"}
    for key, plot in plots.items():
        assert all(f".g{key.rsplit('_g', 1)[1]}." in s["label"] for s in plot["series"])
        assert plot["markers"] == [f"gpu-a: driver {OLD_DRIVER} → {NEW_DRIVER}"]
    # the other sections
    assert seen["summary"] == {"runs": 5, "results": 36, "ok": 25, "failed": 11, "skipped": 0, "hosts": 3}
    assert cells(seen, "hosts-table", "host", "ok")["gpu-c"]["value"] == 0
    assert any(n.startswith("Host gpu-c has no ok result") for n in seen["notes"])
    assert {k: v["value"] for k, v in cells(seen, "failures-table", "failure_class", "count").items()} == {
        "gpu_oom": 1, "nonzero_exit": 1, "timeout": 1}
    assert list(cells(seen, "regressions-table", "case", "host")) == ["tf.resnet50.bs64.g1.replicated"]
    assert {"plot-scaling", "plot-images-per-joule", "plot-cost-per-million", "plot-failures"} <= set(seen["plots"])
    # everything came from the api-server itself
    assert [u for u in seen["requests"] if not u.startswith((airflow_ui.base, "data:", "blob:"))] == []


def test_filters_in_the_browser(browser, airflow_ui, pg_warehouse):
    _, engine = pg_warehouse
    seen = open_page(f"{airflow_ui.base}/fleetbench/?host=gpu-a&model=resnet50&since=2026-11-04&until=",
                     "report-view-filtered.png", "--cookie", f"_token={airflow_ui.jwt}",
                     "--wait", "table#throughput-table", "--wait", "svg.plot")
    assert seen["status"] == 200 and seen["state"] == "ok"
    rows = seen["tables"]["throughput-table"]["rows"]
    assert {(r["host"]["text"], r["model"]["text"]) for r in rows} == {("gpu-a", "resnet50")}
    expected = expected_throughput(engine, FLEET_DAG)
    for series in (s for k, p in seen["plots"].items() if k.startswith("plot-throughput-resnet50_g")
                   for s in p["series"]):
        host, case = series["label"].split(" · ")
        assert series["values"] == [r["images_per_sec"] for r in expected[(host, case)][-2:]]  # nights 4 and 5
        assert [x[:10] for x in series["x"]] == ["2026-11-04", "2026-11-05"]
    assert "failures-table-empty" in seen["empties"]
    bad = open_page(f"{airflow_ui.base}/fleetbench/?host=gpu-a%3Brm", "report-view-bad-filter.png",
                    "--cookie", f"_token={airflow_ui.jwt}", "--wait", "#error")
    assert bad["status"] == 400 and bad["error"].startswith("Bad filter: host: 'gpu-a;rm' is not a host name")
    nobody = open_page(f"{airflow_ui.base}/fleetbench/?host=nobody", "report-view-no-match.png",
                       "--cookie", f"_token={airflow_ui.jwt}", "--wait", "#notes")
    assert nobody["state"] == "no_match" and nobody["tables"] == {} and nobody["plots"] == {}


def test_html_report_file_in_the_browser(browser, pg_warehouse, tmp_path):
    """The file `fleetbench report` writes opens on its own: no request leaves the file."""
    from fleetbench.report import write_report

    _, engine = pg_warehouse
    written = write_report(tmp_path / "reports", engine=engine)
    seen = open_page(Path(written["html"]).as_uri(), "report-file.png", "--wait", "table#throughput-table",
                     "--wait", "svg.plot")
    assert [u for u in seen["requests"] if not u.startswith("file://")] == []
    latest = {(r["host"]["text"], r["case_key"]["text"]): r["latest"]["value"]
              for r in seen["tables"]["throughput-table"]["rows"]}
    assert latest == {k: v[-1]["images_per_sec"] for k, v in expected_throughput(engine).items()}
    # the file report has every DAG, private's model too: throughput of resnet50 on 1, 2 and 4 GPUs, vgg16 and
    # secretnet, then scaling, images per joule, cost per million and failures
    assert len(written["plots"]) == len(seen["plots"]) == 9
    assert {k for k in seen["plots"] if k.startswith("plot-throughput-")} == {
        f"plot-throughput-{m}" for m in ("resnet50_g1", "resnet50_g2", "resnet50_g4", "vgg16_g1", "secretnet_g1")}


@pytest.mark.dagrun
def test_each_primary_metric_has_its_chart_in_the_browser(browser, data_dir, tmp_path):
    """NCCL bus bandwidth, a command's latency and token rate: each its own chart, drawn with its values."""
    from fleetbench.report import write_report
    from fleetbench.warehouse import get_engine, upgrade

    engine = get_engine()
    upgrade(engine)
    store_metric_history(engine)
    written = write_report(tmp_path / "reports", engine=engine)
    engine.dispose()
    seen = open_page(Path(written["html"]).as_uri(), "report-metrics.png", "--wait", f"svg#plot-{BUSBW} circle.point")
    plots = seen["plots"]
    assert all(plots[f"plot-{c}"]["visible"] for c in (BUSBW, LATENCY, TOKENS))
    assert {s["label"]: s["values"] for s in plots[f"plot-{BUSBW}"]["series"]} == {
        f"{h} · nccl.all_reduce.g8": [busbw(h, n) for n in range(NIGHTS)] for h in ("h1", "h2")}
    assert plots[f"plot-{LATENCY}"]["title"].endswith("lower is better")
    assert [s["values"] for s in plots[f"plot-{LATENCY}"]["series"]] == [[latency(n) for n in range(NIGHTS)]]
    metrics = {r["case_key"]["text"]: r["metric_text"]["text"] for r in seen["tables"]["throughput-table"]["rows"]}
    assert metrics["nccl.all_reduce.g8"] == "avg_busbw [GB/s] ↑" and metrics["svc.latency"] == "p99_latency [ms] ↓"


def test_fleet_dag_writes_the_report_and_updates_the_asset(browser, airflow_db, data_dir, smoke_image, tmp_path,
                                                            monkeypatch):
    from fleet_configs import run_fleet_dag, smoke_config, write_config

    config = smoke_config(smoke_image, hosts=[{"name": "localhost", "connection": "local", "price_per_hour": 0.1}])
    dag_run = run_fleet_dag(monkeypatch, write_config(tmp_path / "fleet.yaml", config))
    assert dag_run.state == "success"
    report = data_dir / "reports" / "report.html"
    assert report.is_file() and (data_dir / "reports" / "report.json").is_file()
    # the DAG's plots as SVG files (the page's own drawing; PNGs are `fleetbench report`'s)
    plots = sorted(p.name for p in (data_dir / "reports").glob("plot-*"))
    assert plots and all(p.endswith(".svg") for p in plots), plots

    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        events = session.execute(select(AssetEvent.extra, AssetEvent.source_run_id, AssetEvent.source_task_id)
                                 .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
                                 .where(AssetModel.name == "fleetbench_warehouse",
                                        AssetEvent.source_run_id == dag_run.run_id)).all()
    assert len(events) == 1 and events[0].source_task_id == "report"
    assert events[0].extra["run_id"] == dag_run.run_id and events[0].extra["report"] == str(report)
    assert events[0].extra["ok"] == 4

    from fleetbench.warehouse import fetch_results, get_engine

    rows = {(r["host"], r["case_key"]): r["images_per_sec"] for r in fetch_results(get_engine(), run_id=dag_run.run_id)}
    seen = open_page(report.as_uri(), "report-after-dag-run.png", "--wait", "table#throughput-table", "--wait",
                     "svg.plot")
    assert seen["state"] == "ok" and any("Only one run so far" in n for n in seen["notes"])
    assert {(r["host"]["text"], r["case_key"]["text"]): r["latest"]["value"]
            for r in seen["tables"]["throughput-table"]["rows"]} == rows
    assert "scaling-table-empty" in seen["empties"]  # CPU cases do not scale
    # ... but they have energy (estimated where RAPL cannot be read) and cost (the host's price_per_hour)
    efficiency = seen["tables"]["efficiency-table"]["rows"]
    assert {r["gpu"]["text"] for r in efficiency} == {"none (CPU)"}, efficiency
    assert all(r["cost_per_million_images_usd"]["value"] > 0 for r in efficiency), efficiency
