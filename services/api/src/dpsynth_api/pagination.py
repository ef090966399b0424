"""Opaque keyset cursors: newest first by (created_at, id)."""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any

from dpsynth_shared.errors import DpsynthError, ErrorCode
from sqlalchemy import Select, and_, or_


def encode_cursor(created_at: datetime, ident: str) -> str:
    """The cursor that continues after the row ``(created_at, ident)``."""
    raw = json.dumps([created_at.isoformat(), ident]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """Inverse of :func:`encode_cursor` (400 ``invalid_request`` on garbage)."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, ident = json.loads(raw)
        return datetime.fromisoformat(at), str(ident)
    except (ValueError, TypeError) as exc:
        raise DpsynthError(ErrorCode.INVALID_REQUEST, "the cursor is not valid") from exc


def page(stmt: Select[Any], table: Any, *, limit: int, cursor: str | None) -> Select[Any]:
    """Order newest first and continue after ``cursor`` (fetches ``limit + 1`` rows)."""
    if cursor is not None:
        at, ident = decode_cursor(cursor)
        stmt = stmt.where(or_(table.created_at < at,
                              and_(table.created_at == at, table.id < ident)))
    return stmt.order_by(table.created_at.desc(), table.id.desc()).limit(limit + 1)


def split(rows: list[Any], limit: int) -> tuple[list[Any], str | None]:
    """The page's rows and the cursor of the next page (None on the last one)."""
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    return rows, encode_cursor(rows[-1].created_at, rows[-1].id)
