"""Results as a pandas DataFrame: pivots of the primary metric along any two dimensions the rows carry, and the
table written as Parquet, CSV or JSON (`fleetbench results --pivot`, `--format parquet`).

A pivot aggregates one value column (default `value`, the primary metric) over the cells of ROWS x COLUMNS (e.g.
model x host), by its median unless told otherwise. It needs the rows to share one primary metric and unit (a
median of images/sec and GB/s means nothing): `--metric` picks one when they do not.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Sequence

AGGREGATES = ("median", "mean", "min", "max", "count")
# Columns a pivot can group by: what describes a case or where and when it ran (not measurements, not long text).
PIVOT_FIELDS = ("host", "model", "case_key", "benchmark", "harness", "metric", "unit", "batch_size_per_device",
                "batch_size_global", "num_gpus", "precision", "device", "variable_update", "gpu_model",
                "gpu_catalog_name", "driver_version", "cuda_driver_version", "image_name", "image_digest", "status",
                "failure_class", "host_gpu_health", "dag_id", "run_id", "date", "attempt")
# Value columns: the primary metric and the numbers derived around it.
PIVOT_VALUES = ("value", "images_per_sec", "duration_s", "energy_j", "cost_usd", "cost_per_unit_usd",
                "energy_per_unit_wh", "mean_power_w", "speedup_efficiency", "step_cv", "peak_mem_mib")


class FrameError(ValueError):
    """A pivot or output the rows cannot give: names the flag and the value."""


def results_frame(rows: Sequence[dict]):
    """The rows as a DataFrame; `date` (the logical date's UTC day, YYYY-MM-DD) added for pivots by day."""
    import pandas as pd

    from fleetbench.timestamps import utc

    frame = pd.DataFrame(list(rows))
    # pandas makes an integer column with a NULL in it float64 (batch size 64 of a fleet with NCCL cases would be
    # labelled "64.0"): nullable integers instead.
    for column in _integer_columns() & set(frame.columns[frame.dtypes == "float64"]):
        frame[column] = frame[column].astype("Int64")
    if "logical_date" in frame:
        frame["date"] = frame["logical_date"].map(lambda v: None if v is None else utc(v).date().isoformat())
    return frame


def write_parquet_batches(rows: Iterable[dict], path, *, batch: int = 20000,
                          before_empty: Callable[[], None] | None = None) -> int:
    """`rows` (result rows, as `results_frame` takes them) to the Parquet file `path`, `batch` rows per row group,
    so an export of every night holds one batch in memory. Each column has one type across the batches (a column
    NULL in one batch and set in the next): integers nullable (pandas Int64), the warehouse's float columns float,
    the rest text. No row: `before_empty()` (which may raise) runs first, then an empty file is written, as
    `write_frame` writes an empty frame. Returns the number of rows written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    integers, floats = _integer_columns(), _float_columns()
    writer, schema, count = None, None, 0
    try:
        for part in _batches(rows, batch):
            frame = results_frame(part)
            for column in integers & set(frame.columns):
                frame[column] = frame[column].astype("Int64")
            if schema is None:
                fields = [pa.field(c, pa.int64() if c in integers else pa.float64() if c in floats
                                   else pa.bool_() if frame[c].dtype == bool else pa.string()) for c in frame.columns]
                schema = pa.Table.from_pandas(frame, schema=pa.schema(fields), preserve_index=False).schema
                writer = pq.ParquetWriter(path, schema)
            writer.write_table(pa.Table.from_pandas(frame[schema.names], schema=schema, preserve_index=False))
            count += len(frame)
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        if before_empty is not None:
            before_empty()
        write_frame(results_frame([]), "parquet", path, index=False)
    return count


def _batches(rows: Iterable[dict], size: int) -> Iterator[list[dict]]:
    part: list[dict] = []
    for row in rows:
        part.append(row)
        if len(part) == size:
            yield part
            part = []
    if part:
        yield part


def _float_columns() -> set[str]:
    """The float columns of result rows, and the per-unit figures `fleetbench.metrics.per_unit` adds."""
    from sqlalchemy import Float

    from fleetbench.warehouse.schema import benchmark_results

    return {c.name for c in benchmark_results.columns if isinstance(c.type, Float)} | {
        "cost_per_unit_usd", "energy_per_unit_wh"}


def _integer_columns() -> set[str]:
    """The integer columns of result rows and attempts."""
    from sqlalchemy import Integer

    from fleetbench.warehouse.schema import benchmark_results, superseded_results

    return {c.name for t in (benchmark_results, superseded_results) for c in t.columns
            if isinstance(c.type, Integer)}


def parse_pivot(spec: str) -> tuple[str, str]:
    """'ROWS:COLUMNS' (also 'ROWS x COLUMNS') -> (rows, columns), each a `PIVOT_FIELDS` name."""
    text = spec.strip()
    parts = text.split(":") if ":" in text else text.split(" x ") if " x " in text else [text]
    names = [p.strip() for p in parts]
    if len(names) != 2 or not all(names):
        raise FrameError(f"--pivot {spec!r}: give ROWS:COLUMNS, e.g. model:host")
    for name in names:
        if name not in PIVOT_FIELDS:
            raise FrameError(f"--pivot {spec!r}: unknown field {name!r} (fields: {', '.join(PIVOT_FIELDS)})")
    if names[0] == names[1]:
        raise FrameError(f"--pivot {spec!r}: rows and columns are the same field")
    return names[0], names[1]


def pivot(frame, spec: str, value: str = "value", agg: str = "median"):
    """The ok rows' `value` per ROWS x COLUMNS cell, aggregated by `agg`; NaN where a cell has no row."""
    index, columns = parse_pivot(spec)
    if value not in PIVOT_VALUES:
        raise FrameError(f"--value {value!r}: not a value column (values: {', '.join(PIVOT_VALUES)})")
    if agg not in AGGREGATES:
        raise FrameError(f"--agg {agg!r}: one of {', '.join(AGGREGATES)}")
    if frame.empty:
        raise FrameError("no results to pivot")
    ok = frame[frame["status"] == "ok"] if "status" in frame else frame
    ok = ok[ok[value].notna()] if value in ok else ok.iloc[0:0]
    if value in ("value", "cost_per_unit_usd", "energy_per_unit_wh"):
        kinds = sorted({f"{m} [{u}]" for m, u in zip(ok.get("metric", []), ok.get("unit", []))})
        if len(kinds) > 1:
            raise FrameError(f"the rows have {len(kinds)} primary metrics ({', '.join(kinds)}): pick one with "
                             "--metric NAME")
    if ok.empty:
        raise FrameError(f"no ok result has a {value!r} to pivot")
    table = ok.pivot_table(index=index, columns=columns, values=value, aggfunc=agg)
    if table.empty:
        raise FrameError(f"no ok result has both a {index!r} and a {columns!r} to pivot on")
    table.columns = [str(c) for c in table.columns]
    table.index = [str(i) for i in table.index]
    table.index.name = index
    table.columns.name = columns
    return table


def write_frame(frame, fmt: str, out: Any, *, index: bool) -> None:
    """`frame` as `fmt` (table, csv, json, parquet) to the text stream or path `out` (parquet: a path only)."""
    if fmt == "parquet":
        frame.to_parquet(out, index=index)
    elif fmt == "csv":  # text cells and labels (run ids, hosts) as a spreadsheet shows them, not as formulas
        from fleetbench.report.render import csv_cell

        frame = frame.map(csv_cell)
        frame.index = frame.index.map(csv_cell)
        frame.columns = frame.columns.map(csv_cell)
        frame.to_csv(out, index=index)
    elif fmt == "json":
        out.write(frame.to_json(orient="split" if index else "records", date_format="iso", indent=2) + "\n")
    else:
        out.write(frame.to_string(na_rep="-", float_format=lambda v: f"{v:.6g}") + "\n")
