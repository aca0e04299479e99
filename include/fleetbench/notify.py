"""Telling people about regressions: always in the log, and by mail when the fleet config has `fleet.notify`.

The mail goes through the SMTP provider's `SmtpNotifier` with the Airflow Connection
`fleet.notify.smtp_conn_id` (host, port, login, password; extras such as `from_email`,
`disable_tls`, `disable_ssl`, `timeout`, `retry_limit`), so no server name or secret lives in the
fleet config. Of the findings given (the night's news: `fleetbench.regression.store.to_mail`), those of at least
`min_severity` are mailed; all are logged. The report task logs every confirmed regression open that night besides.
"""

from __future__ import annotations

import html
import logging
from typing import Any, Mapping, Sequence

from fleetbench.config import NotifySettings
from fleetbench.regression import SEVERITIES, describe

log = logging.getLogger(__name__)


class NotificationError(RuntimeError):
    """The mail could not be sent (the findings are stored and logged all the same)."""


def at_least(findings: Sequence[Mapping[str, Any]], min_severity: str) -> list[Mapping[str, Any]]:
    """The findings whose severity is `min_severity` or worse (minor < major)."""
    floor = SEVERITIES.index(min_severity)
    return [f for f in findings if SEVERITIES.index(f["severity"]) >= floor]


def subject(findings: Sequence[Mapping[str, Any]], run: Mapping[str, Any]) -> str:
    """`[fleetbench] 3 regression(s) (1 major) in fleet_benchmark run scheduled__...`."""
    major = sum(1 for f in findings if f["severity"] == "major")
    return (f"[fleetbench] {len(findings)} regression(s)" + (f" ({major} major)" if major else "")
            + f" in {run.get('dag_id')} run {run.get('run_id')}")


def html_body(findings: Sequence[Mapping[str, Any]], run: Mapping[str, Any]) -> str:
    """An HTML table of the findings (every value escaped)."""
    head = ("host", "case", "metric", "baseline", "value", "delta %", "z", "p", "severity", "what changed")
    lines = [f"<p>fleetbench compared run <b>{html.escape(str(run.get('run_id')))}</b> of "
             f"{html.escape(str(run.get('dag_id')))} (logical date {html.escape(str(run.get('logical_date')))}) "
             "with each case's baseline (earlier results of the same host, case and image digest).</p>",
             "<table border=\"1\" cellpadding=\"4\" cellspacing=\"0\">",
             "<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for f in findings:
        changes = f.get("changes") or {}
        what = "; ".join(f"{k}: {v.get('before')} -> {v.get('after')}" for k, v in changes.items()) or "-"
        metric = f["metric"] + (f" [{f['unit']}]" if f.get("unit") else "")
        cells = (f["host"], f["case_key"], metric, f"{f['baseline_value']:.4g}", f"{f['value']:.4g}",
                 f"{f['delta_pct']:+.1f}", "-" if f.get("z_score") is None else f"{f['z_score']:+.1f}",
                 "-" if f.get("p_value") is None else f"{f['p_value']:.2g}", f["severity"], what)
        lines.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    lines.append("</table>")
    return "\n".join(lines)


def log_findings(findings: Sequence[Mapping[str, Any]], run: Mapping[str, Any]) -> None:
    """One warning per finding, or one info line saying there is none."""
    if not findings:
        log.info("no new regression to tell of in run %s", run.get("run_id"))
        return
    log.warning("%d regression(s) in run %s:", len(findings), run.get("run_id"))
    for f in findings:
        log.warning("regression: %s", describe(f))


def send_mail(findings: Sequence[Mapping[str, Any]], settings: NotifySettings, run: Mapping[str, Any],
              context: Mapping[str, Any] | None = None) -> None:
    """Mail the findings through `SmtpNotifier` and the Airflow Connection `settings.smtp_conn_id`."""
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    notifier = SmtpNotifier(to=list(settings.to), from_email=settings.from_email, subject=subject(findings, run),
                            html_content=html_body(findings, run), smtp_conn_id=settings.smtp_conn_id)
    # notify() rather than __call__: the subject and body are finished text, not Jinja templates.
    notifier.notify(dict(context or {}))


def notify(findings: Sequence[Mapping[str, Any]], settings: NotifySettings | None, run: Mapping[str, Any],
           context: Mapping[str, Any] | None = None) -> dict:
    """Log every finding; mail those of at least `min_severity` when `settings` is given.

    Returns {"logged": n, "mailed": k, "to": [...]}. Raises `NotificationError` (naming the
    connection, never its secrets) when the mail cannot be sent.
    """
    log_findings(findings, run)
    out = {"logged": len(findings), "mailed": 0, "to": []}
    if settings is None:
        return out
    selected = at_least(findings, settings.min_severity)
    if not selected:
        if findings:
            log.info("no regression of severity %s or worse: nothing mailed", settings.min_severity)
        return out
    try:
        send_mail(selected, settings, run, context)
    except Exception as exc:
        raise NotificationError(f"mailing {len(selected)} regression(s) through the Airflow connection "
                                f"{settings.smtp_conn_id!r} failed: {type(exc).__name__}: {exc}") from exc
    log.info("mailed %d regression(s) to %s", len(selected), ", ".join(settings.to))
    return {**out, "mailed": len(selected), "to": list(settings.to)}
