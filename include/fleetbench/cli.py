"""The `fleetbench` command line.

    fleetbench config check FILE
    fleetbench results [--format table|json|csv] [--run-id ID] [--dag-id ID] [--all] [--attempts]
    fleetbench parse [--format auto|tf_cnn_benchmarks|horovod_synthetic] FILE...
    fleetbench host-check (--facts DIR | --local [--docker-url URL]) [--image-cuda X.Y] [--gpus N]
    fleetbench pools export [--config FILE]
    fleetbench compare --before DRIVER_OR_DATE --after DRIVER_OR_DATE [--host H] [--attempts] [--format table|json]
    fleetbench report [--since DATE] [--until DATE] [--host H] [--model M] [--dag-id ID] [--out DIR]
    fleetbench db upgrade

User mistakes end with a one-line message naming what is wrong and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Sequence

RESULT_TABLE = [  # (header, column)
    ("host", "host"), ("model", "model"), ("batch", "batch_size_per_device"), ("GPUs", "num_gpus"),
    ("status", "status"), ("images/sec", "images_per_sec"), ("duration s", "duration_s"),
    ("image digest", "image_digest"),
]
# `results --attempts`: which attempt, its driver, and whether it is the current one.
ATTEMPT_TABLE = [*RESULT_TABLE[:1], ("case", "case_key"), ("attempt", "attempt"), ("driver", "driver_version"),
                 *RESULT_TABLE[4:]]


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
    if column == "images_per_sec":
        return "-" if value is None else f"{value:.2f}"
    if column == "duration_s":
        return "-" if value is None else f"{value:.1f}"
    if column == "image_digest":
        return "-" if not value else value[:19]
    if column == "attempt" and "current" in row:
        return f"{value} ({'current' if row['current'] else 'superseded'})"
    return "-" if value is None else str(value)


def format_table(rows: list[dict], columns: list[tuple[str, str]] = RESULT_TABLE) -> str:
    cells = [[h for h, _ in columns]] + [[_cell(r, c) for _, c in columns] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _results(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from fleetbench.warehouse import fetch_results, get_engine, latest_run_id, warehouse_display_url
    from fleetbench.warehouse.attempts import fetch_attempts

    engine = get_engine()
    try:
        run_id = args.run_id
        if run_id is None and not args.all:
            run_id = latest_run_id(engine, args.dag_id)
        fetch = fetch_attempts if args.attempts else fetch_results
        rows = fetch(engine, run_id=run_id, dag_id=args.dag_id) if (run_id or args.all) else []
    except SQLAlchemyError as exc:
        raise UsageError(f"cannot read the warehouse at {warehouse_display_url()}: {str(exc).splitlines()[0]} "
                         "(run the DAG once, or `fleetbench db upgrade`)") from None
    finally:
        engine.dispose()
    if args.run_id and not rows:
        raise UsageError(f"no results for run id {args.run_id!r}")
    if args.format == "json":
        json.dump(rows, sys.stdout, indent=2, default=str)
        print()
    elif args.format == "csv":
        if rows:
            from fleetbench.report.render import csv_cell  # text that starts like a formula is quoted

            writer = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows({k: csv_cell(v) for k, v in r.items()} for r in rows)
    else:
        if not rows:
            print("no results yet")
            return 0
        if run_id:
            print(f"run {run_id}")
        if args.attempts:
            print(format_table(rows, ATTEMPT_TABLE))
            current = [r for r in rows if r["current"]]
            print(f"{len(rows)} attempt(s) of {len({(r['run_id'], r['host'], r['case_key']) for r in rows})} case(s): "
                  f"{len(current)} current, {len(rows) - len(current)} superseded")
            return 0
        print(format_table(rows))
        counts = {s: sum(1 for r in rows if r["status"] == s) for s in ("ok", "failed", "skipped")}
        print(f"{len(rows)} case(s): {counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped")
    return 0


def _parse(args: argparse.Namespace) -> int:
    from fleetbench.parsing import cli_parse

    return cli_parse(args.files, args.format, sys.stdout)


def _host_check(args: argparse.Namespace) -> int:
    import contextlib
    import os
    import re
    import tempfile

    from fleetbench.hosts import (
        HostNeeds,
        LocalRunner,
        facts_from_dir,
        gather,
        gpu_smoke_probe,
        has_probe_outputs,
        host_check,
    )

    if args.image_cuda is not None and not re.fullmatch(r"\d+\.\d+", args.image_cuda):
        raise UsageError(f"--image-cuda must look like 12.1, got {args.image_cuda!r}")
    if args.gpus < 0:
        raise UsageError(f"--gpus must be >= 0, got {args.gpus}")
    if args.min_free_gb < 0:
        raise UsageError(f"--min-free-gb must be >= 0, got {args.min_free_gb}")
    if args.gpu_smoke_image is not None:
        if args.facts:
            raise UsageError("--gpu-smoke-image runs a container: use it with --local or --ssh, not --facts")
        try:
            gpu_smoke_probe(args.gpu_smoke_image)
        except ValueError as exc:
            raise UsageError(f"--gpu-smoke-image: {exc}") from None
    if args.facts:
        folder = Path(args.facts)
        if not folder.is_dir():
            raise UsageError(f"--facts {args.facts}: not a folder")
        if not has_probe_outputs(folder):
            raise UsageError(f"--facts {args.facts}: no probe outputs in it "
                             "(uname-r.txt, nvidia-smi.txt, docker-info.json, ...)")
    else:
        folder = Path(args.save or tempfile.mkdtemp(prefix="fleetbench-facts-"))
        if args.local:
            env = {**os.environ, **({"DOCKER_HOST": args.docker_url} if args.docker_url else {})}
            runner = LocalRunner(env=env)
        else:
            from fleetbench.hosts.ssh import SSHRunner

            runner = SSHRunner(args.ssh)
        with contextlib.redirect_stdout(sys.stderr):  # the SSH provider logs to stdout, which is for the JSON
            gather(runner, folder, gpu_smoke_image=args.gpu_smoke_image)
    needs = HostNeeds(gpus=args.gpus, image_cuda=args.image_cuda, min_free_bytes=int(args.min_free_gb * 1024**3))
    facts = facts_from_dir(folder)
    for name, problem in facts.probe_problems.items():  # the facts it held are unknown; say why, beside the JSON
        print(f"fleetbench host-check: note: {folder / name}: {problem}", file=sys.stderr)
    print(json.dumps(host_check(facts, needs), indent=2))
    return 0


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

    from fleetbench.warehouse import get_engine, upgrade, warehouse_display_url

    engine = get_engine()
    try:
        upgrade(engine, args.revision)
    except (CommandError, RevisionError) as exc:
        raise UsageError(f"--revision {args.revision}: {_first_line(exc)}") from None
    except SQLAlchemyError as exc:  # unreachable server, wrong password, a file that cannot be created
        raise UsageError(f"cannot upgrade the warehouse at {warehouse_display_url()}: {_first_line(exc)}") from None
    finally:
        engine.dispose()
    print(f"warehouse at {warehouse_display_url()} is at revision {args.revision}")
    return 0


def _first_line(exc: Exception) -> str:
    """The first line of an error, without the warehouse password should a driver quote the URL."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from fleetbench.warehouse import warehouse_url

    line = (str(exc).splitlines() or [type(exc).__name__])[0]
    try:
        password = make_url(warehouse_url()).password
    except ArgumentError:
        password = None
    return line.replace(str(password), "***") if password else line


def _compare(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from fleetbench.config import ConfigError, RegressionSettings, load_config
    from fleetbench.paths import default_config_path
    from fleetbench.regression import NoResults, compare, format_compare
    from fleetbench.warehouse import get_engine, warehouse_display_url

    try:
        settings = load_config(args.config or default_config_path()).fleet.regressions
    except ConfigError as exc:
        if args.config:
            raise UsageError(str(exc)) from None
        settings = RegressionSettings()
    engine = get_engine()
    try:
        rows = compare(engine, args.before, args.after, host=args.host, dag_id=args.dag_id, settings=settings,
                       attempts=args.attempts)
    except NoResults as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:
        raise UsageError(f"--before/--after: {exc}") from None
    except SQLAlchemyError as exc:
        raise UsageError(f"cannot read the warehouse at {warehouse_display_url()}: {str(exc).splitlines()[0]} "
                         "(run the DAG once, or `fleetbench db upgrade`)") from None
    finally:
        engine.dispose()
    if args.format == "json":
        json.dump(rows, sys.stdout, indent=2, default=str)
        print()
    elif not rows:
        print(f"no host and case has ok results both for {args.before} and for {args.after}")
    else:
        print(f"before: {args.before}   after: {args.after}" + (f"   host: {args.host}" if args.host else "")
              + ("   (superseded attempts counted)" if args.attempts else ""))
        print(format_compare(rows))
        worse = sum(1 for r in rows if r["verdict"] == "regression")
        better = sum(1 for r in rows if r["verdict"] == "improvement")
        print(f"{len(rows)} case(s): {worse} regression(s), {better} improvement(s)")
    return 0


def _report(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from fleetbench.report import FilterError, default_report_dir, parse_filters, write_report
    from fleetbench.warehouse import warehouse_display_url

    try:
        filters = parse_filters(since=args.since, until=args.until, host=args.host, model=args.model,
                                dag_id=args.dag_id)
    except FilterError as exc:
        raise UsageError(f"--{exc.field.replace('_', '-')}: {exc.message}") from None
    out = Path(args.out) if args.out else default_report_dir()
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a folder")
    try:
        written = write_report(out, filters)
    except SQLAlchemyError as exc:
        url = warehouse_display_url()
        raise UsageError(f"cannot read the warehouse at {url}: {str(exc).splitlines()[0]}") from None
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write the report: {exc}") from None
    s = written["summary"]
    print(written["html"])
    print(f"{s['results']} result(s) of {s['runs']} run(s) on {s['hosts']} host(s); {len(written['pngs'])} plot(s) "
          f"as PNG next to it, the data in {Path(written['json']).name}")
    for note in written["notes"]:
        print(f"note: {note}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from fleetbench import __version__

    parser = argparse.ArgumentParser(prog="fleetbench", description="Benchmark fleets of GPU hosts.")
    parser.add_argument("--version", action="version", version=f"fleetbench {__version__}")
    sub = parser.add_subparsers(dest="command")

    config = sub.add_parser("config", help="fleet config tools").add_subparsers(dest="config_command", required=True)
    check = config.add_parser("check", help="validate a fleet config file")
    check.add_argument("file")
    check.set_defaults(func=_config_check)

    results = sub.add_parser("results", help="print what the warehouse holds (default: the latest run)")
    results.add_argument("--format", choices=["table", "json", "csv"], default="table")
    results.add_argument("--run-id")
    results.add_argument("--dag-id")
    results.add_argument("--all", action="store_true", help="every run, not just the latest")
    results.add_argument("--attempts", action="store_true",
                         help="every attempt of each case (earlier executions a rerun superseded too), not just "
                              "the current one")
    results.set_defaults(func=_results)

    parse = sub.add_parser("parse", help="parse benchmark logs into JSON Lines")
    parse.add_argument("--format", choices=["auto", "tf_cnn_benchmarks", "horovod_synthetic"], default="auto")
    parse.add_argument("files", nargs="+")
    parse.set_defaults(func=_parse)

    hc = sub.add_parser("host-check", help="judge whether a host can run benchmarks")
    where = hc.add_mutually_exclusive_group(required=True)
    where.add_argument("--facts", help="folder of captured probe outputs")
    where.add_argument("--local", action="store_true", help="probe this machine")
    where.add_argument("--ssh", metavar="CONN_ID", help="probe a host through an Airflow SSH connection")
    hc.add_argument("--docker-url", help="Docker engine to probe with --local")
    hc.add_argument("--save", help="keep the probe outputs in this folder")
    hc.add_argument("--image-cuda", help="CUDA version the image needs, e.g. 12.1")
    hc.add_argument("--gpus", type=int, default=0, help="GPUs the host's cases need")
    hc.add_argument("--min-free-gb", type=float, default=2.0, help="free space Docker's data root must have")
    hc.add_argument("--gpu-smoke-image", metavar="IMAGE",
                    help="with --local/--ssh: run `docker run --rm --gpus all IMAGE nvidia-smi -L`")
    hc.set_defaults(func=_host_check)

    pools_cmd = sub.add_parser("pools", help="Airflow pools of the fleet").add_subparsers(
        dest="pools_command", required=True)
    export = pools_cmd.add_parser("export", help="print `airflow pools import` JSON: one single-slot pool per host")
    export.add_argument("--config", help="fleet config (default: FLEETBENCH_CONFIG or include/config/fleet.yaml)")
    export.set_defaults(func=_pools_export)

    cmp = sub.add_parser(
        "compare", help="throughput, energy and cost of each host and case before and after a driver change or a date",
        description="Compare ok results per host and case. BEFORE and AFTER are each a driver version (matched exactly "
                    "against the results' driver_version, e.g. 535.104.05) or a date YYYY-MM-DD (results whose "
                    "logical date falls on that day, UTC). Significance: robust z of the after side's median "
                    "images/sec against the before side's runs (needs fleet.regressions.min_history runs before), "
                    "else a Mann-Whitney test of the step samples; p is the Mann-Whitney p-value.")
    cmp.add_argument("--before", required=True, metavar="DRIVER_OR_DATE", help="driver version or YYYY-MM-DD")
    cmp.add_argument("--after", required=True, metavar="DRIVER_OR_DATE", help="driver version or YYYY-MM-DD")
    cmp.add_argument("--host", help="only this host")
    cmp.add_argument("--dag-id", help="only results of this DAG")
    cmp.add_argument("--attempts", action="store_true",
                     help="count superseded attempts too: nights measured again (e.g. by a backfill on a new "
                          "driver) compare their old measurement with the new one")
    cmp.add_argument("--format", choices=["table", "json"], default="table")
    cmp.add_argument("--config", help="fleet config with the regression settings (default: FLEETBENCH_CONFIG or "
                                      "include/config/fleet.yaml; built-in defaults when that cannot be read)")
    cmp.set_defaults(func=_compare)

    rep = sub.add_parser(
        "report", help="write an HTML report (with PNG plots) of the warehouse's results",
        description="Throughput per model and host over time (driver changes marked), scaling efficiency per GPU "
                    "count, images per joule and cost per million images per GPU model, the latest run's failures "
                    "by class and the open regressions, as one self-contained HTML file plus PNGs and JSON. "
                    "DATE is YYYY-MM-DD (whole UTC days, both ends included) or an ISO date-time.")
    rep.add_argument("--since", metavar="DATE", help="first day (default: the 30 days ending with the newest result)")
    rep.add_argument("--until", metavar="DATE", help="last day (default: no end)")
    rep.add_argument("--host", help="only this host")
    rep.add_argument("--model", help="only this model")
    rep.add_argument("--dag-id", help="only results of this DAG")
    rep.add_argument("--out", metavar="DIR", help="folder to write into (default: $FLEETBENCH_DATA_DIR/reports)")
    rep.set_defaults(func=_report)

    db = sub.add_parser("db", help="warehouse maintenance").add_subparsers(dest="db_command", required=True)
    up = db.add_parser("upgrade", help="migrate the warehouse schema")
    up.add_argument("--revision", default="head")
    up.set_defaults(func=_db_upgrade)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `fleetbench`: what it can do
        parser.print_help()
        return 0
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
