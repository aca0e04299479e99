"""One rule for timestamps read from rows, XCom or files: aware and in UTC."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any


def utc(value: Any) -> datetime | None:
    """ISO text or a datetime -> an aware UTC datetime (a naive value is taken as UTC); None stays None."""
    if value is None:
        return None
    dt = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)
