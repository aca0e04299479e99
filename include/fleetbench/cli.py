"""The `fleetbench` command line.

    fleetbench config check FILE
    fleetbench results [--format table|json|csv|parquet] [--out FILE] [--run-id ID] [--dag-id ID] [--all]
                       [--since DATE] [--until DATE] [--host H]
                       [--attempts] [--metric NAME] [--pivot ROWS:COLUMNS [--value COLUMN] [--agg median|...]]
    fleetbench parse [--format auto|tf_cnn_benchmarks|horovod_synthetic|torch_synthetic|nccl_tests|command] FILE...
    fleetbench host-check (--facts DIR | --local [--docker-url URL]) [--image-cuda X.Y] [--gpus N]
                          [--format json|table] [--strict] [--dcgm-level N] [--probe-path DIR]
    fleetbench pools export [--config FILE]
    fleetbench compare --before SIDE --after SIDE [--host H] [--attempts] [--format table|json]
    fleetbench regressions list [--dag-id ID] [--host H] [--all]
    fleetbench regressions accept --host H [--case KEY] [--dag-id ID] [--note TEXT]
    fleetbench report [--since DATE] [--until DATE] [--host H] [--model M] [--dag-id ID] [--out DIR]
    fleetbench capacity [--model M] [--gpu-model G | --memory-gib N] [--margin-pct P] [--format table|json]
    fleetbench db upgrade

User mistakes end with a one-line message naming what is wrong and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import json
import math
import re
import sys
from pathlib import Path
from typing import Sequence

RESULT_TABLE = [  # (header, column); the case names the benchmark, model, batch per device and its other axes
    ("host", "host"), ("case", "case_key"), ("GPUs", "num_gpus"), ("status", "status"), ("metric", "metric"),
    ("value", "value"), ("duration s", "duration_s"),
    ("energy Wh", "energy_j"), ("cost $", "cost_usd"), ("$ per unit", "cost_per_unit_usd"),
    ("Wh per unit", "energy_per_unit_wh"), ("image digest", "image_digest"),
]
# `results --attempts`: which attempt, whether it is the current one, and what it ran under: driver, CUDA
# driver, the GPUs' health (with the checks that did not pass) and the host check's verdict.
ATTEMPT_TABLE = [*RESULT_TABLE[:2], ("attempt", "attempt"), ("driver", "driver_version"),
                 ("CUDA", "cuda_driver_version"), ("GPU health", "host_gpu_health"), ("host check", "host_verdict"),
                 *RESULT_TABLE[3:]]


PATH_ARGUMENTS = ("file", "files", "out", "config", "facts", "save", "func")


class UsageError(Exception):
    """A mistake in what the user asked for: printed as one line, exit code 2."""


def _config_check(args: argparse.Namespace) -> int:
    from fleetbench.config import ConfigError, config_warnings, load_config

    try:
        cfg = load_config(args.file)
    except ConfigError as exc:
        for line in exc.errors:
            print(f"{exc.source}: {line}", file=sys.stderr)
        return 2
    for line in config_warnings(cfg):
        print(f"{args.file}: warning: {line}", file=sys.stderr)
    print("ok")
    return 0


def _cell(row: dict, column: str) -> str:
    value = row.get(column)
    if column == "status" and row.get("failure_class"):
        return f"{value} ({row['failure_class']})"
    if column == "num_gpus" and row.get("mig_profile"):  # MIG instances, not whole GPUs
        return f"{value}x MIG {row['mig_profile']}"
    multinode = (row.get("nodes") or 1) > 1
    if column == "num_gpus" and multinode:  # a multi-node row's total is its set's: GPUs per node x nodes
        return f"{value} x {row['nodes']} nodes"
    if column == "host" and multinode and row.get("host_set"):
        return "+".join(row["host_set"].split(","))
    if column == "images_per_sec":
        return "-" if value is None else f"{value:.2f}"
    legacy = not row.get("metric") and row.get("images_per_sec") is not None  # stored before rows named it
    if column == "metric":  # the primary metric, and which way is better
        value = "images_per_sec" if legacy else value
        return "-" if not value else f"{value} {'(lower better)' if row.get('better') == 'lower' else ''}".rstrip()
    if column == "value":
        value, unit = (row["images_per_sec"], "images/s") if legacy else (value, row.get("unit"))
        return "-" if value is None else f"{value:.6g}" + (f" {unit}" if unit else "")
    if column in ("cost_per_unit_usd", "energy_per_unit_wh"):  # energy with `~` when estimated
        mark = "~" if column == "energy_per_unit_wh" and row.get("energy_source") == "estimated" else ""
        return "-" if value is None else f"{mark}{value:.4g}/{row['per']}"
    if column == "duration_s":
        return "-" if value is None else f"{value:.1f}"
    if column == "energy_j":  # Wh, with `~` when estimated
        return "-" if value is None else f"{'~' if row.get('energy_source') == 'estimated' else ''}{value / 3600:.4f}"
    if column == "cost_usd":
        return "-" if value is None else f"{value:.6f}"
    if column == "image_digest":
        return "-" if not value else value[:19]
    if column == "attempt" and "current" in row:
        return f"{value} ({'current' if row['current'] else 'superseded'})"
    if column == "host_gpu_health" and value and row.get("host_gpu_health_issues"):
        return f"{value} ({row['host_gpu_health_issues']})"
    return "-" if value is None else str(value)


def format_table(rows: list[dict], columns: list[tuple[str, str]] = RESULT_TABLE) -> str:
    cells = [[h for h, _ in columns]] + [[_cell(r, c) for _, c in columns] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _results(args: argparse.Namespace) -> int:
    from fleetbench.warehouse.frames import PIVOT_VALUES, FrameError, parse_pivot

    if args.format == "parquet" and not args.out:
        raise UsageError("--format parquet writes a file: give --out FILE")
    if args.out and not Path(args.out).resolve().parent.is_dir():
        raise UsageError(f"--out {args.out}: no folder {Path(args.out).resolve().parent}")
    if args.pivot:
        try:
            parse_pivot(args.pivot)
        except FrameError as exc:
            raise UsageError(str(exc)) from None
        if args.value and args.value not in PIVOT_VALUES:
            raise UsageError(f"--value {args.value!r}: not a value column (values: {', '.join(PIVOT_VALUES)})")
    elif args.value or args.agg:
        raise UsageError("--value and --agg go with --pivot ROWS:COLUMNS")
    from fleetbench.report import FilterError, parse_filters

    try:
        window = parse_filters(since=args.since, until=args.until, host=args.host)
    except FilterError as exc:
        raise UsageError(f"--{exc.field}: {exc.message}") from None
    if args.run_id and (window.since or window.until):
        raise UsageError("--since and --until choose runs by date: give them or --run-id, not both")
    args.window = {"since": window.since, "until": window.until, "host": window.host}
    args.written = None  # parquet: the rows written, said once the file is in place
    try:
        with _out_file(args.out) if args.out else contextlib.nullcontext() as target:
            if target is None or args.format == "parquet":
                code = _write_results(args, target)
            else:
                try:
                    with open(target, "w", encoding="utf-8", newline="") as out, contextlib.redirect_stdout(out):
                        code = _write_results(args, target)
                except BrokenPipeError:
                    raise
                except OSError as exc:  # a full disk, a read-only file system
                    raise UsageError(f"--out {args.out}: {exc.strerror or exc}") from None
    except FrameError as exc:
        raise UsageError(str(exc)) from None
    if args.written is not None:
        print(f"wrote {args.written} row(s) to {args.out}")
    return code


@contextlib.contextmanager
def _out_file(path: str):
    """The path to write `--out`'s export to: a part file that becomes FILE once the command succeeded, so a mistake
    (an unknown run id, a typo in --metric) or an interrupted export (an error, Ctrl-C, SIGTERM) leaves an earlier
    export whole and no part behind. A new FILE is the part renamed; an existing one has the part copied into it,
    so it keeps its mode, owner, group and other names (hard links), and a teammate's file in a shared (sticky)
    folder is written as before. The part is made beside FILE, else (a folder that takes no new file) in the
    temporary folder. A FILE that is no regular file (/dev/stdout, a pipe) is written as it is; one that may not
    be written is refused before anything is read."""
    import os
    import shutil
    import signal
    import tempfile
    import threading

    given = Path(path)
    if given.exists() and not given.is_file():
        yield given
        return
    final = given.resolve()  # through a link: the file it names is written, the link kept
    existing = final.exists()
    if existing and not os.access(final, os.W_OK):
        raise UsageError(f"--out {path}: Permission denied")
    prefix = f".{final.name[:60]}."  # a FILE name near the limit must still leave room for the part's
    try:
        try:
            handle, name = tempfile.mkstemp(prefix=prefix, suffix=".part", dir=final.parent)
        except OSError:
            if not existing:  # a new FILE needs that folder anyway: say why it cannot be made
                raise
            handle, name = tempfile.mkstemp(prefix=prefix, suffix=".part")  # a folder that takes no new file
    except OSError as exc:
        raise UsageError(f"--out {path}: {exc.strerror or exc}") from None
    os.close(handle)
    part = Path(name)

    def terminated(signum, frame):  # as Ctrl-C: the part is removed on the way out
        raise SystemExit(128 + signum)

    main_thread = threading.current_thread() is threading.main_thread()  # signal handlers are set there only
    previous = signal.signal(signal.SIGTERM, terminated) if main_thread else None
    try:
        yield part
        try:
            if existing:
                with open(part, "rb") as source, open(final, "wb") as sink:
                    shutil.copyfileobj(source, sink, 1 << 20)
            else:  # as a new file open() makes: 0666 less the umask (mkstemp's is 0600)
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(part, 0o666 & ~umask)
                os.replace(part, final)
        except OSError as exc:
            raise UsageError(f"--out {path}: {exc.strerror or exc}") from None
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        part.unlink(missing_ok=True)


def _write_results(args: argparse.Namespace, target: Path | None = None) -> int:
    """The rows asked for, in `args.format`, to stdout (parquet: to `target`). The latest run's and table output
    are read whole; `--all`/`--run-id` exports in CSV, JSON and Parquet are written as the rows are read, so an
    export of every night holds a batch of rows in memory, not the warehouse."""
    from sqlalchemy.exc import SQLAlchemyError

    from fleetbench.metrics import per_unit
    from fleetbench.warehouse import dag_ids, existing_engine, warehouse_display_url
    from fleetbench.warehouse.attempts import fetch_attempts
    from fleetbench.warehouse.read import has_host, iter_results, latest_run

    engine = existing_engine()
    try:
        run_id, dag_id, window = args.run_id, args.dag_id, args.window
        if args.dag_id and args.dag_id not in (known := dag_ids(engine)):  # a typo would print "no results"
            raise UsageError(f"--dag-id {args.dag_id!r}: no run of that DAG in the warehouse (DAGs there: "
                             f"{', '.join(known) or 'none'})")
        if window.get("host") and not has_host(engine, window["host"]):  # as --dag-id: a typo is named
            raise UsageError(f"--host {window['host']!r}: no result of that host in the warehouse")
        every = args.all or window.get("since") or window.get("until")  # a window: every run in it
        if run_id is None and not every:  # the latest run: its DAG's rows only (DAGs on one cron share run ids)
            dag_id, run_id = latest_run(engine, args.dag_id) or (dag_id, None)
        if not (run_id or every):
            source = iter(())
        elif args.attempts:
            source = iter(fetch_attempts(engine, run_id=run_id, dag_id=dag_id, **window))
        else:
            source = iter_results(engine, run_id=run_id, dag_id=dag_id, **window)
        seen = _Seen()  # what was read before --metric chose: for the error when nothing is left
        rows = _metric_rows(({**r, **per_unit(r)} for r in source), args.metric, seen)
        seen.run_exists = lambda: _has_row(iter_results(engine, run_id=run_id, dag_id=dag_id, batch=1))
        return _output_results(args, rows, run_id, dag_id, target, seen)
    except SQLAlchemyError as exc:
        raise UsageError(f"cannot read the warehouse at {warehouse_display_url()}: {_first_line(exc)} "
                         "(run the DAG once, or `fleetbench db upgrade`)") from None
    finally:
        engine.dispose()


@dataclasses.dataclass
class _Seen:
    """The rows read before `--metric` chose, and their primary metrics; `run_exists()`: the run asked for has rows
    (it may have none of `--host`'s)."""

    rows: int = 0
    metrics: set = dataclasses.field(default_factory=set)
    run_exists: object = None


def _has_row(rows) -> bool:
    with contextlib.closing(rows):
        return next(rows, None) is not None


def _metric_rows(rows, metric: str | None, seen: _Seen):
    """The rows whose primary metric is `metric` (all when None); each row read is counted in `seen`."""
    for row in rows:
        seen.rows += 1
        if row.get("metric"):
            seen.metrics.add(row["metric"])
        if metric is None or row.get("metric") == metric:
            yield row


def _no_rows(args: argparse.Namespace, seen: _Seen) -> None:
    """The usage error for an export that matched no row, if it is one (before anything is written): a run id
    without results; a --metric that none of the rows read has."""
    if args.run_id and not seen.rows and (not args.host or not seen.run_exists()):
        raise UsageError(f"no results for run id {args.run_id!r}")
    if args.metric and seen.rows:
        raise UsageError(f"--metric {args.metric!r}: no result has that primary metric (these have: "
                         f"{', '.join(sorted(seen.metrics)) or 'none'})")


def _output_results(args, rows, run_id, dag_id, target, seen: _Seen) -> int:
    stream = (args.all or args.run_id or args.since or args.until) and not args.attempts and not args.pivot
    if args.format == "parquet" and stream:
        from fleetbench.warehouse.frames import write_parquet_batches

        try:
            count = write_parquet_batches(rows, target, before_empty=lambda: _no_rows(args, seen))
        except OSError as exc:
            raise UsageError(f"--out {args.out}: {exc.strerror or str(exc).splitlines()[0]}") from None
        args.written = count
        return 0
    if args.format in ("csv", "json") and stream:
        count = (_csv_stream if args.format == "csv" else _json_stream)(rows)
        if not count:
            _no_rows(args, seen)
            if args.format == "json":
                print("[]")
        return 0
    rows = list(rows)
    if not rows:
        _no_rows(args, seen)
    if args.pivot or args.format == "parquet":
        from fleetbench.warehouse.frames import pivot, results_frame, write_frame

        frame = results_frame(rows)
        if args.pivot:
            frame = pivot(frame, args.pivot, args.value or "value", args.agg or "median")
        try:
            write_frame(frame, args.format, target if args.format == "parquet" else sys.stdout,
                        index=bool(args.pivot))
        except BrokenPipeError:  # the reader stopped (`| head`): as the other formats, not a usage error
            raise
        except OSError as exc:
            raise UsageError(f"--out {args.out}: {exc.strerror or str(exc).splitlines()[0]}") from None
        if args.format == "parquet":
            args.written = len(frame)
        return 0
    if args.format == "json":
        _json_out(rows)
    elif args.format == "csv":  # attempts: a superseded and a current row have their columns in other orders
        _csv_stream(iter(rows), list(dict.fromkeys(k for r in rows for k in r)))
    else:
        if not rows:
            if args.host or args.since or args.until:
                where = f" in run {run_id}" if run_id else " in that window" if args.since or args.until else ""
                print(f"no results{f' of host {args.host}' if args.host else ''}{where}")
            else:
                print("no results yet")
            return 0
        if run_id:
            print(f"run {run_id}" + (f" of {dag_id}" if dag_id else ""))
        # DAGs on one schedule share run ids: a run id of several DAGs shows which DAG each row is of
        dag_column = [("DAG", "dag_id")] if len({r.get("dag_id") for r in rows}) > 1 else []
        if args.attempts:
            print(format_table(rows, dag_column + ATTEMPT_TABLE))
            current = [r for r in rows if r["current"]]
            cases = {(r.get("dag_id"), r["run_id"], r["host"], r["case_key"]) for r in rows}
            print(f"{len(rows)} attempt(s) of {len(cases)} case(s): {len(current)} current, "
                  f"{len(rows) - len(current)} superseded")
            return 0
        print(format_table(rows, dag_column + RESULT_TABLE))
        counts = {s: sum(1 for r in rows if r["status"] == s) for s in ("ok", "failed", "skipped")}
        print(f"{len(rows)} case(s): {counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped")
    return 0


def _csv_stream(rows, fields: list[str] | None = None) -> int:
    """The rows as CSV to stdout under `fields` (default: the first row's columns, which every row of one query
    has); text that starts like a formula is quoted. Nothing is written for no row. Returns the number of rows."""
    from fleetbench.report.render import csv_cell

    count, writer = 0, None
    for row in rows:
        if writer is None:
            writer = csv.DictWriter(sys.stdout, fieldnames=fields or list(row), restval="")
            writer.writeheader()
        writer.writerow({k: csv_cell(v) for k, v in row.items()})
        count += 1
    return count


def _json_stream(rows) -> int:
    """The rows as one JSON array to stdout, written as they come, as `_json_out` writes a list; nothing for no
    row (the caller writes `[]`). Returns the number of rows."""
    count = 0
    for row in rows:
        body = json.dumps(_finite(row), indent=2, default=str, allow_nan=False).replace("\n", "\n  ")
        sys.stdout.write(("[\n  " if not count else ",\n  ") + body)
        count += 1
    if count:
        sys.stdout.write("\n]\n")
    return count


def _parse(args: argparse.Namespace) -> int:
    from fleetbench.parsing import cli_parse

    return cli_parse(args.files, args.format, sys.stdout)


def _host_check(args: argparse.Namespace) -> int:
    import atexit
    import contextlib
    import os
    import re
    import shutil
    import tempfile

    from fleetbench.config import GB, MAX_FREE_GB
    from fleetbench.hosts import (
        HostNeeds,
        LocalRunner,
        facts_from_dir,
        gather,
        gpu_smoke_probe,
        has_probe_outputs,
        host_check,
    )
    from fleetbench.hosts.probes import health_probes, on_path
    from fleetbench.hosts.text import STRICT_EXIT, format_table

    if args.image_cuda is not None and not re.fullmatch(r"\d+\.\d+", args.image_cuda):
        raise UsageError(f"--image-cuda must look like 12.1, got {args.image_cuda!r}")
    if args.gpus < 0:
        raise UsageError(f"--gpus must be >= 0, got {args.gpus}")
    if not 0 <= args.min_free_gb <= MAX_FREE_GB:  # also refuses nan and inf
        raise UsageError(f"--min-free-gb must be a number of GB from 0 to {MAX_FREE_GB:,}, got {args.min_free_gb}")
    if args.gpu_smoke_image is not None:
        if args.facts:
            raise UsageError("--gpu-smoke-image runs a container: use it with --local or --ssh, not --facts")
        try:
            gpu_smoke_probe(args.gpu_smoke_image)
        except ValueError as exc:
            raise UsageError(f"--gpu-smoke-image: {exc}") from None
    if args.facts and (args.dcgm_level is not None or args.probe_path):
        raise UsageError("--dcgm-level and --probe-path run probes: use them with --local or --ssh, not --facts")
    if args.docker_url and not args.local:
        raise UsageError("--docker-url is the engine --local probes (an SSH host's engine is the one its own "
                         "`docker` uses): use it with --local")
    if args.save and args.facts:
        raise UsageError("--save keeps the outputs of probes that run: with --facts nothing runs (the outputs are "
                         "in the --facts folder already)")
    if args.dcgm_level is not None and not args.gpus:
        raise UsageError("--dcgm-level runs the GPU health probes, which need --gpus N (N >= 1): without GPUs to "
                         "check, nothing would run")
    try:
        health = health_probes(dcgm_level=args.dcgm_level) if args.gpus else ()
        on_path(health, tuple(args.probe_path))
    except ValueError as exc:
        raise UsageError(f"--dcgm-level/--probe-path: {exc}") from None
    if args.facts:
        folder = Path(args.facts)
        if not folder.is_dir():
            raise UsageError(f"--facts {args.facts}: not a folder")
        if not has_probe_outputs(folder):
            raise UsageError(f"--facts {args.facts}: no probe outputs in it "
                             "(uname-r.txt, nvidia-smi.txt, docker-info.json, ...)")
    else:
        folder = Path(args.save or tempfile.mkdtemp(prefix="fleetbench-facts-"))
        if not args.save:  # the probe outputs are kept only with --save
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
        if args.local:
            env = {**os.environ, **({"DOCKER_HOST": args.docker_url} if args.docker_url else {})}
            runner = LocalRunner(env=env)
        else:
            # Outside a task, Airflow's SDK reads connections from the environment and secrets backends only: a
            # connection made with `airflow connections add` (the metadata database) was "not defined". This
            # process reads them as Airflow's own server processes do.
            os.environ.setdefault("_AIRFLOW_PROCESS_CONTEXT", "server")
            from fleetbench.hosts.ssh import SSHRunner

            runner = SSHRunner(args.ssh)
        with contextlib.redirect_stdout(sys.stderr):  # the SSH provider logs to stdout, which is for the JSON
            gather(runner, folder, gpu_smoke_image=args.gpu_smoke_image, extra=health, path=tuple(args.probe_path))
    needs = HostNeeds(gpus=args.gpus, image_cuda=args.image_cuda, min_free_bytes=int(args.min_free_gb * GB))
    facts = facts_from_dir(folder)
    for name, problem in facts.probe_problems.items():  # the facts it held are unknown; say why, beside the JSON
        print(f"fleetbench host-check: note: {folder / name}: {problem}", file=sys.stderr)
    result = host_check(facts, needs)
    print(format_table(result) if args.format == "table" else json.dumps(result, indent=2))
    return STRICT_EXIT[result["verdict"]] if args.strict else 0


def _pools_export(args: argparse.Namespace) -> int:
    from fleetbench.config import ConfigError, load_config
    from fleetbench.paths import default_config_path
    from fleetbench.runs import pools

    try:
        cfg = load_config(args.config or default_config_path())
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps(pools(cfg), indent=2))
    return 0


def _db_upgrade(args: argparse.Namespace) -> int:
    from alembic.script.revision import RevisionError
    from alembic.util import CommandError
    from sqlalchemy.exc import SQLAlchemyError

    from fleetbench.warehouse import (
        NotAWarehouse,
        WarehouseTooNew,
        current_revision,
        get_engine,
        upgrade,
        warehouse_display_url,
    )

    engine = get_engine()
    try:
        before = current_revision(engine)
        target = _relative_target(before, args.revision) or args.revision
        if _past(before, target):  # Alembic would do nothing and say nothing
            raise UsageError(f"--revision {args.revision}: the warehouse is at revision {before}, newer; "
                             "upgrade does not go back (nothing changed)")
        upgrade(engine, target)
        now = current_revision(engine)
    except (WarehouseTooNew, NotAWarehouse) as exc:
        raise UsageError(str(exc)) from None
    except (CommandError, RevisionError) as exc:
        detail = _first_line(exc)  # Alembic's message usually names the revision already: say it once
        raise UsageError(f"--revision: {detail}" if repr(args.revision) in detail or args.revision in detail.split()
                         else f"--revision {args.revision!r}: {detail}") from None
    except SQLAlchemyError as exc:  # unreachable server, wrong password, a file that cannot be created
        raise UsageError(f"cannot upgrade the warehouse at {warehouse_display_url()}: {_first_line(exc)}") from None
    finally:
        engine.dispose()
    print(f"warehouse at {warehouse_display_url()} is at revision {now or 'base'}")
    return 0


def _relative_target(current: str | None, revision: str) -> str | None:
    """The revision a relative `--revision` names (head-1, 0023-2, base+3, -1 from the current one), None for
    another form; one before the first revision or after the newest is a usage error (Alembic failed an assertion
    on the first, and took base-1 as head)."""
    from alembic.script import ScriptDirectory
    from alembic.script.revision import RevisionError
    from alembic.util import CommandError

    from fleetbench.warehouse import MIGRATIONS

    relative = re.fullmatch(r"(.*?)([+-])(\d+)", revision)
    if not relative:
        return None
    script = ScriptDirectory(str(MIGRATIONS))
    chain = [r.revision for r in script.walk_revisions()][::-1]  # oldest first (one line of revisions)
    start = relative.group(1) or current
    if start in (None, "base"):
        at = -1  # before the first revision
    else:
        try:
            [found] = script.get_revisions(start)
        except (CommandError, RevisionError, ValueError):
            return None  # `upgrade` says what is wrong with it
        at = chain.index(found.revision)
    at += int(relative.group(3)) * (1 if relative.group(2) == "+" else -1)
    if not -1 <= at < len(chain):
        raise UsageError(f"--revision {revision}: past the {'newest' if at >= len(chain) else 'first'} revision (the "
                         f"revisions are {chain[0]} to {chain[-1]}; nothing changed)")
    return chain[at] if at >= 0 else "base"


def _past(current: str | None, revision: str) -> bool:
    """The warehouse at `current` is past `revision` (one of its ancestors; a relative one resolved by
    `_relative_target` first): upgrading to it changes nothing. False when either cannot be resolved here (`upgrade`
    then says what is wrong)."""
    from alembic.script import ScriptDirectory
    from alembic.script.revision import RevisionError
    from alembic.util import CommandError

    from fleetbench.warehouse import MIGRATIONS

    if current is None:
        return False
    script = ScriptDirectory(str(MIGRATIONS))
    try:
        below = {r.revision for r in script.iterate_revisions(current, "base")}
        targets = script.get_revisions(revision)
    except (CommandError, RevisionError, ValueError):
        return False
    if not targets:  # base
        return True
    return len(targets) == 1 and targets[0] is not None and targets[0].revision != current and (
        targets[0].revision in below)


def _first_line(exc: Exception) -> str:
    """The first line of an error, without the warehouse's secrets should a driver quote the URL."""
    from fleetbench.warehouse import redact, warehouse_url

    return redact((str(exc).splitlines() or [type(exc).__name__])[0], warehouse_url())


def _regression_settings(config: str | None, writes: bool = False):
    """The fleet's `regressions` settings: from --config, else the fleet config (`fleetbench.config.configured_fleet`).
    Without --config, a config that cannot be read gives the defaults with a note; but not for a command that
    stores what it assesses with them (`regressions accept`): that is refused, naming the file."""
    from fleetbench.config import ConfigError, RegressionSettings, configured_fleet, load_config

    if config:
        try:
            return load_config(config).fleet.regressions
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
    try:
        fleet = configured_fleet()
    except ConfigError as exc:
        if writes:
            raise UsageError(f"{exc} (the fleet config, $FLEETBENCH_CONFIG: its regression settings assess what "
                             "accept stores; fix it or give --config)") from None
        print(f"note: regression settings are the defaults: {exc}", file=sys.stderr)
        return RegressionSettings()
    return fleet.regressions if fleet is not None else RegressionSettings()


def _finite(value):
    """JSON has no NaN or infinity (Python writes `NaN`, `Infinity`, which other parsers refuse): null instead,
    e.g. the bounds of a shift with too few nights for an interval (regression.compare)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _json_out(value) -> None:
    json.dump(_finite(value), sys.stdout, indent=2, default=str, allow_nan=False)
    print()


def _warehouse_error(exc) -> UsageError:
    from fleetbench.warehouse import warehouse_display_url

    return UsageError(f"cannot read the warehouse at {warehouse_display_url()}: {_first_line(exc)} "
                      "(run the DAG once, or `fleetbench db upgrade`)")


def _compare(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from fleetbench.regression import NoResults, compare, format_compare
    from fleetbench.warehouse import existing_engine

    settings = _regression_settings(args.config)
    engine = existing_engine()
    try:
        rows = compare(engine, args.before, args.after, host=args.host, dag_id=args.dag_id, settings=settings,
                       attempts=args.attempts)
    except NoResults as exc:
        if args.dag_id:  # a typo in the DAG says so, rather than that a driver of it has no results
            from fleetbench.warehouse import dag_ids

            try:
                known = dag_ids(engine)
            except SQLAlchemyError:
                known = None
            if known is not None and args.dag_id not in known:
                raise UsageError(f"--dag-id {args.dag_id!r}: no run of that DAG in the warehouse (DAGs there: "
                                 f"{', '.join(known) or 'none'})") from None
        raise UsageError(str(exc)) from None
    except ValueError as exc:
        raise UsageError(f"--before/--after: {exc}") from None
    except SQLAlchemyError as exc:
        raise _warehouse_error(exc) from None
    finally:
        engine.dispose()
    if args.format == "json":
        _json_out(rows)
    elif not rows:
        print(f"no host and case has ok results both for {args.before} and for {args.after}")
    else:
        print(f"before: {args.before}   after: {args.after}" + (f"   host: {args.host}" if args.host else "")
              + ("   (superseded attempts counted)" if args.attempts else ""))
        print(format_compare(rows))
        if shared := sum(r.get("before_also_after_n") or 0 for r in rows):
            print(f"{shared} result(s) of --before also match --after: counted on the after side only")
        count = {v: sum(1 for r in rows if r["verdict"] == v)
                 for v in ("regression", "improvement", "no change", "not enough nights to tell")}
        print(f"{len(rows)} case(s): {count['regression']} regression(s), {count['improvement']} improvement(s), "
              f"{count['no change']} without change, {count['not enough nights to tell']} not enough nights to tell "
              "(change: Hodges-Lehmann estimate of after - before over nightly values, 99 % interval; time, energy "
              "and cost are the same change, not counted again)")
    return 0


def _regressions_list(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from fleetbench.report.queries import Filters, open_regressions
    from fleetbench.warehouse import existing_engine

    engine = existing_engine()
    try:
        with engine.connect() as conn:
            rows = open_regressions(conn, Filters(host=args.host, dag_id=args.dag_id), include_suspected=True)
    except SQLAlchemyError as exc:
        raise _warehouse_error(exc) from None
    finally:
        engine.dispose()
    if not args.all:
        rows = [r for r in rows if not r.get("same_change_as")]
    if not rows:
        print("no open regressions")
        return 0
    for r in rows:
        unit = f" {r['unit']}" if r.get("unit") else ""
        print(f"{r['status']:9}  {r['kind']:11}  {r['dag_id']}  {r['host']}  {r['case_key']}  {r['metric']}  "
              f"{r['baseline_value']:.4g} -> {r['value']:.4g}{unit} ({r['direction']} is better)  "
              f"{r['delta_pct']:+.1f} % since {r.get('since_date') or r['logical_date']}  ({r['severity']})")
    return 0


def _regressions_accept(args: argparse.Namespace) -> int:
    import getpass

    from sqlalchemy.exc import SQLAlchemyError

    from fleetbench.regression import accept
    from fleetbench.warehouse import existing_engine

    settings = _regression_settings(args.config, writes=True)
    engine = existing_engine()
    try:
        done = accept(engine, args.host, args.case, args.dag_id, accepted_by=getpass.getuser(), note=args.note,
                      settings=settings)
    except SQLAlchemyError as exc:
        raise _warehouse_error(exc) from None
    finally:
        engine.dispose()
    if not done:
        raise UsageError(f"no ok results on host {args.host!r}" + (f" for case {args.case!r}" if args.case else "")
                         + (f" in DAG {args.dag_id!r}" if args.dag_id else ""))
    for a in done:
        what = "the open regression's level" if a["had_open_regression"] else "the newest segment"
        print(f"accepted {what} of {a['dag_id']} {a['host']} {a['case_key']} from {a['since'].isoformat()} on "
              "as the new baseline")
    return 0


def _report(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from fleetbench.report import FilterError, default_report_dir, parse_filters, write_report
    from fleetbench.warehouse import existing_engine, warehouse_display_url

    try:
        filters = parse_filters(since=args.since, until=args.until, host=args.host, model=args.model,
                                dag_id=args.dag_id)
    except FilterError as exc:
        raise UsageError(f"--{exc.field.replace('_', '-')}: {exc.message}") from None
    out = Path(args.out) if args.out else default_report_dir()
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a folder")
    from fleetbench.capacity import configured_settings

    capacity_settings, why = configured_settings()  # the fleet's own, as the DAG's report uses
    if why:
        print(f"note: {why}", file=sys.stderr)
    engine = existing_engine()
    try:
        written = write_report(out, filters, engine=engine, capacity_settings=capacity_settings)
    except SQLAlchemyError as exc:
        url = warehouse_display_url()
        raise UsageError(f"cannot read the warehouse at {url}: {_first_line(exc)} "
                         "(an older schema: `fleetbench db upgrade`)") from None
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write the report: {exc}") from None
    finally:
        engine.dispose()
    s = written["summary"]
    print(written["html"])
    print(f"{s['results']} result(s) of {s['runs']} run(s) on {s['hosts']} host(s); {len(written['plots'])} plot(s) "
          f"as PNG next to it, the data in {Path(written['json']).name}")
    for note in written["notes"]:
        print(f"note: {note}")
    return 0


def _capacity(args: argparse.Namespace) -> int:
    """The largest batch per model predicted to fit, with the evidence (fleetbench.capacity)."""
    from sqlalchemy.exc import SQLAlchemyError

    from fleetbench.capacity import (
        configured_settings,
        fit_profiles,
        has_results,
        key_of,
        read_rows,
        reported_memory_mib,
        suggest,
        suggest_lines,
    )
    from fleetbench.warehouse import existing_engine, warehouse_display_url

    if args.memory_gib is not None and not 0 < args.memory_gib <= 16384:
        raise UsageError(f"--memory-gib must be a positive number of GiB (at most 16384), got {args.memory_gib}")
    if args.margin_pct is not None and not 0 <= args.margin_pct < 100:
        raise UsageError(f"--margin-pct must be in [0, 100), got {args.margin_pct}")
    memory_mib, device = (args.memory_gib * 1024 if args.memory_gib else None), None
    if args.gpu_model:
        from fleetbench.config import ConfigError
        from fleetbench.metrics import load_catalog

        try:
            catalog = load_catalog()
        except ConfigError as exc:  # FLEETBENCH_GPU_CATALOG names a missing or broken file
            raise UsageError(f"--gpu-model needs the GPU catalog: {exc}") from None
        gpu = next((g for g in catalog.gpus if g.name.lower() == args.gpu_model.lower()), None) or catalog.lookup(
            args.gpu_model)
        if gpu is None:
            raise UsageError(f"--gpu-model {args.gpu_model!r} is not in the GPU catalog "
                             "(give --memory-gib instead, or add it to the catalog)")
        memory_mib, device = gpu.memory_gib * 1024, "gpu"
    engine = existing_engine()
    try:
        rows = read_rows(engine, [args.model] if args.model else None) if has_results(engine) else []
        reported = reported_memory_mib(engine, gpu) if args.gpu_model and rows else None
    except SQLAlchemyError as exc:
        raise UsageError(f"cannot read the warehouse at {warehouse_display_url()}: {_first_line(exc)} "
                         "(`fleetbench db upgrade`)") from None
    finally:
        engine.dispose()
    if reported is not None and reported != memory_mib:  # the plan sizes with what the hosts report, so does this
        print(f"note: sized with the {reported:g} MiB that this fleet's {gpu.name} GPUs report, as the plan sizes "
              f"their cases (the catalog's nominal memory: {memory_mib:g} MiB)", file=sys.stderr)
        memory_mib = reported
    settings, why = configured_settings()  # the fleet's fleet.capacity (window, points, margin), as the plan's
    if why:
        print(f"note: {why}", file=sys.stderr)
    if args.margin_pct is not None:
        settings = dataclasses.replace(settings, margin_pct=args.margin_pct)
    known: dict = {}
    for r in rows:
        if r.get("capacity_mib"):
            known.setdefault(key_of(r), set()).add(float(r["capacity_mib"]))
    items = suggest(fit_profiles(rows, settings), settings, memory_mib, device, known)
    if args.format == "json":
        _json_out(items)
    elif not items and device == "gpu" and suggest(fit_profiles(rows, settings), settings, None, None, known):
        print("no GPU profile in the warehouse (--gpu-model applies to GPU profiles; the CPU ones: --memory-gib N, "
              "or no size option)")
    elif not items:
        print(f"no memory readings{' of model ' + args.model if args.model else ''} in the warehouse yet")
    else:
        print("\n".join(suggest_lines(items)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from fleetbench import __version__

    parser = argparse.ArgumentParser(prog="fleetbench", description="Benchmark fleets of GPU hosts.")
    parser.add_argument("--version", action="version", version=f"fleetbench {__version__}")
    sub = parser.add_subparsers(dest="command")

    config = sub.add_parser("config", help="fleet config tools").add_subparsers(dest="config_command", required=True)
    check = config.add_parser("check", help="validate a fleet config file")
    check.add_argument("file", help="the fleet config (YAML) to check; errors come all at once, warnings on stderr")
    check.set_defaults(func=_config_check)

    results = sub.add_parser("results", help="print what the warehouse holds (default: the latest run)")
    results.add_argument("--format", choices=["table", "json", "csv", "parquet"], default="table",
                         help="output format (default: table; parquet needs --out)")
    results.add_argument("--out", metavar="FILE", help="write to this file instead of stdout, once the command "
                         "succeeded (a mistake or an interruption leaves an earlier file there whole)")
    results.add_argument("--metric", metavar="NAME",
                         help="only results whose primary metric is NAME (e.g. images_per_sec, avg_busbw)")
    results.add_argument("--pivot", metavar="ROWS:COLUMNS",
                         help="a pivot of the ok results, e.g. model:host (fields: host, model, case_key, "
                              "gpu_model, driver_version, image_digest, num_gpus, date, ...)")
    results.add_argument("--value", metavar="COLUMN",
                         help="what --pivot aggregates (default: value, the primary metric; also duration_s, "
                              "energy_j, cost_usd, cost_per_unit_usd, energy_per_unit_wh, ...)")
    results.add_argument("--agg", choices=["median", "mean", "min", "max", "count"],
                         help="how --pivot aggregates a cell's results (default: median)")
    results.add_argument("--run-id", help="this run's results (default: the latest run)")
    results.add_argument("--dag-id", help="only results of this DAG")
    results.add_argument("--all", action="store_true", help="every run, not just the latest")
    results.add_argument("--since", metavar="DATE", help="the runs of this day (YYYY-MM-DD, UTC) and later, or from "
                                                         "this ISO date-time on (by logical date; every run, as --all)")
    results.add_argument("--until", metavar="DATE", help="the runs up to this day, inclusive, or before this ISO "
                                                         "date-time (every run, as --all)")
    results.add_argument("--host", help="only this host's results (and the multi-node cases it was in)")
    results.add_argument("--attempts", action="store_true",
                         help="every attempt of each case (earlier executions a rerun superseded too), not just "
                              "the current one")
    results.set_defaults(func=_results)

    parse = sub.add_parser("parse", help="parse benchmark logs into JSON Lines")
    parse.add_argument("--format", choices=["auto", "tf_cnn_benchmarks", "horovod_synthetic", "torch_synthetic",
                                             "nccl_tests", "command"],
                       default="auto", help="the logs' format (default: auto, recognised from each log)")
    parse.add_argument("files", nargs="+", metavar="LOG", help="benchmark log files")
    parse.set_defaults(func=_parse)

    hc = sub.add_parser("host-check", help="judge whether a host can run benchmarks")
    where = hc.add_mutually_exclusive_group(required=True)
    where.add_argument("--facts", help="folder of captured probe outputs")
    where.add_argument("--local", action="store_true", help="probe this machine")
    where.add_argument("--ssh", metavar="CONN_ID", help="probe a host through an Airflow SSH connection")
    hc.add_argument("--docker-url", help="Docker engine to probe with --local")
    hc.add_argument("--save", help="keep the probe outputs in this folder")
    hc.add_argument("--image-cuda", help="CUDA version the image needs, e.g. 12.1")
    hc.add_argument("--gpus", type=int, default=0, help="GPUs the host's cases need (default: 0)")
    hc.add_argument("--min-free-gb", type=float, default=2.0,
                    help="free space Docker's data root must have, in GB (10^9 bytes) as the config's min_free_gb "
                         "(default: 2.0)")
    hc.add_argument("--gpu-smoke-image", metavar="IMAGE",
                    help="with --local/--ssh: run `docker run --rm --gpus all IMAGE nvidia-smi -L`")
    hc.add_argument("--format", choices=["json", "table"], default="json",
                    help="json (the contract scripts read) or a table for people")
    hc.add_argument("--strict", action="store_true", help="exit 1 when the host is unfit, 3 when it is degraded")
    hc.add_argument("--dcgm-level", type=int, choices=[1, 2, 3, 4],
                    help="with --gpus and --local/--ssh: also run `dcgmi diag -r N` (minutes at 2 and more)")
    hc.add_argument("--probe-path", action="append", default=[], metavar="DIR",
                    help="folder put before PATH for the probes (e.g. where nvidia-smi lives); repeatable")
    hc.set_defaults(func=_host_check)

    pools_cmd = sub.add_parser("pools", help="Airflow pools of the fleet").add_subparsers(
        dest="pools_command", required=True)
    export = pools_cmd.add_parser("export", help="print `airflow pools import` JSON: one single-slot pool per host")
    export.add_argument("--config", help="fleet config (default: FLEETBENCH_CONFIG or include/config/fleet.yaml)")
    export.set_defaults(func=_pools_export)

    cmp = sub.add_parser(
        "compare", help="throughput, time, energy and cost of each host and case on one side against the other",
        description="Compare ok results per host and case (per case when the sides are hosts). A SIDE is KIND=VALUE, "
                    "KIND one of driver, cuda, digest, host, date (date=YYYY-MM-DD or YYYY-MM-DD..YYYY-MM-DD, UTC, "
                    "both days included); a bare date or range is a date, any other bare text a driver version. "
                    "Nightly values are compared, never step samples: the change is the Hodges-Lehmann estimate "
                    "with its 99 %% interval; a verdict needs 3 nights a side and an interval that decides, else "
                    "'not enough nights to tell'.")
    cmp.add_argument("--before", required=True, metavar="SIDE", help="e.g. driver=535.104.05, 2026-11-01..2026-11-30")
    cmp.add_argument("--after", required=True, metavar="SIDE", help="e.g. driver=550.54.14, host=gpu07")
    cmp.add_argument("--host", help="only this host")
    cmp.add_argument("--dag-id", help="only results of this DAG")
    cmp.add_argument("--attempts", action="store_true",
                     help="count superseded attempts too: nights measured again (e.g. by a backfill on a new "
                          "driver) compare their old measurement with the new one")
    cmp.add_argument("--format", choices=["table", "json"], default="table", help="output format (default: table)")
    cmp.add_argument("--config", help="fleet config with the regression settings (default: FLEETBENCH_CONFIG or "
                                      "include/config/fleet.yaml; built-in defaults, with a note, when that cannot "
                                      "be read)")
    cmp.set_defaults(func=_compare)

    reg = sub.add_parser("regressions", help="open regressions, and accepting a new level as the baseline"
                         ).add_subparsers(dest="regressions_command", required=True)
    rl = reg.add_parser("list", help="regressions open on each host and case's newest night (confirmed, suspected)")
    rl.add_argument("--host", help="only this host")
    rl.add_argument("--dag-id", help="only results of this DAG")
    rl.add_argument("--all", action="store_true", help="also the findings that repeat another metric's (time, cost)")
    rl.set_defaults(func=_regressions_list)
    ra = reg.add_parser(
        "accept", help="accept a host's current level (after a driver change, say) as the new baseline",
        description="For each case of HOST (or only --case): the level since the open regression began (else since "
                    "its newest segment began: driver, CUDA driver, image digest) becomes the baseline; the open "
                    "regression closes and the newest run is assessed again.")
    ra.add_argument("--host", required=True, help="the host whose current level becomes the baseline")
    ra.add_argument("--case", help="only this case_key")
    ra.add_argument("--dag-id", help="only this DAG's results")
    ra.add_argument("--note", help="why (stored with the acceptance)")
    ra.add_argument("--config", help="fleet config with the regression settings (default: FLEETBENCH_CONFIG or "
                                     "include/config/fleet.yaml; one that cannot be read is an error: accept stores "
                                     "what it assesses with them)")
    ra.set_defaults(func=_regressions_accept)

    rep = sub.add_parser(
        "report", help="write an HTML report (with PNG plots) of the warehouse's results",
        description="Throughput per model and host over time (driver changes marked), scaling efficiency per GPU "
                    "count, images per joule and cost per million images per GPU model, the latest run's failures "
                    "by class and the open regressions, as one self-contained HTML file plus PNGs and JSON. "
                    "DATE is YYYY-MM-DD (whole UTC days, both ends included) or an ISO date-time.")
    rep.add_argument("--since", metavar="DATE", help="first day, or a date-time from which on (default: the 30 days "
                     "ending with the newest result)")
    rep.add_argument("--until", metavar="DATE", help="last day, inclusive, or a date-time before which (default: no "
                     "end)")
    rep.add_argument("--host", help="only this host")
    rep.add_argument("--model", help="only this model")
    rep.add_argument("--dag-id", help="only results of this DAG")
    rep.add_argument("--out", metavar="DIR", help="folder to write into (default: $FLEETBENCH_DATA_DIR/reports)")
    rep.set_defaults(func=_report)

    cap = sub.add_parser(
        "capacity", help="the largest batch per model predicted to fit in a GPU or a memory size, with the evidence",
        description="Fits peak memory against the per-device batch size per harness, model, precision, device "
                    "kind and benchmark (and torch_synthetic's channels_last and compile) from the warehouse's ok "
                    "results "
                    "(a repeated-median line; README 'Capacity profiles'), and prints the line, its points and "
                    "spread, the OOMs "
                    "on record and the misses, and the largest batch per device predicted to fit. Without "
                    "--gpu-model or --memory-gib: for each memory size the results ran with.")
    cap.add_argument("--model", help="only this model")
    size = cap.add_mutually_exclusive_group()
    size.add_argument("--gpu-model", metavar="G", help="a GPU of the catalog, e.g. 'A100 SXM4 40GB' (GPU profiles)")
    size.add_argument("--memory-gib", metavar="N", type=float, help="memory per device in GiB (every profile)")
    cap.add_argument("--margin-pct", type=float, default=None,
                     help="memory kept free, in %% (default: the fleet config's fleet.capacity.margin_pct, 10)")
    cap.add_argument("--format", choices=["table", "json"], default="table", help="table (default) or JSON")
    cap.set_defaults(func=_capacity)

    db = sub.add_parser("db", help="warehouse maintenance").add_subparsers(dest="db_command", required=True)
    up = db.add_parser("upgrade", help="migrate the warehouse schema")
    up.add_argument("--revision", default="head", help="Alembic revision to migrate to (default: head)")
    up.set_defaults(func=_db_upgrade)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `fleetbench`: what it can do
        parser.print_help()
        return 0
    for name, value in vars(args).items():  # bytes not UTF-8 in a name or value (a terminal in another encoding)
        if isinstance(value, str) and name not in PATH_ARGUMENTS:  # a file name may be any bytes
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                shown = value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
                print(f"fleetbench {args.command}: {name.replace('_', '-')} '{shown}': not UTF-8 text",
                      file=sys.stderr)
                return 2
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"fleetbench {args.command}: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # e.g. WarehouseURLError: a setting the user gave, not a bug
        from fleetbench.warehouse import WarehouseURLError

        if not isinstance(exc, WarehouseURLError):
            raise
        print(f"fleetbench {args.command}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
