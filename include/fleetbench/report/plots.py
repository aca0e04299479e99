"""The report's plots: specs built from the report data, drawn as inline SVG (the HTML and the UI view)
and as PNG files (matplotlib, Agg backend) from the same spec.

A spec is plain data: a `LineChart` (dates on x: each case's primary metric per host, one metric and
unit per chart, with driver changes as vertical markers) or a `BarChart` (categories on x, one bar per
series in each group, an optional reference line). The SVG is drawn here without dependencies, so the
Airflow UI view never imports matplotlib; each point and bar carries its exact value in `data-value`
(and a `<title>` tooltip), which the browser test reads back.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from html import escape
from pathlib import Path

from fleetbench.report.queries import aware

PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"]
WIDTH, HEIGHT = 760, 340
MARGIN = {"left": 70, "right": 20, "top": 36, "bottom": 70}
LEGEND_ROW = 16


@dataclass
class Series:
    label: str
    points: list[tuple[datetime, float]] = field(default_factory=list)  # line charts
    values: list[float | None] = field(default_factory=list)  # bar charts, one per category


@dataclass
class Marker:
    x: datetime
    label: str


@dataclass
class LineChart:
    id: str
    title: str
    y_label: str
    series: list[Series]
    markers: list[Marker] = field(default_factory=list)
    metric: str = "images_per_sec"  # what the y axis is: one metric, one unit, one direction per chart
    unit: str = "images/s"
    better: str = "higher"
    kind: str = "line"


@dataclass
class BarChart:
    id: str
    title: str
    y_label: str
    categories: list[str]
    series: list[Series]
    reference: float | None = None  # a horizontal line, e.g. 1.0 = linear scaling
    reference_label: str = ""
    integer: bool = False  # counts: whole-number ticks
    kind: str = "bar"


@dataclass
class ScatterChart:
    """Numbers on both axes: points per series, and lines (e.g. a fitted line) drawn through their points."""

    id: str
    title: str
    x_label: str
    y_label: str
    series: list[Series]  # points as (x, y) numbers
    lines: list[Series] = field(default_factory=list)
    kind: str = "scatter"


Chart = LineChart | BarChart | ScatterChart


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_.-")[:80] or "x"


# -- specs from the report --------------------------------------------------------------------------
def charts(report: dict) -> list[Chart]:
    """Every plot of a report, in the order the page shows them (sections without data have none)."""
    out: list[Chart] = []
    out += throughput_charts(report)
    for chart in (scaling_chart(report), *efficiency_charts(report), failures_chart(report)):
        if chart is not None:
            out.append(chart)
    return out + capacity_charts(report)


def capacity_charts(report: dict) -> list[ScatterChart]:
    """One chart per capacity profile with points: peak memory per device against batch per device (ok
    results), the fitted line, OOMs on record (at the memory they died with) and misses."""
    out = []
    for p in report.get("capacity") or []:
        # the variant: "" for most; the benchmark: two benchmarks of one model are two profiles (one chart each)
        features = (p["precision"], p["device"], p["harness"], p.get("variant"), p.get("benchmark"))
        name = f"{p['model']} ({', '.join(filter(None, features))})"
        series = [Series("ok: peak memory", points=[(float(b), float(m)) for b, m in p["points"]])]
        if p["ooms"]:
            series.append(Series("OOM (at the memory it had)",
                                 points=[(float(o["batch"]), float(o["capacity_mib"])) for o in p["ooms"]]))
        misses = [(float(m["batch_size_per_device"]), float(m["capacity_mib"])) for m in p["misses"]
                  if m.get("batch_size_per_device") and m.get("capacity_mib")]
        if misses:
            series.append(Series("miss: predicted to fit, died of OOM", points=misses))
        lines = []
        if p["slope_mib_per_sample"] is not None:
            hi = max([x for s in series for x, _ in s.points] or [1.0]) * 1.1
            a, b = p["intercept_mib"], p["slope_mib_per_sample"]
            lines.append(Series(f"fit: {a:.1f} + {b:.4g} × batch ± {p['spread_mib']:.1f} MiB",
                                points=[(0.0, a), (hi, a + b * hi)]))
        if any(s.points for s in series):
            out.append(ScatterChart(id=f"capacity-{slug(name)}", title=f"Peak memory: {name}",
                                    x_label="batch per device", y_label="MiB per device", series=series,
                                    lines=lines))
    return out


def devices_text(num_gpus: int | None, mig_profile: str | None = None, nodes: int | None = None) -> str:
    """'CPU', '2 GPUs', '2 x 1g.10gb' (MIG instances), '8 GPUs x 2 nodes'."""
    text = ("CPU" if not num_gpus else f"{num_gpus} × {mig_profile}" if mig_profile
            else f"{num_gpus} GPU" + ("s" if num_gpus != 1 else ""))
    return text + (f" × {nodes} nodes" if nodes and nodes > 1 else "")


def throughput_charts(report: dict) -> list[LineChart]:
    """One chart per model, device count and primary metric with its unit: the metric of each host and case per
    night (or, at fleet scale, the fleet's median images/sec per case and GPU type), driver changes of those hosts
    marked. A 1-GPU and an 8-GPU case differ ~8x: on one axis the 1-GPU lines would sit flat at the bottom, so they
    never share one; nor do two metrics or units (images/s, GB/s, ms). Ids: `throughput-<model>[_g<N>]` for
    images/sec, `throughput-<model>[_g<N>]-<metric>-<unit>` for any other metric; a command case without a model is
    charted under its benchmark's name. A lower-is-better metric says so in its title and axis."""
    fleet = report.get("throughput_mode") == "fleet"
    by_chart: dict[tuple, list[dict]] = {}
    for s in report["throughput"]:
        key = (s["model"] or s.get("benchmark") or "unknown", s.get("num_gpus") or 0, s.get("mig_profile") or "",
               s.get("nodes") or 1, s.get("metric") or "images_per_sec", s.get("unit") or "images/s",
               s.get("better") or "higher")
        by_chart.setdefault(key, []).append(s)
    out = []
    for (model, gpus, mig, nodes, metric, unit, better), series in sorted(by_chart.items()):
        if fleet:  # every host's change would be a line of its own: one marker per night and change
            changes: dict[tuple, int] = {}
            for c in report["driver_changes"]:
                key = (c["logical_date"], c["from"], c["to"])
                changes[key] = changes.get(key, 0) + 1
            markers = [Marker(aware(night), f"{n} host{'s' if n != 1 else ''}: driver {old} → {new}")
                       for (night, old, new), n in sorted(changes.items())]
        else:
            hosts = {s["host"] for s in series}
            markers = [Marker(aware(c["logical_date"]), f"{c['host']}: driver {c['from']} → {c['to']}")
                       for c in report["driver_changes"] if c["host"] in hosts]
        images = (metric, unit) == ("images_per_sec", "images/s")
        base = slug(model + (f" g{gpus}" if gpus else "") + (f" mig {mig}" if mig else "")
                    + (f" n{nodes}" if nodes > 1 else ""))
        lower = better == "lower"
        out.append(LineChart(
            id=f"throughput-{base}" if images else f"throughput-{base}-{slug(metric)}-{slug(unit)}",
            title=("Throughput" if images else metric) + f": {model}, {devices_text(gpus, mig, nodes)}"
            + (" (fleet median)" if fleet else "") + (" — lower is better" if lower else ""),
            y_label="images/sec" if images else unit + (" (lower is better)" if lower else ""),
            series=[Series(label=s.get("label") or f"{s['host']} · {s['case_key']}",
                           points=[(aware(p["logical_date"]), p["value"]) for p in s["points"]])
                    for s in series],
            markers=markers, metric=metric, unit=unit, better=better))
    return out


def scaling_chart(report: dict) -> BarChart | None:
    rows = report["scaling"]
    if not rows:
        return None
    gpus = sorted({r["num_gpus"] for r in rows})
    # a model on whole GPUs and on N instances of a MIG profile are series of their own
    models = sorted({(r["model"], r.get("mig_profile") or "") for r in rows})
    mean = {(r["model"], r.get("mig_profile") or "", r["num_gpus"]): r["mean"] for r in rows}
    return BarChart(id="scaling", title="Scaling efficiency per GPU count (mean)", y_label="speedup efficiency",
                    categories=[f"{g} GPU" + ("s" if g != 1 else "") for g in gpus],
                    series=[Series(label=m + (f" · MIG {mig}" if mig else ""),
                                   values=[mean.get((m, mig, g)) for g in gpus]) for m, mig in models],
                    reference=1.0, reference_label="linear")


def efficiency_charts(report: dict) -> list[BarChart]:
    rows = report["efficiency"]
    gpus = sorted({r["gpu"] for r in rows})
    models = sorted({r["model"] for r in rows})
    out = []
    for key, cid, title, unit in (("images_per_joule", "images-per-joule", "Images per joule per GPU model",
                                   "images/J"),
                                  ("cost_per_million_images_usd", "cost-per-million",
                                   "Cost per million images per GPU model", "USD per 10⁶ images")):
        val = {(r["gpu"], r["model"]): r[key] for r in rows if r[key] is not None}
        if not val:
            continue
        out.append(BarChart(id=cid, title=title, y_label=unit, categories=gpus,
                            series=[Series(label=m, values=[val.get((g, m)) for g in gpus]) for m in models]))
    return out


def failures_chart(report: dict) -> BarChart | None:
    rows = report["failures"]
    if not rows:
        return None
    return BarChart(id="failures", title="Latest run: cases by failure class", y_label="cases",
                    categories=[f"{r['failure_class']} ({r['status']})" for r in rows],
                    series=[Series(label="cases", values=[float(r["count"]) for r in rows])], integer=True)


# -- axes ---------------------------------------------------------------------------------------------
def nice_ticks(lo: float, hi: float, count: int = 5, integer: bool = False) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2, 2.5, 5 x 10^k steps; whole numbers with `integer`)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1, math.ceil(step))
    first = math.floor(lo / step)
    ticks = [round(first * step, 10)]
    while ticks[-1] < hi:  # up to the first tick at or above hi
        ticks.append(round((first + len(ticks)) * step, 10))
    return ticks


def fmt(value: float) -> str:
    """Short number text for axes and tooltips."""
    if value == 0:
        return "0"
    a = abs(value)
    if a >= 1e5:
        return f"{value:,.0f}"
    if a >= 100:
        return f"{value:.0f}" if value == round(value) else f"{value:.1f}"
    if a >= 1:
        return f"{value:.2f}".rstrip("0").rstrip(".")
    return f"{value:.3g}"


LINE_PAD = 0.1  # a line chart's axis reaches this fraction of the values' spread beyond them


def y_range(chart: Chart, values: list[float]) -> tuple[float, float]:
    """The values' axis before rounding to ticks. Bars and scatter points start at 0 (a bar's length is its
    value). A line chart fits its values, padded: a 5 % drop of a host on a 0-based axis is 5 % of the plot's
    height and looks flat; fitted it spans the plot. One value (or all equal): +-10 % of it."""
    if not values:
        return 0.0, 1.0
    lo, hi = min(values), max(values)
    if chart.kind != "line":
        return min(lo, 0.0), hi
    pad = (hi - lo) * LINE_PAD or abs(hi) * LINE_PAD or 1.0
    low = lo - pad
    return (0.0 if lo >= 0 > low else low), hi + pad  # never below 0 for values that cannot be negative


def _time_range(chart: LineChart) -> tuple[datetime, datetime]:
    xs = [x for s in chart.series for x, _ in s.points] + [m.x for m in chart.markers]
    lo, hi = min(xs), max(xs)
    if hi - lo < timedelta(hours=1):  # one night: a two-day span centred on it
        lo, hi = lo - timedelta(days=1), hi + timedelta(days=1)
    pad = (hi - lo) * 0.04
    return lo - pad, hi + pad


def _time_ticks(lo: datetime, hi: datetime, count: int = 6, nights: list[datetime] | None = None) -> list[datetime]:
    """The nights themselves when there are few, else every k-th midnight."""
    if nights and len(set(nights)) <= 8:
        return sorted(set(nights))
    span_days = (hi - lo).total_seconds() / 86400
    step = max(1, math.ceil(span_days / count))
    first = datetime(lo.year, lo.month, lo.day, tzinfo=timezone.utc) + timedelta(days=1)
    out, t = [], first
    while t <= hi:
        out.append(t)
        t += timedelta(days=step)
    return out or [lo + (hi - lo) / 2]


# -- SVG ----------------------------------------------------------------------------------------------
def to_svg(chart: Chart) -> str:
    """The chart as an inline <svg> element (no scripts, no external references)."""
    legend = ([s.label for s in chart.series] if (len(chart.series) > 1 or chart.kind == "line") else []) + [
        s.label for s in getattr(chart, "lines", [])]
    legend_h = LEGEND_ROW * math.ceil(len(legend) / 2) if legend else 0
    height = HEIGHT + legend_h
    x0, x1 = MARGIN["left"], WIDTH - MARGIN["right"]
    y0, y1 = HEIGHT - MARGIN["bottom"], MARGIN["top"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" id="plot-{escape(chart.id)}" '
             f'data-kind="{chart.kind}" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" '
             f'role="img" aria-label="{escape(chart.title)}">',
             f'<title>{escape(chart.title)}</title>',
             f'<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#fff"/>',
             f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="14" font-weight="bold">'
             f'{escape(chart.title)}</text>',
             f'<text transform="translate(16 {(y0 + y1) / 2}) rotate(-90)" text-anchor="middle" font-size="11">'
             f'{escape(chart.y_label)}</text>']
    values = ([y for s in chart.series for _, y in s.points] if chart.kind == "line"
              else [y for s in (*chart.series, *chart.lines) for _, y in s.points] if chart.kind == "scatter"
              else [v for s in chart.series for v in s.values if v is not None])
    if chart.kind == "bar" and chart.reference is not None:
        values.append(chart.reference)
    ymin, ymax = y_range(chart, values)
    ticks = nice_ticks(ymin, ymax, integer=getattr(chart, "integer", False))
    ymin, ymax = ticks[0], ticks[-1]

    def ypos(v: float) -> float:
        return y0 - (v - ymin) / ((ymax - ymin) or 1.0) * (y0 - y1)

    for t in ticks:
        parts.append(f'<line x1="{x0}" x2="{x1}" y1="{ypos(t):.1f}" y2="{ypos(t):.1f}" stroke="#e5e5e5"/>')
        parts.append(f'<text x="{x0 - 6}" y="{ypos(t) + 4:.1f}" text-anchor="end" font-size="10">{fmt(t)}</text>')
    parts.append(f'<line x1="{x0}" x2="{x1}" y1="{y0}" y2="{y0}" stroke="#333"/>')
    parts.append(f'<line x1="{x0}" x2="{x0}" y1="{y0}" y2="{y1}" stroke="#333"/>')
    if chart.kind == "line":
        parts += _svg_lines(chart, x0, x1, y0, y1, ypos)
    elif chart.kind == "scatter":
        parts += _svg_scatter(chart, x0, x1, y0, ypos)
    else:
        parts += _svg_bars(chart, x0, x1, y0, ypos)
    for i, label in enumerate(legend):
        lx = 20 + (i % 2) * (WIDTH / 2)
        ly = HEIGHT - 10 + LEGEND_ROW * (i // 2)
        color = PALETTE[i % len(PALETTE)]
        parts.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{color}"/>'
                     f'<text x="{lx + 14}" y="{ly}" font-size="11" class="legend">{escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _svg_lines(chart: LineChart, x0, x1, y0, y1, ypos) -> list[str]:
    lo, hi = _time_range(chart)
    span = (hi - lo).total_seconds()

    def xpos(t: datetime) -> float:
        return x0 + (t - lo).total_seconds() / span * (x1 - x0)

    parts = []
    for t in _time_ticks(lo, hi, nights=[x for s in chart.series for x, _ in s.points]):
        parts.append(f'<line x1="{xpos(t):.1f}" x2="{xpos(t):.1f}" y1="{y0}" y2="{y0 + 4}" stroke="#333"/>'
                     f'<text x="{xpos(t):.1f}" y="{y0 + 16}" text-anchor="middle" font-size="10">{t:%Y-%m-%d}</text>')
    for i, m in enumerate(chart.markers):
        x = xpos(m.x)
        parts.append(f'<g class="marker" data-label="{escape(m.label)}">'
                     f'<title>{escape(m.label)} ({m.x:%Y-%m-%d})</title>'
                     f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y0}" y2="{y1}" stroke="#c00" stroke-dasharray="4 3"/>'
                     f'<text x="{x + 3:.1f}" y="{y1 + 10 + 11 * (i % 3)}" font-size="10" fill="#c00">'
                     f'{escape(m.label)}</text></g>')
    for i, s in enumerate(chart.series):
        color = PALETTE[i % len(PALETTE)]
        pts = [(xpos(t), ypos(v), t, v) for t, v in s.points]
        parts.append(f'<g class="series" data-label="{escape(s.label)}">')
        if len(pts) > 1:
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="'
                         + " ".join(f"{x:.1f},{y:.1f}" for x, y, _, _ in pts) + '"/>')
        for x, y, t, v in pts:
            parts.append(f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}" '
                         f'data-value="{v!r}" data-x="{t.isoformat()}"><title>{escape(s.label)} {t:%Y-%m-%d}: '
                         f'{fmt(v)} {escape(chart.unit)}</title></circle>')
        parts.append("</g>")
    return parts


def _svg_scatter(chart: ScatterChart, x0, x1, y0, ypos) -> list[str]:
    xs = [x for s in (*chart.series, *chart.lines) for x, _ in s.points]
    ticks = nice_ticks(0.0, max(xs) if xs else 1.0)
    xmax = ticks[-1] or 1.0

    def xpos(x: float) -> float:
        return x0 + x / xmax * (x1 - x0)

    parts = [f'<text x="{(x0 + x1) / 2}" y="{y0 + 32}" text-anchor="middle" font-size="11">'
             f'{escape(chart.x_label)}</text>']
    for t in ticks:
        parts.append(f'<line x1="{xpos(t):.1f}" x2="{xpos(t):.1f}" y1="{y0}" y2="{y0 + 4}" stroke="#333"/>'
                     f'<text x="{xpos(t):.1f}" y="{y0 + 16}" text-anchor="middle" font-size="10">{fmt(t)}</text>')
    for s in chart.lines:
        pts = " ".join(f"{xpos(x):.1f},{ypos(y):.1f}" for x, y in s.points)
        parts.append(f'<g class="fit" data-label="{escape(s.label)}"><title>{escape(s.label)}</title>'
                     f'<polyline fill="none" stroke="#333" stroke-width="1.5" stroke-dasharray="6 3" '
                     f'points="{pts}"/></g>')
    for i, s in enumerate(chart.series):
        color = PALETTE[i % len(PALETTE)]
        parts.append(f'<g class="series" data-label="{escape(s.label)}">')
        for x, y in s.points:
            parts.append(f'<circle class="point" cx="{xpos(x):.1f}" cy="{ypos(y):.1f}" r="3.5" fill="{color}" '
                         f'data-value="{y!r}" data-x="{x!r}"><title>{escape(s.label)}: batch {fmt(x)}, '
                         f'{fmt(y)} MiB</title></circle>')
        parts.append("</g>")
    return parts


def _svg_bars(chart: BarChart, x0, x1, y0, ypos) -> list[str]:
    n_cat, n_ser = max(len(chart.categories), 1), max(len(chart.series), 1)
    group = (x1 - x0) / n_cat
    bar = group * 0.8 / n_ser
    rotate = max((len(c) for c in chart.categories), default=0) * 6 > group
    parts = []
    for ci, cat in enumerate(chart.categories):
        cx = x0 + group * (ci + 0.5)
        if rotate:
            parts.append(f'<text transform="translate({cx:.1f} {y0 + 12}) rotate(-25)" text-anchor="end" '
                         f'font-size="10">{escape(cat)}</text>')
        else:
            parts.append(f'<text x="{cx:.1f}" y="{y0 + 16}" text-anchor="middle" font-size="10">{escape(cat)}</text>')
    for si, s in enumerate(chart.series):
        color = PALETTE[si % len(PALETTE)]
        parts.append(f'<g class="series" data-label="{escape(s.label)}">')
        for ci, v in enumerate(s.values):
            if v is None:
                continue
            x = x0 + group * ci + group * 0.1 + bar * si
            top, base = ypos(max(v, 0)), ypos(0)
            parts.append(f'<rect class="bar" x="{x:.1f}" y="{top:.1f}" width="{bar:.1f}" '
                         f'height="{max(base - top, 0.5):.1f}" '
                         f'fill="{color}" data-value="{v!r}" data-category="{escape(chart.categories[ci])}">'
                         f'<title>{escape(s.label)}, {escape(chart.categories[ci])}: {fmt(v)}</title></rect>')
        parts.append("</g>")
    if chart.reference is not None:
        y = ypos(chart.reference)
        parts.append(f'<line class="reference" x1="{x0}" x2="{x1}" y1="{y:.1f}" y2="{y:.1f}" stroke="#333" '
                     f'stroke-dasharray="6 4"/><text x="{x1 - 4}" y="{y - 4:.1f}" text-anchor="end" font-size="10">'
                     f'{escape(chart.reference_label)}</text>')
    return parts


# -- PNG ----------------------------------------------------------------------------------------------
def to_png(chart: Chart, path: Path) -> Path:
    """The chart as a PNG file (matplotlib's Agg canvas on a Figure object: no pyplot state, thread-safe)."""
    fig = figure(chart)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def figure(chart: Chart):
    """The chart as a matplotlib Figure (what `to_png` writes)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH / 100, HEIGHT / 100 + 0.2 * math.ceil(len(chart.series) / 2)), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_title(chart.title, fontsize=11)
    ax.set_ylabel(chart.y_label)
    ax.grid(axis="y", color="#e5e5e5")
    if chart.kind == "line":
        for i, s in enumerate(chart.series):
            xs = [t.replace(tzinfo=None) for t, _ in s.points]
            ax.plot(xs, [v for _, v in s.points], marker="o", markersize=4, color=PALETTE[i % len(PALETTE)],
                    label=s.label)
        for m in chart.markers:
            ax.axvline(m.x.replace(tzinfo=None), color="#c00", linestyle="--", linewidth=1)
            ax.annotate(m.label, (m.x.replace(tzinfo=None), 1), xycoords=("data", "axes fraction"), fontsize=7,
                        color="#c00", rotation=90, va="top", ha="right")
        from matplotlib.dates import DateFormatter, DayLocator

        lo, hi = _time_range(chart)
        ax.set_xlim(lo.replace(tzinfo=None), hi.replace(tzinfo=None))
        nights = sorted({t for s in chart.series for t, _ in s.points})
        if len(nights) <= 8:
            ax.set_xticks([t.replace(tzinfo=None) for t in nights])
        else:
            ax.xaxis.set_major_locator(DayLocator(interval=max(1, math.ceil((hi - lo).days / 6))))
        ax.xaxis.set_major_formatter(DateFormatter("%Y-%m-%d"))
        ax.tick_params(axis="x", labelsize=8)
    elif chart.kind == "scatter":
        for i, s in enumerate(chart.series):
            ax.scatter([x for x, _ in s.points], [y for _, y in s.points], s=18, color=PALETTE[i % len(PALETTE)],
                       label=s.label, marker="o" if i == 0 else "x")
        for s in chart.lines:
            ax.plot([x for x, _ in s.points], [y for _, y in s.points], color="#333", linestyle="--", linewidth=1,
                    label=s.label)
        ax.set_xlabel(chart.x_label)
        ax.set_xlim(left=0)
    else:
        n = max(len(chart.series), 1)
        width = 0.8 / n
        for i, s in enumerate(chart.series):
            xs = [ci - 0.4 + width * (i + 0.5) for ci, v in enumerate(s.values) if v is not None]
            ax.bar(xs, [v for v in s.values if v is not None], width=width, color=PALETTE[i % len(PALETTE)],
                   label=s.label)
        ax.set_xticks(range(len(chart.categories)), chart.categories, rotation=20 if len(chart.categories) > 3 else 0,
                      ha="right" if len(chart.categories) > 3 else "center", fontsize=8)
        if chart.integer:
            from matplotlib.ticker import MaxNLocator

            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        if chart.reference is not None:
            ax.axhline(chart.reference, color="#333", linestyle="--", linewidth=1, label=chart.reference_label)
    if chart.kind == "line":
        ax.set_ylim(*y_range(chart, [v for s in chart.series for _, v in s.points]))
    elif chart.kind == "bar" or all(v >= 0 for s in chart.series for _, v in s.points):
        ax.set_ylim(bottom=0)
    if len(chart.series) > 1 or chart.kind in ("line", "scatter"):
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1 if chart.kind == "line" else -0.2), ncol=2,
                  frameon=False)
    fig.tight_layout()
    return fig
