"""Regression mails through a real SMTP conversation: the SMTP provider's notifier and an Airflow Connection
(AIRFLOW_CONN_*) against a small SMTP server started here on 127.0.0.1; then the pipeline's compare step
and the whole fleet_benchmark DAG with a seeded history."""

from __future__ import annotations

import email
import json
import socket
import socketserver
import threading
from datetime import datetime, timedelta, timezone
from email.message import Message

import pytest

from fleet_configs import run_fleet_dag, smoke_config, write_config
from fleetbench.config import NotifySettings
from fleetbench.notify import NotificationError, notify
from warehouse_rows import result_row, run_row, step_rows

pytestmark = pytest.mark.integration

CONN_ID = "fleetbench_smtp"
TO = ["gpu-team@example.org", "oncall@example.org"]


# -- an SMTP server that keeps what it gets -------------------------------------------------------
class _Session(socketserver.StreamRequestHandler):
    """One SMTP session (RFC 5321): greeting, EHLO/HELO, MAIL, RCPT, DATA (dot-unstuffed), RSET, NOOP, QUIT."""

    def reply(self, text: str) -> None:
        self.wfile.write(text.encode() + b"\r\n")

    def handle(self) -> None:
        self.reply("220 fleetbench-test-sink ESMTP")
        sender, recipients = None, []
        while line := self.rfile.readline():
            command = line.decode("ascii", "replace").rstrip("\r\n")
            verb, _, arg = command.partition(" ")
            verb = verb.upper()
            if verb == "EHLO":
                self.reply("250-fleetbench-test-sink")
                self.reply("250 8BITMIME")
            elif verb == "HELO":
                self.reply("250 fleetbench-test-sink")
            elif verb == "MAIL":
                sender, recipients = arg.split(":", 1)[1].split()[0].strip("<>"), []
                self.reply("250 OK")
            elif verb == "RCPT":
                recipients.append(arg.split(":", 1)[1].split()[0].strip("<>"))
                self.reply("250 OK")
            elif verb == "DATA":
                self.reply("354 end with <CRLF>.<CRLF>")
                body = []
                while (data := self.rfile.readline()) not in (b".\r\n", b""):
                    body.append(data[1:] if data.startswith(b"..") else data)
                self.server.messages.append({"from": sender, "to": recipients, "data": b"".join(body)})
                self.reply("250 OK: queued")
            elif verb in ("RSET", "NOOP"):
                self.reply("250 OK")
            elif verb == "QUIT":
                self.reply("221 bye")
                return
            else:
                self.reply("502 command not implemented")


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Session)
        self.messages: list[dict] = []


@pytest.fixture()
def smtp_sink(monkeypatch):
    """The server, and the Airflow Connection CONN_ID pointing at it (plain SMTP: no TLS on loopback)."""
    server = _Server()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({
        "conn_type": "smtp", "host": "127.0.0.1", "port": server.server_address[1],
        "extra": {"from_email": "fleetbench@example.org", "disable_tls": True, "disable_ssl": True, "timeout": 10,
                  "retry_limit": 0}}))
    yield server
    server.shutdown()
    server.server_close()


def html_of(message: dict) -> tuple[Message, str]:
    msg = email.message_from_bytes(message["data"])
    parts = [p for p in msg.walk() if p.get_content_type() == "text/html"]
    assert len(parts) == 1
    return msg, parts[0].get_payload(decode=True).decode()


def finding(severity: str = "major", metric: str = "images_per_sec", **extra) -> dict:
    return {"dag_id": "fleet_benchmark", "run_id": "scheduled__2026-12-08T02:00:00+00:00", "host": "gpu-01",
            "case_key": "cnn.resnet50.bs64.g1", "metric": metric, "direction": "higher", "baseline_value": 1000.0,
            "value": 800.0, "delta_pct": -20.0, "z_score": -12.5, "p_value": 0.0004, "baseline_n": 7,
            "baseline_window": ["r6", "r5"],
            "changes": {"driver_version": {"before": "535.104.05", "after": "550.54.14"}},
            "severity": severity, "detected_at": "2026-12-08T02:30:00+00:00", **extra}


RUN = {"dag_id": "fleet_benchmark", "run_id": "scheduled__2026-12-08T02:00:00+00:00",
       "logical_date": "2026-12-08T02:00:00+00:00"}


# -- notify ---------------------------------------------------------------------------------------
def test_findings_are_mailed_through_the_airflow_connection(smtp_sink, caplog):
    caplog.set_level("INFO", logger="fleetbench.notify")
    findings = [finding(), finding("minor", "duration_s", direction="lower", baseline_value=60.0, value=63.0,
                                   delta_pct=5.0, z_score=4.1, p_value=None, host="gpu-<02>", unit="s")]
    out = notify(findings, NotifySettings(smtp_conn_id=CONN_ID, to=TO), RUN)
    assert out == {"logged": 2, "mailed": 2, "to": TO}
    [message] = smtp_sink.messages
    assert message["from"] == "fleetbench@example.org" and message["to"] == TO
    msg, body = html_of(message)
    assert msg["Subject"] == ("[fleetbench] 2 regression(s) (1 major) in fleet_benchmark run "
                              "scheduled__2026-12-08T02:00:00+00:00")
    assert msg["To"] == ", ".join(TO)
    assert ("<td>gpu-01</td><td>cnn.resnet50.bs64.g1</td><td>images_per_sec</td><td>1000</td><td>800</td>"
            "<td>-20.0</td>" in body)
    assert "driver_version: 535.104.05 -&gt; 550.54.14" in body
    assert "gpu-&lt;02&gt;" in body and "gpu-<02>" not in body  # values are escaped
    assert "<td>duration_s [s]</td><td>60</td><td>63</td>" in body  # a finding's unit, where it has one
    # Logged as well, one line per finding.
    assert "regression: gpu-01 cnn.resnet50.bs64.g1: images_per_sec 1000 -> 800 (-20.0 %" in caplog.text
    assert "duration_s 60 -> 63 s (+5.0 %" in caplog.text


def test_only_findings_of_the_minimum_severity_are_mailed_but_all_are_logged(smtp_sink, caplog):
    caplog.set_level("INFO", logger="fleetbench.notify")
    settings = NotifySettings(smtp_conn_id=CONN_ID, to=TO[:1], min_severity="major", from_email="bench@example.org")
    assert notify([finding("minor")], settings, RUN) == {"logged": 1, "mailed": 0, "to": []}
    assert smtp_sink.messages == []
    assert "regression: gpu-01" in caplog.text and "no regression of severity major or worse" in caplog.text
    assert notify([finding("minor"), finding("major", "cost_usd")], settings, RUN)["mailed"] == 1
    [message] = smtp_sink.messages
    assert message["from"] == "bench@example.org" and message["to"] == TO[:1]
    assert "cost_usd" in html_of(message)[1] and "images_per_sec" not in html_of(message)[1]
    # Not configured: logged only.
    assert notify([finding()], None, RUN) == {"logged": 1, "mailed": 0, "to": []}
    assert len(smtp_sink.messages) == 1


def test_an_unreachable_mail_server_is_a_clear_error_without_secrets(monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AIRFLOW_CONN_FLEETBENCH_SMTP_DOWN", json.dumps({
        "conn_type": "smtp", "host": "127.0.0.1", "port": port, "login": "bench", "password": "s3cret-pw",
        "extra": {"from_email": "fleetbench@example.org", "disable_tls": True, "disable_ssl": True, "retry_limit": 0}}))
    with pytest.raises(NotificationError) as err:
        notify([finding()], NotifySettings(smtp_conn_id="fleetbench_smtp_down", to=TO), RUN)
    assert "'fleetbench_smtp_down'" in str(err.value) and "ConnectionRefusedError" in str(err.value)
    assert "s3cret-pw" not in str(err.value)


# -- the compare step, and the whole DAG ----------------------------------------------------------
def seed_history(engine, host: str, case_key: str, digest: str, nights: int = 12, ips: float = 1e7,
                 dag_id: str = "fleet_benchmark", slow_last: int = 0) -> list[str]:
    """`nights` earlier ok results of one case (newest yesterday), far faster than anything this machine does;
    the last `slow_last` of them at 70 % of that."""
    from fleetbench.warehouse import store_run

    run_ids = []
    for k in range(nights, 0, -1):
        when = (datetime.now(timezone.utc) - timedelta(days=k)).replace(microsecond=0).isoformat()
        run_id = f"scheduled__{when}"
        slow = 0.7 if k <= slow_last else 1.0
        row = result_row(case_key, run_id=run_id, host=host, ips=ips * slow * (1 + 0.001 * (k % 3)), logical_date=when,
                         image_digest=digest, duration_s=0.01, cost_usd=None, num_gpus=0, device="cpu")
        row["dag_id"] = dag_id
        steps = [{**s, "dag_id": dag_id} for s in step_rows(case_key, 5, run_id=run_id, host=host, base=ips)]
        store_run(engine, {**run_row(run_id, dag_id), "logical_date": when}, [], [row], steps)
        run_ids.append(run_id)
    return run_ids


def test_the_compare_step_stores_logs_and_mails(smtp_sink, data_dir, tmp_path, caplog):
    """pipeline.detect_regressions with a fleet config that sets fleet.notify: rows, summary and one mail."""
    from fleetbench.airflow.pipeline import detect_regressions, make_plan
    from fleetbench.warehouse import get_engine, store_run, upgrade
    from regression_rows import fetch_regressions

    cfg = smoke_config("127.0.0.1:5000/fleetbench/cpu-smoke:latest", models=("trivial",), batch_sizes=(8,))
    cfg["fleet"]["notify"] = {"smtp_conn_id": CONN_ID, "to": TO, "min_severity": "major"}
    cfg["fleet"]["regressions"] = {"window": 10}
    now = datetime.now(timezone.utc).replace(microsecond=0)
    plan = make_plan({"dag_id": "fleet_benchmark", "run_id": f"manual__{now.isoformat()}",
                      "logical_date": now.isoformat(), "run_type": "manual"},
                     config_path=str(write_config(tmp_path / "fleet.yaml", cfg)))
    case_key = plan["cases"][0]["case_key"]
    digest = "sha256:" + "c" * 64
    engine = get_engine()
    upgrade(engine)
    window = seed_history(engine, "localhost", case_key, digest, slow_last=1)  # yesterday was slow already
    run_id = plan["run"]["run_id"]
    row = result_row(case_key, run_id=run_id, host="localhost", ips=7e6, logical_date=now.isoformat(),
                     image_digest=digest, duration_s=0.01, cost_usd=None)
    store_run(engine, {**run_row(run_id), "logical_date": now.isoformat()}, [], [row],
              step_rows(case_key, 5, run_id=run_id, host="localhost", base=7e6))

    caplog.set_level("INFO", logger="fleetbench")
    summary = detect_regressions(plan, {"run_id": run_id, "ok": 1})
    # Yesterday suspected, tonight agrees: confirmed, and mailed once.
    assert (summary["checked"], summary["regressions"], summary["major"], summary["mailed"]) == (1, 1, 1, 1)
    assert summary["newly_confirmed"] == 1 and summary["findings"][0]["status"] == "confirmed"
    assert summary["findings"][0]["metric"] == "images_per_sec" and summary["findings"][0]["delta_pct"] < -29
    json.dumps(summary)  # small and JSON-able: it goes to XCom
    [stored] = fetch_regressions(engine, run_id=run_id)
    # fleet.regressions.window from the config; the slow nights are not part of the baseline
    assert stored["baseline_window"] == window[:-1][::-1][:10] and stored["since_run_id"] == window[-1]
    [message] = smtp_sink.messages
    assert message["to"] == TO and case_key in html_of(message)[1]
    assert f"regression: localhost {case_key}: images_per_sec" in caplog.text
    assert stored["mailed_at"] is not None  # recorded once the mail went out
    # the report task cleared and run again: the night is detected again, its mail is on record, nothing is sent
    assert detect_regressions(plan, {"run_id": run_id, "ok": 1})["mailed"] == 0
    assert len(smtp_sink.messages) == 1 and fetch_regressions(engine, run_id=run_id)[0]["mailed_at"] is not None
    engine.dispose()


@pytest.mark.dagrun
def test_fleet_benchmark_run_against_a_seeded_history_finds_and_mails_the_regression(
        airflow_db, data_dir, smoke_image, docker_api, smtp_sink, tmp_path, monkeypatch):
    """The real DAG: the smoke case runs, store writes it, compare finds it far slower than the seeded nights."""
    from fleetbench.config import parse_config
    from fleetbench.plan import expand_cases
    from fleetbench.warehouse import fetch_results, get_engine, upgrade
    from regression_rows import fetch_regressions

    cfg = smoke_config(smoke_image, models=("trivial",), batch_sizes=(8,))
    cfg["fleet"]["notify"] = {"smtp_conn_id": CONN_ID, "to": TO}
    [case] = expand_cases(parse_config(cfg))
    digest = docker_api.inspect_distribution(smoke_image)["Descriptor"]["digest"]
    engine = get_engine()
    upgrade(engine)
    window = seed_history(engine, "localhost", case.case_key, digest)

    dag_run = run_fleet_dag(monkeypatch, write_config(tmp_path / "fleet.yaml", cfg))
    assert dag_run.state == "success"
    [result] = fetch_results(engine, run_id=dag_run.run_id)
    assert result["status"] == "ok" and result["image_digest"] == digest
    found = {r["metric"]: r for r in fetch_regressions(engine, run_id=dag_run.run_id)}
    assert "images_per_sec" in found
    ips = found["images_per_sec"]
    assert ips["value"] == pytest.approx(result["images_per_sec"]) and ips["severity"] == "major"
    assert ips["baseline_window"] == window[::-1]
    assert ips["status"] == "confirmed" and ips["basis"] == "night"  # far beyond the immediate threshold: at once
    assert [m for m in smtp_sink.messages if case.case_key in html_of(m)[1]], "no regression mail arrived"
    engine.dispose()
