"""Throwaway PostgreSQL databases on the test server (one per test, dropped afterwards)."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator

from sqlalchemy import create_engine, text


@contextlib.contextmanager
def fresh_database(server_url: str, prefix: str = "fb_test") -> Iterator[str]:
    """Create a new database on the server of `server_url`; yield its URL; drop it (even if still in use)."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield server_url.rsplit("/", 1)[0] + "/" + name
    finally:
        drop_database(admin, name)
        admin.dispose()


def drop_database(admin, name: str, attempts: int = 20) -> None:
    """DROP ... WITH (FORCE) cannot end an autovacuum worker (a superuser process) that may still be busy
    on a freshly loaded database: wait for it and try again."""
    from sqlalchemy.exc import DBAPIError

    for attempt in range(attempts):
        try:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            return
        except DBAPIError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.5)
