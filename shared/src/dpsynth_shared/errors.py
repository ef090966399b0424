"""Domain errors with stable codes, and their RFC 9457 problem+json form.

Every service raises :class:`DpsynthError` (or a subclass) from domain code and maps the
``code`` to an HTTP status in one table (:data:`HTTP_STATUS`). A client turns a problem body
back into the same exception with :func:`error_from_problem`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

PROBLEM_CONTENT_TYPE = "application/problem+json"


class ErrorCode(StrEnum):
    """Stable machine-readable error codes (never rename one; add new ones)."""

    INVALID_SPEC = "invalid_spec"
    INVALID_REQUEST = "invalid_request"
    INVALID_DATASET = "invalid_dataset"
    INVALID_ARCHIVE = "invalid_archive"
    UNSAFE_ARCHIVE = "unsafe_archive"
    INVALID_IMAGE = "invalid_image"
    UNSAFE_NPZ = "unsafe_npz"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    INVALID_MODEL = "invalid_model"
    NOT_FOUND = "not_found"
    UNAUTHENTICATED = "unauthenticated"
    FORBIDDEN = "forbidden"
    KEY_IN_QUERY = "api_key_in_query_string"
    VISIBILITY_MISMATCH = "visibility_mismatch"
    PRIVACY_BUDGET_EXHAUSTED = "privacy_budget_exhausted"
    RESERVATION_EXHAUSTED = "reservation_exhausted"
    LEASE_EXPIRED = "lease_expired"
    STALE_ATTEMPT = "stale_attempt"
    INVALID_GRANT = "invalid_grant"
    GRANT_REQUIRED = "read_grant_required"
    INVALID_TRANSITION = "invalid_transition"
    CLAIM_REFUSED = "claim_refused"
    CONFLICT = "conflict"
    UNSUPPORTED_NEIGHBOURING = "unsupported_neighbouring"
    PRIVATE_CONDITIONING_REFUSED = "private_conditioning_refused"
    METHOD_NOT_OFFERED = "method_not_offered"
    PRIVATE_DATA_OVERLAP = "private_data_overlap"
    PUBLIC_PRIVATE_OVERLAP = "public_private_overlap"
    DUPLICATE_RECORDS = "duplicate_records"
    POLICY_VIOLATION = "policy_violation"
    DATASET_DELETED = "dataset_deleted"
    LEDGER_BEHIND_ANCHOR = "ledger_behind_anchor"
    NOT_PUBLISHABLE = "not_publishable"
    FEATURE_NETWORK_REJECTED = "feature_network_rejected"
    INCEPTION_UNAVAILABLE = "inception_weights_unavailable"
    NO_HOLDOUT = "no_holdout"
    HOLDOUT_TRAINED_ON = "holdout_trained_on"
    PRESIGN_REFUSED = "presign_refused"
    LEDGER_UNAVAILABLE = "ledger_unavailable"
    SERVICE_UNAVAILABLE = "service_unavailable"
    INTERNAL = "internal_error"
    PLAN_TOO_LARGE = "plan_too_large"
    LEDGER_BUSY = "ledger_busy"
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
    IDEMPOTENCY_IN_PROGRESS = "idempotency_in_progress"
    INVALID_IDEMPOTENCY_KEY = "invalid_idempotency_key"
    RATE_LIMITED = "rate_limited"
    PLATFORM_SCOPE_REFUSED = "platform_scope_refused"


HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_SPEC: 422,
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.INVALID_DATASET: 422,
    ErrorCode.INVALID_ARCHIVE: 422,
    ErrorCode.UNSAFE_ARCHIVE: 422,
    ErrorCode.INVALID_IMAGE: 422,
    ErrorCode.UNSAFE_NPZ: 422,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.INVALID_MODEL: 422,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.KEY_IN_QUERY: 400,
    ErrorCode.VISIBILITY_MISMATCH: 422,
    ErrorCode.PRIVACY_BUDGET_EXHAUSTED: 409,
    ErrorCode.RESERVATION_EXHAUSTED: 409,
    ErrorCode.LEASE_EXPIRED: 409,
    ErrorCode.STALE_ATTEMPT: 409,
    ErrorCode.INVALID_GRANT: 403,
    ErrorCode.GRANT_REQUIRED: 403,
    ErrorCode.INVALID_TRANSITION: 409,
    ErrorCode.CLAIM_REFUSED: 409,
    ErrorCode.CONFLICT: 409,
    ErrorCode.UNSUPPORTED_NEIGHBOURING: 422,
    ErrorCode.PRIVATE_CONDITIONING_REFUSED: 422,
    ErrorCode.METHOD_NOT_OFFERED: 422,
    ErrorCode.PRIVATE_DATA_OVERLAP: 409,
    ErrorCode.PUBLIC_PRIVATE_OVERLAP: 409,
    ErrorCode.DUPLICATE_RECORDS: 422,
    ErrorCode.POLICY_VIOLATION: 422,
    ErrorCode.DATASET_DELETED: 410,
    ErrorCode.LEDGER_BEHIND_ANCHOR: 503,
    ErrorCode.NOT_PUBLISHABLE: 409,
    ErrorCode.FEATURE_NETWORK_REJECTED: 422,
    ErrorCode.INCEPTION_UNAVAILABLE: 422,
    ErrorCode.NO_HOLDOUT: 422,
    ErrorCode.HOLDOUT_TRAINED_ON: 409,
    ErrorCode.PRESIGN_REFUSED: 403,
    ErrorCode.LEDGER_UNAVAILABLE: 503,
    ErrorCode.SERVICE_UNAVAILABLE: 503,
    ErrorCode.INTERNAL: 500,
    ErrorCode.PLAN_TOO_LARGE: 422,
    ErrorCode.LEDGER_BUSY: 503,
    ErrorCode.IDEMPOTENCY_KEY_REUSED: 422,
    ErrorCode.IDEMPOTENCY_IN_PROGRESS: 409,
    ErrorCode.INVALID_IDEMPOTENCY_KEY: 422,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.PLATFORM_SCOPE_REFUSED: 403,
}

TITLES: dict[ErrorCode, str] = {
    ErrorCode.PRIVACY_BUDGET_EXHAUSTED: "Privacy budget exhausted",
    ErrorCode.NOT_FOUND: "Not found",
    ErrorCode.UNAUTHENTICATED: "Authentication required",
    ErrorCode.FORBIDDEN: "Forbidden",
    ErrorCode.INVALID_SPEC: "Invalid job spec",
    ErrorCode.INVALID_TRANSITION: "Invalid job state transition",
    ErrorCode.HOLDOUT_TRAINED_ON: "Held-out records were trained on",
}

# A ``privacy_budget_exhausted`` refusal keeps its stable code (clients and the worker act on
# it) but says which case it is in its ``refusal`` member and title: a job that merely asks
# for more than is admissible is not an exhausted budget (issue 15, item 3).
REFUSAL_EXCEEDS = "exceeds_admissible"
REFUSAL_RESERVED = "reserved"
REFUSAL_EXHAUSTED = "exhausted"
SMALLEST_TARGET = 1e-3  # = dpsynth_shared.text.MIN_EPSILON (which imports this module)
REFUSAL_TITLES: dict[str, str] = {
    REFUSAL_EXCEEDS: "Request exceeds the admissible privacy budget",
    REFUSAL_RESERVED: "Privacy budget held by running jobs",
    REFUSAL_EXHAUSTED: "Privacy budget exhausted",
}


class DpsynthError(Exception):
    """A domain error with a stable ``code`` and optional structured ``extensions``.

    Args:
        code: the stable error code.
        detail: a human-readable explanation specific to this occurrence. It must never
            name private records (file names, values): those only go to owner-only artifacts.
        extensions: extra members of the problem body (numbers a client can act on).
    """

    def __init__(self, code: ErrorCode | str, detail: str, **extensions: Any) -> None:
        super().__init__(detail)
        self.code = ErrorCode(code) if code in ErrorCode._value2member_map_ else code
        self.detail = detail
        self.extensions = extensions

    @property
    def status(self) -> int:
        if isinstance(self.code, ErrorCode):
            return HTTP_STATUS[self.code]
        return 500

    @property
    def title(self) -> str:
        """The problem's title: per code, and per case of a budget refusal."""
        code = str(self.code)
        if not isinstance(self.code, ErrorCode):
            return code
        refusal = self.extensions.get("refusal")
        if self.code == ErrorCode.PRIVACY_BUDGET_EXHAUSTED and refusal in REFUSAL_TITLES:
            return REFUSAL_TITLES[refusal]
        return TITLES.get(self.code, code.replace("_", " ").capitalize())

    def to_problem(self, instance: str | None = None) -> Problem:
        code = str(self.code)
        title = self.title
        return Problem(
            type=f"https://dpsynth.dev/problems/{code.replace('_', '-')}",
            title=title,
            status=self.status,
            detail=self.detail,
            code=code,
            instance=instance,
            **self.extensions,
        )

    def __repr__(self) -> str:
        return f"DpsynthError({self.code!s}, {self.detail!r})"


class Problem(BaseModel):
    """RFC 9457 problem details, with dpsynth's stable ``code`` member."""

    model_config = ConfigDict(extra="allow")

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    code: str
    instance: str | None = None


class NotFound(DpsynthError):
    def __init__(self, what: str, ident: str) -> None:
        super().__init__(ErrorCode.NOT_FOUND, f"{what} {ident!r} does not exist", resource=what)


class BudgetExhausted(DpsynthError):
    def __init__(self, detail: str, **numbers: Any) -> None:
        super().__init__(ErrorCode.PRIVACY_BUDGET_EXHAUSTED, detail, **numbers)


def error_from_problem(body: dict[str, Any]) -> DpsynthError:
    """Rebuild the domain error a service raised from its problem+json body."""
    known = {"type", "title", "status", "detail", "code", "instance"}
    ext = {k: v for k, v in body.items() if k not in known}
    err = DpsynthError(body.get("code", "internal_error"), body.get("detail", ""), **ext)
    return err


def round_down(value: float, digits: int = 3) -> float:
    """``value`` rounded DOWN to ``digits`` significant digits (never above ``value``)."""
    if not math.isfinite(value) or value <= 0:
        return value
    scale = 10.0 ** (digits - 1 - math.floor(math.log10(value)))
    units = math.floor(value * scale)
    while units > 0 and units / scale > value:  # float rounding of the product or quotient
        units -= 1
    return units / scale


def budget_refusal(numbers: Mapping[str, Any], *, best: float | None, computed: bool = True,
                   held: bool = False, what: str = "job",
                   field: str = "target_epsilon") -> BudgetExhausted:
    """The filter's refusal of a job or release, saying first what the user can change.

    Args:
        numbers: the refusal's figures (``target_epsilon``, ``epsilon_limit``,
            ``dataset_epsilon_spent``, ``dataset_epsilon_reserved``, ...), kept as members.
        best: the largest target the filter admits now for this shape (None: none fits, or
            not computed); shown rounded DOWN (:func:`round_down`), so that following the
            advice is admitted, as ``suggested_target_epsilon``.
        computed: False when ``best`` could not be computed (every heavy slot busy): the
            detail says so rather than print a number.
        held: whether the room is held by running jobs' reservations (when nothing fits:
            "reserved", not "exhausted").
        what: "job", or the release refused ("class-size histogram", ...).
        field: the request's name of the target.
    """
    suggested = round_down(best) if best is not None else None
    if (suggested is not None and suggested >= SMALLEST_TARGET) or not computed:
        refusal = REFUSAL_EXCEEDS
    else:
        refusal = REFUSAL_RESERVED if held else REFUSAL_EXHAUSTED
    ext = {**numbers, "refusal": refusal, "max_admissible_target_epsilon": best,
           "suggested_target_epsilon": suggested if refusal == REFUSAL_EXCEEDS else None,
           "field": field}
    return BudgetExhausted(budget_refusal_detail(ext, field=field, what=what), **ext)


def budget_refusal_detail(numbers: Mapping[str, Any], *, field: str = "target_epsilon",
                          what: str = "job") -> str:
    """The detail of a job's budget refusal, from its numbers; what the user can change first.

    Args:
        numbers: the refusal's members: ``refusal`` (``REFUSAL_*``), ``target_epsilon``,
            ``suggested_target_epsilon`` (the largest admissible target rounded down; None
            when it was not computed), ``epsilon_limit``, ``dataset_epsilon_spent``,
            ``dataset_epsilon_reserved``, optionally ``partitions_over_budget``.
        field: how the user names the target (``privacy.target_epsilon`` in a job spec).
        what: "job", or the release refused.
    """
    def g(key: str) -> str:
        value = numbers.get(key)
        return f"{value:.4g}" if isinstance(value, int | float) else "?"

    refusal = numbers.get("refusal", REFUSAL_EXCEEDS)
    books = ", ".join(f"{label} {g(key)}" for label, key in (
        ("limit ε", "epsilon_limit"), ("spent", "dataset_epsilon_spent"),
        ("reserved by running jobs", "dataset_epsilon_reserved")) if key in numbers)
    figures = f" ({books})" if books else ""
    if refusal == REFUSAL_EXHAUSTED:
        return ("this dataset's privacy budget is exhausted: no job can be admitted on it any "
                f"more, and a limit is never raised{figures}")
    if refusal == REFUSAL_RESERVED:
        return (f"no {what} of this shape is admissible on this dataset now: the budget that is "
                f"not spent is reserved by running jobs, and frees when they end{figures}")
    classes = numbers.get("partitions_over_budget")
    where = f" (over the budget of class(es) {', '.join(map(str, classes))})" if classes else ""
    best = numbers.get("suggested_target_epsilon")
    if not isinstance(best, int | float):
        return (f"this {what} would need ε {g('target_epsilon')}, more than is admissible on this "
                f"dataset now{where}; the ledger was too busy to compute the largest "
                f"admissible {field}: a dry run (dry_run) names it{figures}")
    return (f"this {what} would need ε {g('target_epsilon')}; at most {best:g} is admissible on "
            f"this dataset now (lower {field} to ≤ {best:g}){where}. The dataset's privacy "
            f"filter refuses it{figures}")


def problem_schema_fields() -> dict[str, Any]:
    """OpenAPI description of the problem body, for route ``responses=``."""
    return {"model": Problem, "description": "RFC 9457 problem details"}


__all__ = [
    "HTTP_STATUS",
    "PROBLEM_CONTENT_TYPE",
    "REFUSAL_EXCEEDS",
    "REFUSAL_EXHAUSTED",
    "REFUSAL_RESERVED",
    "REFUSAL_TITLES",
    "SMALLEST_TARGET",
    "BudgetExhausted",
    "DpsynthError",
    "ErrorCode",
    "NotFound",
    "Problem",
    "budget_refusal",
    "budget_refusal_detail",
    "error_from_problem",
    "round_down",
]
