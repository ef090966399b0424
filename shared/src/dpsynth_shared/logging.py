"""JSON logs with request and job ids, one line per record.

Never log anything computed from private data (losses, gradient statistics, record names):
such values only go to owner-only artifacts labelled non-DP (docs/privacy.md). The engines
of the api and the ledger hide SQL parameters (``hide_parameters=True``); as a second,
independent guard, :class:`JsonFormatter` drops the ``[parameters: …]`` line of a
SQLAlchemy error and the ``DETAIL:`` line of a PostgreSQL one (which can quote a row's
values) from messages and tracebacks.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import time
from typing import Any

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "request_id", default=None)
job_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("job_id", default=None)

# "[parameters: {...}]" (SQLAlchemy's StatementError) and "DETAIL:  Key (x)=(…)" (a
# PostgreSQL error quoting the values of the row it refused).
_PARAMETERS = re.compile(r"^\[parameters: .*$", re.MULTILINE)
_DETAIL = re.compile(r"^DETAIL: .*$", re.MULTILINE)


def scrub(text: str) -> str:
    """``text`` without SQL parameter values or PostgreSQL row details."""
    text = _PARAMETERS.sub("[SQL parameters hidden]", text)
    return _DETAIL.sub("DETAIL: [hidden]", text)


_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": scrub(record.getMessage()),
        }
        if (rid := request_id_var.get()) is not None:
            payload["request_id"] = rid
        if (jid := job_id_var.get()) is not None:
            payload["job_id"] = jid
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                payload[key] = value
        if record.exc_info:
            payload["exc"] = scrub(self.formatException(record.exc_info))
        return json.dumps(payload, default=str)


def configure_logging(service: str, level: str = "INFO") -> None:
    """Send every logger's records to stderr as JSON lines (idempotent)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_dpsynth", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    handler._dpsynth = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level.upper())
