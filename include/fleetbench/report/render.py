"""The report as one self-contained HTML page: inline CSS, plots as inline SVG, no scripts, no
external references (it opens from a file, a mail attachment or inside the Airflow UI alike).

Tables carry their numbers twice: as text for people and, on numeric cells, the exact value in
`data-value` (plus the column in `data-col`) for machines, e.g. the browser test.

`render_csv` writes the throughput plots' points as CSV (the view's download), with text cells made
safe to open in a spreadsheet (`csv_cell`).
"""

from __future__ import annotations

import csv
import io
import re
from html import escape
from typing import Any, Iterable, Sequence
from urllib.parse import urlencode

from fleetbench.report.plots import Chart, to_svg
from fleetbench.report.queries import CHANGE_MAP_NIGHTS, DEFAULT_DAYS, EMPTY, NO_MATCH, NO_TABLES, OUTDATED

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:0;padding:16px 24px;color:#1d1d1f;background:#fafafa}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#555;font-size:12px}.notes{background:#fff8e1;border:1px solid #f0d58a;padding:8px 12px;margin:12px 0;font-size:13px}
.notes li{margin:2px 0}.cards{display:flex;gap:12px;flex-wrap:wrap;margin:12px 0}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px 14px;min-width:90px}
.card b{display:block;font-size:20px}.card span{font-size:12px;color:#555}
table.data{border-collapse:collapse;background:#fff;font-size:12px;margin:6px 0 10px}
table.data th,table.data td{border:1px solid #ddd;padding:3px 8px;text-align:left;white-space:nowrap}
table.data th{background:#f0f0f0}table.data td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.bad td{background:#fdecea}tr.degraded td{background:#fff8e1}.st-fail{color:#b00020;font-weight:bold}
.st-warn,.st-unknown{color:#a15c00}.st-pass{color:#2e7d32}.sev-major{color:#b00020;font-weight:bold}.sev-minor{color:#a15c00}
.plots{display:flex;flex-wrap:wrap;gap:12px}.plots svg{border:1px solid #ddd;max-width:100%;height:auto}
.empty{color:#666;font-style:italic;font-size:13px}form.filters{background:#fff;border:1px solid #ddd;padding:8px 12px;
display:flex;gap:12px;align-items:end;flex-wrap:wrap;font-size:13px}form.filters label{display:flex;flex-direction:column;gap:2px}
.error{background:#fdecea;border:1px solid #e0a0a0;padding:8px 12px;margin:12px 0;font-size:14px}a{color:#2a5db0}
"""  # noqa: E501


def _cell_colour(delta: float | None, better: str = "higher") -> str:
    """Red for worse (lower where higher is better, higher where lower is), green for better, white within 1 %,
    full colour at 25 %."""
    if delta is None or abs(delta) < 1.0:
        return "#fff"
    t = min(abs(delta), 25.0) / 25.0
    fade = int(255 - t * 160)
    worse = delta < 0 if better != "lower" else delta > 0
    return f"rgb(255,{fade},{fade})" if worse else f"rgb({fade},255,{fade})"


def _change_map(data: dict) -> str:
    """The host x case table of the primary metric's change against baseline (● confirmed finding, ○ suspected)."""
    if data.get("skipped"):
        return (f'<p class="empty" id="change-map-skipped">Over {data["skipped"] - 1} host and case cells: too many '
                "for a map; filter by host or model.</p>")
    if not data.get("hosts"):
        return '<p class="empty" id="change-map-empty">No ok throughput in this range.</p>'
    head = "".join(f"<th>{escape(c)}</th>" for c in data["cases"])
    body = []
    for host in data["hosts"]:
        tds = []
        for case_key in data["cases"]:
            cell = data["cells"][host].get(case_key)
            if cell is None:
                tds.append("<td></td>")
                continue
            d = cell["delta_pct"]
            mark = {"confirmed": " ●", "suspected": " ○"}.get(cell["status"] or "", "")
            text = "–" if d is None else f"{d:+.1f}"
            value = "" if d is None else f' data-value="{d!r}"'
            what = f"{cell.get('metric') or ''} {cell.get('unit') or ''}, {cell.get('better', 'higher')} is better"
            tds.append(f'<td class="num" data-col="{escape(case_key)}"{value} '
                       f'style="background:{_cell_colour(d, cell.get("better", "higher"))}" '
                       f'title="{escape(host)} {escape(case_key)}: {escape(what)}">{text}{mark}</td>')
        body.append(f"<tr><th>{escape(host)}</th>{''.join(tds)}</tr>")
    return ('<p class="meta">Newest night\'s change in % of each case\'s primary metric (images/sec, bus bandwidth, '
            "a latency; red is worse in the metric's own direction, the cell's tooltip names metric and unit): "
            "against the open finding's baseline (● confirmed, ○ suspected), else against the earlier nights "
            f"with the same driver and image among the range's newest {CHANGE_MAP_NIGHTS}."
            f'</p><table class="data" id="change-map"><tr><th>host</th>{head}</tr>{"".join(body)}</table>')


def _findings(rows: Sequence[dict]) -> list[dict]:
    """Findings as table rows: severity badge, what changed in words, repeated metrics marked."""
    return [{**r, "case": r["case_key"],
             "metric": r["metric"] + (f" [{r['unit']}]" if r.get("unit") else "")
             + (" ↑" if r.get("direction") == "higher" else " ↓" if r.get("direction") == "lower" else "")
             + (f" (same change as {r['same_change_as']})" if r.get("same_change_as") else ""),
             "sev_html": f'<span class="sev-{escape(r["severity"])}">{escape(r["severity"])}</span>',
             "changes_text": "; ".join(f"{k} {v.get('before')} → {v.get('after')}" if isinstance(v, dict)
                                       else f"{k} {v}"
                                       for k, v in (r["changes"] or {}).items()) or "–"} for r in rows]


def _v(value: Any, kind: str = "num") -> str:
    """Cell text: numbers short, percentages signed, dates as YYYY-MM-DD HH:MM, None as an en dash."""
    if value is None:
        return "–"
    if kind == "pct":
        return f"{value:+.1f} %"
    if kind == "date":
        return str(value)[:16].replace("T", " ")
    if kind == "int":
        return str(int(value))
    if kind == "num":
        return f"{value:.4g}" if abs(value) < 1 else f"{value:,.2f}"
    return str(value)


def table(table_id: str, columns: Sequence[tuple[str, str, str]], rows: Iterable[dict], *,
          row_class=None, empty: str = "nothing to show") -> str:
    """A data table. columns: (header, key, kind) with kind num|int|pct|date|text|html."""
    rows = list(rows)
    if not rows:
        return f'<p class="empty" id="{table_id}-empty">{escape(empty)}</p>'
    head = "".join(f"<th>{escape(h)}</th>" for h, _, _ in columns)
    body = []
    for r in rows:
        cls = row_class(r) if row_class else ""
        cells = []
        for _, key, kind in columns:
            value = r.get(key)
            if kind == "html":
                cells.append(f'<td data-col="{key}">{value}</td>')
            elif kind in ("num", "int", "pct") and value is not None:
                cells.append(f'<td class="num" data-col="{key}" data-value="{float(value)!r}">'
                             f'{escape(_v(value, kind))}</td>')
            else:
                cells.append(f'<td data-col="{key}">{escape(_v(value, kind))}</td>')
        body.append(f'<tr{f" class={cls!r}" if cls else ""}>{"".join(cells)}</tr>')
    return (f'<table class="data" id="{table_id}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


def _health_class(row: dict) -> str:
    """Rows measured on a host whose GPUs were degraded or unfit at its newest check."""
    return {"unfit": "bad", "degraded": "degraded"}.get(row.get("gpu_health") or "", "")


def _fleet_health(hosts: list[dict]) -> str:
    """Host x check: each host's newest GPU health check, and its results measured on unhealthy GPUs."""
    from fleetbench.hosts.health import HEALTH_CHECKS

    names = [n for n in HEALTH_CHECKS if any(n in h["checks"] for h in hosts)]
    rows = [{**h, **{f"c_{n}": (f'<span class="st-{escape(h["checks"][n])}">{escape(h["checks"][n])}</span>'
                                if n in h["checks"] else "–") for n in names}} for h in hosts]
    columns = [("host", "host", "text"), ("GPU health", "gpu_health", "text")]
    columns += [(n.removeprefix("gpu_").replace("_", " "), f"c_{n}", "html") for n in names]
    columns += [("results on degraded/unfit GPUs", "degraded_results", "int"), ("checked", "logical_date", "date")]
    return ("<h2>Fleet GPU health</h2>"
            '<p class="meta" id="fleet-health-note">each host\'s newest GPU health check in this range; '
            "rows of the throughput and regression tables of a degraded host are marked yellow, of an unfit one "
            "red</p>" + table("fleet-health-table", columns, rows, row_class=_health_class))


def metric_text(row: dict) -> str:
    """`metric [unit] ↑` (higher is better) or `↓` (lower is better)."""
    arrow = " ↓" if row.get("better") == "lower" else " ↑"
    return f"{row.get('metric') or 'images_per_sec'} [{row.get('unit') or 'images/s'}]{arrow}"


def _left_out(report: dict, element_id: str, why: str) -> str:
    """The metrics of this range that the scaling (energy) section leaves out, and why (`why`: the rows' key)."""
    rows = report.get("left_out") or []
    if not rows:
        return ""
    items = "".join(f'<li data-metric="{escape(r["metric"])}">{escape(metric_text(r))}, {r["cases"]} case(s): '
                    f'{escape(r[why])}</li>' for r in rows)
    return (f'<div class="meta" id="{element_id}">Computed on images/sec only; not shown here:<ul>{items}</ul>'
            "</div>")


def _plots(charts: Sequence[Chart], prefix: str, plot_files: dict[str, str] | None) -> str:
    chosen = [c for c in charts if c.id.startswith(prefix)]
    if not chosen:
        return ""
    items = []
    for c in chosen:
        link = (f'<div class="meta"><a href="{escape(plot_files[c.id])}">{escape(plot_files[c.id])}</a></div>'
                if plot_files and c.id in plot_files else "")
        items.append(f"<figure style=\"margin:0\">{to_svg(c)}{link}</figure>")
    return f'<div class="plots">{"".join(items)}</div>'


# The CSV's columns: the series' (host and driver_version only in "hosts" mode, gpu, min, max and hosts only
# in "fleet" mode, where value is the night's median images/sec), then the point's: `value` in the series' metric
# and unit, `images_per_sec` the same number where that metric is images/sec (empty for other metrics).
CSV_SERIES_COLUMNS = ("model", "host", "case_key", "gpu", "num_gpus", "batch_size_per_device", "metric", "unit",
                      "better")
CSV_POINT_COLUMNS = ("dag_id", "run_id", "logical_date", "value", "images_per_sec", "min", "max", "hosts",
                     "driver_version")
# What makes a spreadsheet read a cell as a formula (OWASP, "CSV Injection").
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """A CSV cell that a spreadsheet shows as written: text starting with = + - @, a tab or a carriage return
    gets a leading single quote (OWASP's advice against formula injection); numbers, negative ones too, stay
    numbers, and None an empty cell."""
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES):
        return "'" + value
    return value


def render_csv(report: dict) -> str:
    """The throughput plots' points as CSV: a header, then one row per point (RFC 4180 line ends)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(CSV_SERIES_COLUMNS + CSV_POINT_COLUMNS)
    for series in report["throughput"]:
        head = [csv_cell(series.get(k)) for k in CSV_SERIES_COLUMNS]
        for point in series["points"]:
            writer.writerow(head + [csv_cell(point.get(k)) for k in CSV_POINT_COLUMNS])
    return out.getvalue()


def _filters_form(report: dict, values: dict[str, str]) -> str:
    def select(name: str, options: list[str], label: str) -> str:
        current = values.get(name) or ""
        opts = ['<option value="">all</option>'] + [
            f'<option value="{escape(o)}"{" selected" if o == current else ""}>{escape(o)}</option>' for o in options]
        if current and current not in options:
            opts.append(f'<option value="{escape(current)}" selected>{escape(current)}</option>')
        return f'<label>{label}<select name="{name}">{"".join(opts)}</select></label>'

    opts = report["options"]
    query = urlencode({k: v for k, v in values.items() if v})
    def date(name: str, label: str) -> str:
        """A date picker for a day (or nothing); a moment given in the URL (since=...T02:00:00+00:00) stays as given,
        in a text field: cut to its day, Apply widened an exclusive moment to the whole (inclusive) day, and the page
        and its CSV link read different windows."""
        value = values.get(name) or ""
        kind = "date" if not value or re.fullmatch(r"\d{4}-\d\d-\d\d", value) else "text"
        return f'<label>{label}<input type="{kind}" name="{name}" value="{escape(value)}"></label>'

    dates = date("since", "from") + date("until", "to")
    return (f'<form class="filters" method="get" action="" id="filters">{select("host", opts["hosts"], "host")}'
            f'{select("model", opts["models"], "model")}{dates}'
            f'{select("dag_id", opts["dag_ids"], "DAG") if len(opts["dag_ids"]) > 1 else ""}'
            f'<button type="submit">Apply</button><a href="?">reset</a>'
            f'<a id="csv" href="throughput.csv{escape("?" + query if query else "")}">CSV of the throughput</a></form>')


def render_html(report: dict, charts: Sequence[Chart], *, form_values: dict[str, str] | None = None,
                plot_files: dict[str, str] | None = None, error: str | None = None,
                title: str = "fleetbench report") -> str:
    """The page. `form_values`: show the filter form (the UI view) with these values; `plot_files`: chart id ->
    file name of its plot file (the file report); `error`: a message shown above everything (bad filters)."""
    s = report["summary"]
    w = report["window"]
    meta = [f"generated {report['generated_at']}"]
    if report["warehouse"]:
        meta.append(f"from {report['warehouse']}")
    if w["since"]:
        meta.append(f"results from {_v(w['since'], 'date')}"
                    + (f" to before {_v(w['until'], 'date')}" if w["until"] else "")
                    + (f" (the last {DEFAULT_DAYS} days with results)" if w["defaulted"] else ""))
    meta += [f"{k} = {v}" for k, v in report["filters"].items() if v is not None and k in ("host", "model", "dag_id")]
    parts = [f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
             f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head><body>',
             f"<h1>{escape(title)}</h1>",
             f'<div class="meta" id="meta" data-state="{report["state"]}">{escape(" · ".join(meta))}</div>']
    if form_values is not None:
        parts.append(_filters_form(report, form_values))
    if error:
        parts.append(f'<div class="error" id="error">{escape(error)}</div>')
    if report["notes"]:
        parts.append('<ul class="notes" id="notes">' + "".join(f"<li>{escape(n)}</li>" for n in report["notes"])
                     + "</ul>")
    if error or report["state"] in (NO_TABLES, OUTDATED, EMPTY, NO_MATCH):
        parts.append("</body></html>")
        return "".join(parts)

    parts.append('<div class="cards" id="summary">' + "".join(
        f'<div class="card" data-col="{k}" data-value="{s[k]}"><b>{s[k]}</b><span>{label}</span></div>'
        for k, label in (("runs", "runs"), ("results", "results"), ("ok", "ok"), ("failed", "failed"),
                         ("skipped", "skipped"), ("hosts", "hosts"))) + "</div>")

    parts.append("<h2>Hosts</h2>")
    parts.append(table("hosts-table", [("host", "host", "text"), ("runs", "runs", "int"), ("ok", "ok", "int"),
                                       ("failed", "failed", "int"), ("skipped", "skipped", "int"),
                                       ("last result", "last_seen", "date"), ("last ok", "last_ok", "date"),
                                       ("GPU model", "gpu_model", "text"), ("drivers seen", "drivers", "int")],
                       report["hosts"], row_class=lambda r: "bad" if r["ok"] == 0 else ""))

    if report.get("fleet_health"):
        parts.append(_fleet_health(report["fleet_health"]))

    if report.get("throughput_mode") == "fleet":
        parts.append("<h2>Throughput per model and case across the fleet</h2>")
        parts.append('<p class="meta" id="throughput-fleet">ok results only; each night the median images/sec of the '
                     'hosts that ran the case on that GPU type (min and max: the lowest and highest single result in '
                     'this range); dashed red lines mark nights on which hosts reported a new driver. Filter by host '
                     'for one host\'s series.</p>')
        parts.append(_plots(charts, "throughput-", plot_files))
        parts.append(table("throughput-table", [
            ("model", "model", "text"), ("case", "case_key", "text"), ("GPU model", "gpu", "text"),
            ("GPUs", "num_gpus", "int"), ("batch/GPU", "batch_size_per_device", "int"), ("nights", "n", "int"),
            ("hosts (latest night)", "hosts", "int"), ("latest median images/sec", "latest", "num"),
            ("previous", "previous", "num"), ("change", "change_pct", "pct"), ("min", "min", "num"),
            ("max", "max", "num"), ("latest night", "latest_date", "date")],
            report["throughput"], empty="No ok results with a throughput in this range."))
    else:
        parts.append("<h2>Throughput per model and host</h2>")
        if report["throughput"]:
            parts.append('<p class="meta">ok results only; each case\'s primary metric (images/sec, a bus bandwidth, '
                         'a latency, a team\'s own metric), one chart per model, device count and metric with its '
                         'unit on the axis; ↑ higher is better, ↓ lower is better. Dashed red lines mark nights on '
                         'which a host reported a new driver.</p>')
        parts.append(_plots(charts, "throughput-", plot_files))
        parts.append(table("throughput-table", [
            ("model", "model", "text"), ("host", "host", "text"), ("case", "case_key", "text"),
            ("metric", "metric_text", "text"), ("GPUs", "num_gpus", "int"), ("MIG profile", "mig_profile", "text"),
            ("batch/GPU", "batch_size_per_device", "int"), ("nights", "n", "int"),
            ("latest", "latest", "num"), ("previous", "previous", "num"), ("change", "change_pct", "pct"),
            ("min", "min", "num"), ("max", "max", "num"), ("driver", "latest_driver", "text"),
            ("latest night", "latest_date", "date"), ("GPU health", "gpu_health", "text")],
            [{**r, "metric_text": metric_text(r)} for r in report["throughput"]], row_class=_health_class,
            empty="No ok results with a throughput in this range."))
    if report["driver_changes"]:
        parts.append("<h2>Driver changes</h2>")
        parts.append(table("driver-changes-table", [("night", "logical_date", "date"), ("host", "host", "text"),
                                                    ("from", "from", "text"), ("to", "to", "text"),
                                                    ("run", "run_id", "text")],
                           report["driver_changes"]))
    if report.get("remeasured"):
        parts.append("<h2>Re-measured nights</h2>")
        parts.append('<p class="meta">Nights measured again (a rerun or a backfill): the figures above are the '
                     'current attempts; the superseded ones stay in the warehouse '
                     '(<code>fleetbench results --attempts</code>, <code>fleetbench compare --attempts</code>).</p>')
        parts.append(table("remeasured-table", [("night", "logical_date", "date"), ("host", "host", "text"),
                                                ("run", "run_id", "text"), ("superseded attempts", "superseded", "int"),
                                                ("why", "reasons_text", "text"),
                                                ("re-measured", "superseded_at", "date")],
                           [{**r, "reasons_text": "; ".join(r["reasons"])} for r in report["remeasured"]]))

    parts.append("<h2>Scaling efficiency per GPU count</h2>")
    parts.append('<p class="meta">N-GPU images/sec ÷ (N × 1-GPU images/sec) of the same host, model, batch and run; '
                 '1.0 is linear. N instances of a MIG profile scale against 1 instance of it, in a row of their '
                 'own.</p>')
    parts.append(_plots(charts, "scaling", plot_files))
    parts.append(table("scaling-table", [("model", "model", "text"), ("GPUs", "num_gpus", "int"),
                                         ("MIG profile", "mig_profile", "text"), ("cases", "n", "int"),
                                         ("hosts", "hosts", "int"), ("mean", "mean", "num"), ("min", "min", "num"),
                                         ("max", "max", "num")],
                       report["scaling"],
                       empty="No GPU cases with a 1-GPU counterpart in this range (CPU cases do not scale)."))
    parts.append(_left_out(report, "scaling-left-out", "why_scaling"))

    if report.get("node_scaling"):
        parts.append("<h2>Scaling across nodes</h2>")
        parts.append('<p class="meta">Multi-node cases: the cluster\'s total images/sec ÷ (nodes × the 1-node '
                     'images/sec of the same model, batch and GPUs per node, on the set\'s hosts, same run); 1.0 is '
                     'linear.</p>')
        parts.append(table("node-scaling-table", [
            ("model", "model", "text"), ("batch", "batch_size", "int"), ("GPUs per node", "num_gpus", "int"),
            ("nodes", "nodes", "int"), ("cases", "n", "int"), ("host sets", "sets", "int"),
            ("e.g. hosts", "host_set", "text"), ("total images/sec (mean)", "images_per_sec", "num"),
            ("efficiency (mean)", "mean", "num"), ("min", "min", "num"), ("max", "max", "num")],
            report["node_scaling"], empty=""))

    parts.append("<h2>Energy and cost per GPU model</h2>")
    parts.append('<p class="meta">CPU cases are the rows of GPU model “none (CPU)”; energy measured (NVML, RAPL) or '
                 'estimated (TDP × utilisation).</p>')
    parts.append(_plots(charts, "images-per-joule", plot_files) + _plots(charts, "cost-per-million", plot_files))
    parts.append(table("efficiency-table", [("GPU model", "gpu", "text"), ("model", "model", "text"),
                                            ("cases", "n", "int"), ("images/J (mean)", "images_per_joule", "num"),
                                            ("USD per 10⁶ images (mean)", "cost_per_million_images_usd", "num"),
                                            ("energy measured", "measured", "int"),
                                            ("energy estimated", "estimated", "int")],
                       report["efficiency"],
                       empty="No energy or cost figures in this range (hosts without a price, GPUs without a TDP "
                             "and cases without telemetry have none)."))
    parts.append(_left_out(report, "efficiency-left-out", "why_energy"))

    parts.append("<h3>Latest run: cost and energy per unit of the primary metric</h3>")
    parts.append('<p class="meta">Per metric and GPU model: the run\'s cost (energy) ÷ the work its cases did at the '
                 "measured rate (value × wall time): $ and Wh per 10⁶ images or samples, per GB moved. Rate metrics "
                 "where higher is better only. Wh per unit sums the cases' energy as it came, measured or estimated: "
                 "the last two columns count each.</p>")
    rows = [{**r, "metric_text": f"{r['metric']} [{r['unit']}]"} for r in report.get("unit_costs") or []]
    parts.append(table("unit-cost-table", [("metric", "metric_text", "text"), ("GPU model", "gpu", "text"),
                                           ("cases", "n", "int"), ("per", "per", "text"),
                                           ("USD per unit", "cost_per_unit_usd", "num"),
                                           ("Wh per unit", "energy_per_unit_wh", "num"),
                                           ("energy measured", "measured", "int"),
                                           ("energy estimated", "estimated", "int")],
                       rows, empty="No rate metric with a cost or energy figure in the latest run."))

    run = report["latest_run"]
    parts.append("<h2>Latest run: failures by class</h2>")
    if run:
        parts.append(f'<p class="meta" id="latest-run" data-run-id="{escape(run["run_id"])}">'
                     f'run {escape(run["run_id"])} '
                     f'({escape(run["dag_id"])}, {_v(run["logical_date"], "date")}): {run["total"]} case(s), '
                     f'{run["ok"]} ok, {run["failed"]} failed, {run["skipped"]} skipped</p>')
    parts.append(_plots(charts, "failures", plot_files))
    rows = [{**f, "hosts_text": ", ".join(f"{h} ×{n}" for h, n in sorted(f["hosts"].items()))}
            for f in report["failures"]]
    parts.append(table("failures-table", [("failure class", "failure_class", "text"), ("status", "status", "text"),
                                          ("cases", "count", "int"), ("hosts", "hosts_text", "text")],
                       rows, empty="No failed or skipped case in the latest run."))

    parts.append("<h2>Change against baseline, host × case</h2>")
    parts.append(_change_map(report.get("change_map") or {}))
    parts.append("<h2>Open regressions</h2>")
    parts.append('<p class="meta">Confirmed: found on consecutive nights (or a new driver, CUDA driver, image or '
                 "health state whose nights together are worse), open until accepted (`fleetbench regressions "
                 "accept`) or recovered. Each metric is judged in its own direction (↑ higher is better, ↓ "
                 "lower); baseline and value are in the unit shown next to the metric. Time, energy and cost "
                 "findings that repeat a primary metric's finding are marked \u201csame change\u201d. Detectable: "
                 "the smallest change one night of that case can show.</p>")
    columns = [
        ("severity", "sev_html", "html"), ("host", "host", "text"), ("case", "case", "text"),
        ("metric", "metric", "text"), ("baseline", "baseline_value", "num"), ("value", "value", "num"),
        ("change", "delta_pct", "pct"), ("detectable", "detectable_pct", "pct"), ("since", "since_date", "date"),
        ("night", "logical_date", "date"), ("what changed", "changes_text", "text"),
        ("GPU health (newest check)", "gpu_health", "text")]
    parts.append(table("regressions-table", columns, _findings(report["regressions"]), row_class=_health_class,
                       empty="No open regressions."))
    parts.append("<h3>Suspected (one night, not confirmed)</h3>")
    parts.append(table("suspected-table", columns, _findings(report.get("suspected", [])),
                       empty="No suspected regressions on the newest nights."))
    parts.append("<h3>Improvements</h3>")
    parts.append(table("improvements-table", [("status", "status", "text")] + columns[1:],
                       _findings(report.get("improvements", [])), empty="No improvements on the newest nights."))
    parts += _capacity_section(report, charts, plot_files)
    parts.append("</body></html>")
    return "".join(parts)



def _capacity_section(report: dict, charts: Sequence[Chart], plot_files: dict[str, str] | None) -> list[str]:
    """Capacity profiles (fleetbench.capacity): the line per profile and its evidence, plots of memory vs batch."""
    profiles = report.get("capacity") or []
    margin = profiles[0]["margin_pct"] if profiles else 10.0  # the margin the fit suggested with (fleet.capacity)
    rows = [{"profile": " · ".join(filter(None, (p["model"], p["precision"], p["device"], p["harness"],
                                                  p.get("variant"), p.get("benchmark")))),
             "line": (f"{p['intercept_mib']:.1f} + {p['slope_mib_per_sample']:.4g} × batch"
                      if p["slope_mib_per_sample"] is not None else f"none: {p['reason']}"),
             "n": p["n"], "spread": p["spread_mib"],
             "ooms": "; ".join(f"batch {o['batch']} with {o['capacity_mib']:.0f} MiB" for o in p["ooms"]) or "–",
             "misses": len(p["misses"]),
             "fits": "; ".join(f"{f['capacity_mib']:.0f} MiB: {f['largest_batch']}" for f in p["fits"]
                               if f["largest_batch"] is not None) or "–"}
            for p in profiles]
    return ["<h2>Capacity: peak memory per batch</h2>",
            '<p class="meta">Per harness, model, precision, device kind and benchmark (and torch_synthetic\'s '
            'channels_last and compile): peak memory per device (GPU memory, '
            'or the container\'s for CPU cases) of ok results against the batch per device, a repeated-median line '
            '(± its spread), OOMs at the memory they had, and misses (an OOM the plan predicted to fit). All '
            'results of the model, not only this window\'s.</p>',
            _plots(charts, "capacity-", plot_files),
            table("capacity-table", [("profile", "profile", "text"), ("peak MiB per device", "line", "text"),
                                     ("points", "n", "int"), ("± MiB", "spread", "num"),
                                     ("OOMs on record", "ooms", "text"), ("misses", "misses", "int"),
                                     (f"largest batch that fits (memory less {margin:g} %)", "fits", "text")],
                  rows, empty="No memory readings yet.")]
