"""/fleetbench/metrics scraped by a real Prometheus (Debian's package, `scripts/ensure-prometheus.sh`).

A real `airflow api-server` with the plugin (SimpleAuthManager in multi-team mode, as in
test_report_browser.py) over a PostgreSQL warehouse with five nights of fleet_benchmark and a night of
a DAG the viewer may not read; our own Prometheus on a free loopback port, with a temporary config and
data folder, scrapes the endpoint with the viewer's bearer token every second; the values come back
through Prometheus' HTTP API and are compared with the warehouse's rows. promtool checks the exposition.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
from test_report_browser import ApiServer

from airflow_cluster import LocalService, free_port
from browser.fleet_history import DAG, NIGHTS, run_id, store_history
from browser.private_history import DAG as PRIVATE_DAG
from browser.private_history import store_private_history

pytestmark = [pytest.mark.integration]

PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")
VERDICTS = {"gpu-a": "degraded", "gpu-b": "ready", "gpu-c": "unfit"}  # the newest night's host checks


@pytest.fixture(scope="module")
def binaries():
    if PROMETHEUS and PROMTOOL:
        return
    if os.environ.get("CI"):
        pytest.fail("prometheus/promtool missing: `bash scripts/ensure-prometheus.sh` (make test-services) installs "
                    "Debian's prometheus package")
    pytest.skip("Debian's prometheus package is not installed (bash scripts/ensure-prometheus.sh)")


@pytest.fixture(scope="module")
def warehouse(pg_url, binaries):
    from fleetbench.warehouse import get_engine, store_run
    from pg_databases import fresh_database

    with fresh_database(pg_url, prefix="fb_prom") as url:
        engine = get_engine(url)
        store_history(engine)
        store_private_history(engine)
        night = 4
        with engine.connect() as conn:
            run = dict(conn.exec_driver_sql("SELECT * FROM runs WHERE run_id = %(r)s AND dag_id = %(d)s",
                                            {"r": run_id(night), "d": DAG}).mappings().one())
        hosts = [{"dag_id": DAG, "run_id": run_id(night), "host": h, "verdict": v,
                  "collected_at": NIGHTS[night] + timedelta(seconds=30)} for h, v in VERDICTS.items()]
        store_run(engine, run, hosts, [], complete=False)
        yield url, engine
        engine.dispose()


class Prometheus(LocalService):
    """`prometheus` on 127.0.0.1:<free port>, its config and TSDB in `home`, scraping `target` every second."""

    log_name = "prometheus.log"

    def __init__(self, home: Path, target: str, token_file: Path):
        self.home, self.port = home, free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        job = {"metrics_path": "/fleetbench/metrics", "static_configs": [{"targets": [target]}],
               "scrape_interval": "1s", "scrape_timeout": "1s"}
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": [
            {"job_name": "fleetbench", **job, "authorization": {"type": "Bearer", "credentials_file": str(token_file)}},
            {"job_name": "fleetbench_anonymous", **job}]}
        (home / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML

    def __enter__(self) -> "Prometheus":
        return self._start([PROMETHEUS, f"--config.file={self.home / 'prometheus.yml'}",
                            f"--storage.tsdb.path={self.home / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}"],
                           f"{self.base}/-/ready", 60)

    def query(self, promql: str) -> list[dict]:
        """An instant query through the HTTP API: [{"metric": labels, "value": float}]."""
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        return [{"metric": r["metric"], "value": float(r["value"][1])} for r in body["data"]["result"]]

    def targets(self) -> dict[str, dict]:
        with urllib.request.urlopen(f"{self.base}/api/v1/targets", timeout=10) as resp:
            return {t["labels"]["job"]: t for t in json.load(resp)["data"]["activeTargets"]}

    def wait_scraped(self, timeout: float = 60) -> None:
        """Until both jobs have been scraped once (health up or down, not unknown)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            targets = self.targets()
            if len(targets) == 2 and all(t["health"] != "unknown" for t in targets.values()) and \
                    self.query('fleetbench_images_per_second{job="fleetbench"}'):
                return
            time.sleep(1)
        raise TimeoutError(f"not scraped in {timeout} s: {self.targets()}\n{self.log()}")


@pytest.fixture(scope="module")
def scraped(warehouse, tmp_path_factory):
    url, engine = warehouse
    with ApiServer(tmp_path_factory.mktemp("api-server"), url) as server:
        token_file = tmp_path_factory.mktemp("secrets") / "fleetbench.token"
        token_file.write_text(server.token("viewer"))
        token_file.chmod(0o600)
        with Prometheus(tmp_path_factory.mktemp("prometheus"), f"127.0.0.1:{server.port}", token_file) as prom:
            prom.wait_scraped()
            yield server, prom, engine


def newest_ok(engine) -> dict[tuple[str, str], dict]:
    from fleetbench.warehouse import fetch_results

    out = {}
    for r in sorted(fetch_results(engine), key=lambda r: r["logical_date"]):
        if r["status"] == "ok" and r["dag_id"] == DAG:
            out[(r["host"], r["case_key"])] = r
    return out


def test_prometheus_scrapes_the_viewers_metrics(scraped):
    server, prom, engine = scraped
    targets = prom.targets()
    assert targets["fleetbench"]["health"] == "up", targets["fleetbench"]["lastError"]
    # without the token the api-server refuses the scrape: the same auth as the view
    assert targets["fleetbench_anonymous"]["health"] == "down"
    assert "401" in targets["fleetbench_anonymous"]["lastError"]

    got = {(r["metric"]["host"], r["metric"]["case_key"]): r["value"]
           for r in prom.query('fleetbench_images_per_second{job="fleetbench"}')}
    assert got == {k: pytest.approx(r["images_per_sec"]) for k, r in newest_ok(engine).items()}
    assert {r["metric"]["dag_id"] for r in prom.query('{job="fleetbench", dag_id!=""}')} == {DAG}  # not PRIVATE_DAG

    majors = prom.query('fleetbench_open_regressions{job="fleetbench", severity="major"} > 0')
    assert [(r["metric"]["host"], r["value"]) for r in majors] == [("gpu-a", 1.0)]
    current = prom.query('fleetbench_host_verdict{job="fleetbench"} == 1')
    assert {r["metric"]["host"]: r["metric"]["verdict"] for r in current} == VERDICTS
    (age,) = prom.query('fleetbench_last_run_age_seconds{job="fleetbench"}')
    finished = (NIGHTS[4] + timedelta(minutes=30)).timestamp()
    assert age["metric"]["dag_id"] == DAG and age["value"] == pytest.approx(time.time() - finished, abs=120)
    (since,) = prom.query('time() - fleetbench_last_run_timestamp_seconds{job="fleetbench"}')
    assert since["value"] == pytest.approx(age["value"], abs=120)


def test_the_exposition_passes_promtool(scraped):
    server, _, _ = scraped
    status, body = server.get("/fleetbench/metrics", server.token("viewer"))
    assert status == 200 and body.endswith("# EOF\n")
    proc = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert PRIVATE_DAG not in body
