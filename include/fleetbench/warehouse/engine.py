"""Which database the warehouse is, and its schema's revision: URLs (secrets never shown), engines, Alembic."""

from __future__ import annotations

import functools
import logging
import os
import re
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, text

from fleetbench.paths import data_dir

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).parent / "migrations"
# pg_advisory_xact_lock key that serialises concurrent `upgrade` calls on one PostgreSQL database.
_MIGRATION_LOCK = 0x66_6C_65_65_74  # "fleet"
def warehouse_url() -> str:
    url = os.environ.get("FLEETBENCH_WAREHOUSE_URL")
    if url:
        return url
    path = data_dir() / "warehouse.db"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # FLEETBENCH_DATA_DIR names a file, or a folder that cannot be made
        raise WarehouseURLError(f"FLEETBENCH_DATA_DIR {path.parent}: cannot hold the warehouse: "
                                f"{exc.strerror or exc}") from None
    return f"sqlite:///{path}"


def warehouse_read_url() -> str:
    """The URL for code that only reads the warehouse (the results view): `FLEETBENCH_WAREHOUSE_READ_URL`
    when set (a role that may only SELECT, as docker-compose.yaml's reader), else `warehouse_url()`."""
    return os.environ.get("FLEETBENCH_WAREHOUSE_READ_URL") or warehouse_url()


class WarehouseURLError(ValueError):
    """FLEETBENCH_WAREHOUSE_URL (or a given URL) is not a database fleetbench can open."""


def _parsed(url):
    """`url` as SQLAlchemy's URL, or None where it is no URL (a bad port is a ValueError, not an ArgumentError)."""
    from sqlalchemy.engine import URL, make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = url if isinstance(url, URL) else make_url(url)
    except (ArgumentError, ValueError):
        return None
    # `user:p@ss@host`: SQLAlchemy ends the password at its first '@' and takes the rest for the host
    return None if "@" in (parsed.host or "") else parsed


def _secret_keys(parsed) -> list[str]:
    """The URL's query parameters that hold a secret: libpq takes `password` and `sslpassword` (a client key's
    passphrase) in the URL as well as `user:password@`."""
    return [key for key in parsed.query if "pass" in key.lower()]


def url_secrets(url) -> list[str]:
    """Every secret a warehouse URL holds (its password, its query's passwords), longest first."""
    parsed = _parsed(url)
    if parsed is None:
        return []
    found = [parsed.password] if parsed.password else []
    for key in _secret_keys(parsed):
        value = parsed.query[key]
        found.extend([value] if isinstance(value, str) else value)
    return sorted({str(s) for s in found if s}, key=len, reverse=True)


def redact(text: str, url) -> str:
    """`text` (a driver's message, say) without any secret of `url`."""
    for secret in url_secrets(url):
        text = text.replace(secret, "***")
    return text


def warehouse_display_url(url=None) -> str:
    """The warehouse URL (a string or SQLAlchemy URL) for messages, logs and reports: no password is shown, neither
    `user:password@` nor a `password=` / `sslpassword=` query parameter."""
    parsed = _parsed(url or warehouse_url())
    if parsed is None:
        return "<unparsable URL>"
    hidden = parsed.update_query_dict({key: "***" for key in _secret_keys(parsed)})
    return hidden.render_as_string(hide_password=True).replace("%2A%2A%2A", "***")


def _normalise(url: str) -> str:
    """A plain `postgresql://` URL uses psycopg2 (what requirements.txt installs)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is no number
        raise WarehouseURLError(f"FLEETBENCH_WAREHOUSE_URL: not a database URL: {warehouse_display_url(url)} "
                                "(e.g. sqlite:////path/warehouse.db or postgresql://user:password@host/db)") from None
    if "@" in (parsed.host or ""):
        raise WarehouseURLError("FLEETBENCH_WAREHOUSE_URL: its password holds an '@': write it as %40 (characters "
                                "such as @ : / % in a URL's password are percent-encoded)")
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg2")
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise WarehouseURLError(f"FLEETBENCH_WAREHOUSE_URL: {parsed.get_backend_name()} is not supported "
                                "(SQLite or PostgreSQL)")
    return parsed.render_as_string(hide_password=False)


def existing_engine(url: str | None = None) -> Engine:
    """`get_engine` for a command that reads what is stored (results, report, compare, ...): a SQLite warehouse
    whose file does not exist is refused, naming the file, rather than created empty (SQLite makes the file on
    connect): a mistyped path would read as "no results yet"."""
    from sqlalchemy.engine import make_url

    url = url or warehouse_url()
    parsed = make_url(_normalise(url))
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:") \
            and not parsed.database.startswith("file:") and not Path(parsed.database).exists():
        raise WarehouseURLError(f"no warehouse at {parsed.database}: nothing has been stored there (run the DAG "
                                "once, e.g. `make run`), or FLEETBENCH_WAREHOUSE_URL names another file")
    return get_engine(url)


def get_engine(url: str | None = None) -> Engine:
    url = _normalise(url or warehouse_url())
    if url.startswith("sqlite"):
        engine = _create(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # WAL: readers don't block the writer
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    return _create(url, pool_pre_ping=True, connect_args={"options": _utc_options(url)})


def _create(url: str, **kwargs) -> Engine:
    """create_engine, its driver missing or unknown a one-line WarehouseURLError."""
    from sqlalchemy.exc import NoSuchModuleError

    try:
        return create_engine(url, **kwargs)
    except ImportError as exc:
        raise WarehouseURLError(f"FLEETBENCH_WAREHOUSE_URL {warehouse_display_url(url)}: "
                                f"driver not installed ({exc})") from None
    except NoSuchModuleError:  # postgresql+pyscopg2://: a driver SQLAlchemy does not know
        raise WarehouseURLError(f"FLEETBENCH_WAREHOUSE_URL {warehouse_display_url(url)}: unknown driver "
                                f"{url.split(':', 1)[0]!r} (postgresql:// uses psycopg2)") from None


def _utc_options(url: str) -> str:
    """PostgreSQL's startup `options` with the session's TimeZone UTC, after any the URL or PGOPTIONS give.

    timestamptz comes back in the session's zone, which defaults to the server's (initdb takes the
    machine's): in UTC, every reader sees the same instants and days as on SQLite."""
    from sqlalchemy.engine import make_url

    given = make_url(url).query.get("options") or os.environ.get("PGOPTIONS")
    return " ".join([*([given] if isinstance(given, str) else given or []), "-c TimeZone=UTC"])


def _alembic(engine: Engine, action, revision: str, script_location: Path = MIGRATIONS) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location))
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":  # two first writers at once: the second waits, then finds head
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK})
        elif conn.dialect.name == "sqlite":
            # pysqlite opens a transaction only before INSERT/UPDATE/DELETE, so DDL would autocommit
            # statement by statement; an explicit one makes a migration all or nothing. IMMEDIATE:
            # the write lock up front, so two first writers take turns instead of failing.
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        cfg.attributes["connection"] = conn
        action(cfg, revision)


class SchemaBehind(RuntimeError):
    """The warehouse is at an older revision than this fleetbench reads (`fleetbench db upgrade`)."""


@functools.lru_cache(maxsize=1)
def _revisions() -> tuple[str, frozenset[str]]:
    """(head, every revision) of the migrations shipped."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(str(MIGRATIONS))
    return script.get_current_head(), frozenset(r.revision for r in script.walk_revisions())


def schema_behind(engine: Engine) -> str | None:
    """A sentence naming the warehouse's revision and the one this fleetbench reads when the warehouse is at an older
    one it knows; None at head, before the first migration, or at a revision a newer fleetbench made."""
    head, known = _revisions()
    current = current_revision(engine)
    if current is None or current == head or current not in known:
        return None
    return (f"The warehouse's schema is at revision {current}, older than this fleetbench's {head}: run "
            "`fleetbench db upgrade`, or let the fleet DAG's next run do it.")


class WarehouseTooNew(RuntimeError):
    """The warehouse is at a revision this fleetbench does not have: a newer fleetbench upgraded it."""


class NotAWarehouse(RuntimeError):
    """The database has another program's Alembic history (Airflow's metadata database, say): no warehouse."""


# A revision id a fleetbench migration has (0001 ... 0024): one that is not is another program's.
_REVISION_ID = re.compile(r"\d{4}")


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply Alembic migrations (`fleetbench db upgrade`); the DAG calls this before its first write.

    One transaction (PostgreSQL and SQLite both have transactional DDL): a failed migration leaves
    the previous revision. Concurrent callers on PostgreSQL take turns. A warehouse a newer fleetbench upgraded
    raises WarehouseTooNew, saying so (Alembic's "Can't locate revision identified by ..." did not).
    """
    from alembic.script import ScriptDirectory
    from alembic.script.revision import ResolutionError
    from alembic.util import CommandError

    current = current_revision(engine)
    if current is not None:
        script = ScriptDirectory(str(MIGRATIONS))
        try:
            script.get_revision(current)
        except (CommandError, ResolutionError):  # ScriptDirectory turns the second into the first
            if not _REVISION_ID.fullmatch(current) or not {"runs", "benchmark_results"} <= _tables(engine):
                raise NotAWarehouse(
                    f"the database at {warehouse_display_url(engine.url)} is no fleetbench warehouse: its Alembic "
                    f"revision {current} is another program's (Airflow's metadata database?); check "
                    "FLEETBENCH_WAREHOUSE_URL (nothing changed)") from None
            raise WarehouseTooNew(
                f"the warehouse is at revision {current}, which this fleetbench (newest {script.get_current_head()}) "
                "does not know: a newer fleetbench upgraded it; use that one (nothing changed)") from None
        if current == "0015":
            _repair_early_0015(engine)
    _alembic(engine, command.upgrade, revision)


def _tables(engine: Engine) -> set[str]:
    from sqlalchemy import inspect

    return set(inspect(engine).get_table_names())


def _repair_early_0015(engine: Engine) -> None:
    """A warehouse main migrated for a few seconds of its history (03d4d10), when the MIG columns' revision was
    numbered 0015 (now 0012) and Alembic stamped it 0015: it has 0012's columns but none of 0013-0015's changes, and
    an upgrade from "0015" skipped them (0016 failed on the missing `nodes`). Re-stamped 0012, it upgrades through
    them. A true 0015 has superseded_host_facts, which that one lacks."""
    from sqlalchemy import inspect, text

    columns = {c["name"] for c in inspect(engine).get_columns("benchmark_results")}
    if "superseded_host_facts" in _tables(engine) or "mig_profile" not in columns:
        return
    log.warning("the warehouse is stamped 0015 but has 0012's schema (a revision numbered 0015 for a while): "
                "re-stamped 0012, upgrading through 0013-0015")
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0012' WHERE version_num = '0015'"))


def downgrade(engine: Engine, revision: str) -> None:
    """Revert migrations down to `revision` ("base" removes everything)."""
    _alembic(engine, command.downgrade, revision)


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None before the first migration)."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
