"""Strings and numbers the platform's stores and accountant can take (issue 14, item 4).

PostgreSQL refuses a NUL byte in ``text``/``jsonb`` and the accountant cannot calibrate
an epsilon near zero; such values are refused at the edge (schemas) with a 422
``invalid_request``/``invalid_spec`` instead of failing deep in a service with a 500/503.

* :func:`refuse_nul` walks any JSON-like value and refuses a NUL byte or a lone UTF-16
  surrogate (JSON's ``"\ud800"``, which no UTF-8 text column can store) in any string or
  key; the bases of the ledger's contract and the job specs run it on every body.
* :data:`Name`: a display name or class name, no control character at all (C0, DEL, C1).
* :data:`MIN_EPSILON`: the smallest standalone epsilon any release or job may target.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, model_validator

from dpsynth_shared.errors import DpsynthError, ErrorCode

MIN_EPSILON = 1e-3
"""The smallest target epsilon of a job or release (calibration below it is refused)."""

MAX_DECLARED_SIZE = 10**9
"""The largest population size the ledger takes (the api caps uploads at 10^8)."""

MAX_INT32 = 2**31 - 1
"""Counts stored in a 32-bit ``Integer`` column are capped below this."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")


def refuse_nul(value: Any) -> Any:
    """Return ``value`` unchanged, or raise ValueError if any string in it has a NUL byte or
    a lone surrogate (neither can be stored as UTF-8 text: PostgreSQL would fail with a 500)."""
    if isinstance(value, str):
        if _UNSTORABLE.search(value):
            raise ValueError("a string contains a NUL byte (\\x00) or a lone surrogate "
                             "(\\ud800-\\udfff), which is not accepted")
    elif isinstance(value, dict):
        for k, v in value.items():
            refuse_nul(k)
            refuse_nul(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            refuse_nul(v)
    return value


def _no_control(value: str) -> str:
    if _CONTROL.search(value):
        raise ValueError("a name may not contain control characters (NUL, newline, tab, ...)")
    return value


Name = Annotated[str, AfterValidator(_no_control)]
"""A name (dataset, tenant, class, column): no control characters, no lone surrogate."""

NulFree = Annotated[str, AfterValidator(refuse_nul)]
"""Any string that may reach SQL: no NUL byte."""


def has_control(value: str) -> bool:
    """Whether ``value`` has a control character (a path id that cannot exist)."""
    return _CONTROL.search(value) is not None


def refuse_bad_request_strings(path_params: Mapping[str, Any],
                               query: Iterable[tuple[str, str]]) -> None:
    """Checked on every request of the api and the ledger.

    A path parameter with a control character names nothing (ids are ``<prefix>_<hex>``), so
    it is answered like a missing id (404 ``not_found``); a query value with a NUL byte is a
    400 ``invalid_request``. Both would otherwise reach PostgreSQL, which refuses NUL (500).
    """
    for name, value in path_params.items():
        if isinstance(value, str) and has_control(value):
            raise DpsynthError(ErrorCode.NOT_FOUND, f"no such {name}", resource=name)
    for name, value in query:
        if _UNSTORABLE.search(name) or _UNSTORABLE.search(value):
            raise DpsynthError(ErrorCode.INVALID_REQUEST,
                               "a query parameter contains a NUL byte (\\x00) or a lone "
                               "surrogate")


class ContractBody(BaseModel):
    """Base of every request body of the contracts (ledger, releases, job specs): unknown
    fields are refused, and so is a NUL byte anywhere in the body, which PostgreSQL takes in
    neither text nor jsonb (issue 14, item 4)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        return refuse_nul(data)
