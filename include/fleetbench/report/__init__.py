"""Results for people: the warehouse as an HTML report with plots (`fleetbench report`, the DAG's
`report` task) and as a view in the Airflow UI (`fleetbench.report.web`, loaded by
`plugins/fleetbench_plugin.py`). All three read through `queries.build_report`.

    queries.py  the warehouse queries (set-based SQL), each returning plain data; filters and their validation
    plots.py    plot specs from that data, drawn as inline SVG, as SVG files and as PNG files (matplotlib)
    render.py   the self-contained HTML page
    web.py      the FastAPI app of the UI view
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from fleetbench.report.queries import FilterError, Filters, build_report, parse_filters

__all__ = ["Filters", "FilterError", "build_report", "parse_filters", "write_report", "default_report_dir"]

HTML_NAME, JSON_NAME, PLOT_PREFIX = "report.html", "report.json", "plot-"
PLOT_FORMATS = ("png", "svg")
SVG_HEAD = '<?xml version="1.0" encoding="UTF-8"?>\n'


def default_report_dir() -> Path:
    """`<FLEETBENCH_DATA_DIR>/reports` (default `.data/reports`)."""
    from fleetbench.paths import data_dir

    return data_dir() / "reports"


def _write_atomic(path: Path, data: bytes) -> None:
    """Write next to the target, then rename: a reader sees the old file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_report(out_dir: str | Path | None = None, filters: Filters | None = None, engine=None,
                 capacity_settings=None, plot_format: str = "png") -> dict:
    """Write report.html (self-contained), report.json (the same data) and one file per plot into `out_dir`:
    `plot-<id>.png` (matplotlib; `fleetbench report`), or with `plot_format="svg"` `plot-<id>.svg`, the page's
    own inline SVG as a file (the DAG's report task: no matplotlib to import, ~0.8 s less a run).
    `capacity_settings`: the fleet's `fleet.capacity` (a `capacity.Settings`) for the capacity section.

    Plot files the new report no longer has (`plot-*.png`, `plot-*.svg` only) are removed, so the folder always
    holds one consistent report. Returns the paths written, the report's state and its summary.
    """
    from fleetbench.report.plots import charts as make_charts
    from fleetbench.report.render import render_html
    from fleetbench.warehouse import get_engine

    if plot_format not in PLOT_FORMATS:
        raise ValueError(f"plot_format {plot_format!r}: one of {', '.join(PLOT_FORMATS)}")
    out = Path(out_dir) if out_dir else default_report_dir()
    out.mkdir(parents=True, exist_ok=True)
    own_engine = engine is None
    engine = engine or get_engine()
    try:
        report = build_report(engine, filters, capacity_settings=capacity_settings)
    finally:
        if own_engine:
            engine.dispose()
    charts = make_charts(report)
    files = {}
    for chart in charts:
        name = f"{PLOT_PREFIX}{chart.id}.{plot_format}"
        if plot_format == "svg":
            from fleetbench.report.plots import to_svg

            _write_atomic(out / name, (SVG_HEAD + to_svg(chart) + "\n").encode())
        else:
            from fleetbench.report.plots import to_png

            fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.", suffix=".png")  # its own: reports may run at once
            os.close(fd)
            try:
                to_png(chart, Path(tmp))
                os.chmod(tmp, 0o644)
                os.replace(tmp, out / name)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        files[chart.id] = name
    for fmt in PLOT_FORMATS:
        for old in out.glob(f"{PLOT_PREFIX}*.{fmt}"):
            if old.name not in files.values():
                old.unlink(missing_ok=True)
    _write_atomic(out / JSON_NAME, json.dumps(report, indent=2, default=str).encode())
    _write_atomic(out / HTML_NAME, render_html(report, charts, plot_files=files).encode())
    return {"html": str(out / HTML_NAME), "json": str(out / JSON_NAME), "plots": [str(out / p) for p in files.values()],
            "state": report["state"], "summary": report["summary"], "window": report["window"],
            "notes": report["notes"]}
