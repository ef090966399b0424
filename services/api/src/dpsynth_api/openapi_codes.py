"""The stable problem ``code``\\s behind each error status of the api's operations, and the
tags that group them (issue 15, item 7).

A status says what kind of failure it is; the body's ``code`` says which one, and is what a
client branches on (:class:`dpsynth_shared.errors.ErrorCode`, never renamed). The document
lists, under each problem response of each operation, the codes that status carries there:
those of the statuses :mod:`dpsynth_api.openapi` derives from the route's dependencies
(:func:`derived_codes`), and what only the domain knows (:data:`DOMAIN_CODES`, one line per
operation, read from the services' ``raise DpsynthError(...)``\\s). A status whose codes are
not all known keeps its generic description; listing a code here never removes a status.
"""

from __future__ import annotations

from dpsynth_shared.errors import HTTP_STATUS, ErrorCode

C = ErrorCode

# The codes behind each status the hook derives (the guard, the dependencies, the handlers).
DERIVED_CODES: dict[int, tuple[ErrorCode, ...]] = {
    400: (C.INVALID_REQUEST, C.KEY_IN_QUERY),
    401: (C.UNAUTHENTICATED,),
    403: (C.FORBIDDEN,),
    404: (C.NOT_FOUND,),
    413: (C.PAYLOAD_TOO_LARGE,),
    422: (C.INVALID_REQUEST,),  # FastAPI's validation errors (errors.py)
    429: (C.RATE_LIMITED,),
    503: (C.SERVICE_UNAVAILABLE,),
}
# ``POST /v1/...`` with an ``Idempotency-Key`` (dpsynth_api.idempotency).
IDEMPOTENCY_CODES = (C.IDEMPOTENCY_IN_PROGRESS, C.IDEMPOTENCY_KEY_REUSED,
                     C.INVALID_IDEMPOTENCY_KEY)
# An operation that depends on the ledger (dpsynth_api.adapters.ledger_http passes these on).
LEDGER_CODES = (C.LEDGER_UNAVAILABLE, C.LEDGER_BUSY)
UPLOAD_CODES = (C.INVALID_DATASET, C.INVALID_ARCHIVE, C.UNSAFE_ARCHIVE, C.INVALID_IMAGE,
                C.UNSAFE_NPZ, C.DUPLICATE_RECORDS)

# What only the domain answers, by (method, path): its statuses follow from HTTP_STATUS.
DOMAIN_CODES: dict[tuple[str, str], tuple[ErrorCode, ...]] = {
    ("POST", "/v1/tenants"): (C.PLATFORM_SCOPE_REFUSED,),
    ("POST", "/v1/tenants/{tenant_id}/keys"): (C.PLATFORM_SCOPE_REFUSED,),
    ("POST", "/v1/datasets"): (*UPLOAD_CODES, C.PRIVATE_DATA_OVERLAP,
                               C.PUBLIC_PRIVATE_OVERLAP, C.POLICY_VIOLATION),
    ("DELETE", "/v1/datasets/{dataset_id}"): (C.CONFLICT, C.DATASET_DELETED),
    ("GET", "/v1/datasets/{dataset_id}/holdout"): (C.DATASET_DELETED,),
    ("POST", "/v1/datasets/{dataset_id}/class-sizes/release"): (
        C.CONFLICT, C.DATASET_DELETED, C.PRIVACY_BUDGET_EXHAUSTED),
    ("POST", "/v1/datasets/{dataset_id}/derive"): (C.DATASET_DELETED,),
    ("GET", "/v1/datasets/{dataset_id}/budget"): (C.VISIBILITY_MISMATCH,),
    ("PATCH", "/v1/datasets/{dataset_id}/budget"): (C.VISIBILITY_MISMATCH,),
    ("GET", "/v1/datasets/{dataset_id}/ledger"): (C.VISIBILITY_MISMATCH,),
    ("POST", "/v1/models"): (C.INVALID_MODEL,),
    ("GET", "/v1/models/{model_id}/download"): (C.NOT_PUBLISHABLE,),
    ("POST", "/v1/jobs"): (
        C.INVALID_SPEC, C.VISIBILITY_MISMATCH, C.UNSUPPORTED_NEIGHBOURING,
        C.METHOD_NOT_OFFERED, C.PRIVATE_CONDITIONING_REFUSED, C.NO_HOLDOUT,
        C.HOLDOUT_TRAINED_ON,
        C.PLAN_TOO_LARGE, C.PRIVACY_BUDGET_EXHAUSTED, C.NOT_PUBLISHABLE, C.DATASET_DELETED),
    ("POST", "/v1/jobs/{job_id}/cancel"): (C.INVALID_TRANSITION,),
    ("GET", "/v1/jobs/{job_id}/report"): (C.CONFLICT,),
    ("GET", "/v1/artifacts/{artifact_id}/download"): (C.PRESIGN_REFUSED,),
}

# The tags of the public document, in the order Swagger UI and ReDoc show them.
TAGS: list[dict[str, str]] = [
    {"name": "datasets", "description": "Upload private or public image datasets (zip, npz, "
     "Parquet), list them, split a held-out part, derive subsets, release class sizes."},
    {"name": "budgets", "description": "Each private dataset's privacy budget: its ε limit, "
     "what was spent, reserved and is left (docs/epsilons.md explains each ε)."},
    {"name": "ledger", "description": "The tamper-evident privacy ledger of a dataset: its "
     "entries (JSON or CSV), their verification and an independent recomputation."},
    {"name": "models", "description": "Base models to fine-tune and the models jobs produce, "
     "with their lineage; download where publishable."},
    {"name": "jobs", "description": "Fine-tuning, generation and evaluation jobs: submit "
     "(with a dry run that plans the ε first), follow, cancel, read the evaluation report."},
    {"name": "artifacts", "description": "What jobs produce (synthetic corpora, reports): "
     "metadata and downloads, directly or through a short-lived presigned URL."},
    {"name": "tenants", "description": "Tenants, their API keys and their policies "
     "(platform admin and tenant owner scopes)."},
    {"name": "admin", "description": "Platform operations on the ledger: its anchor and the "
     "reconciliation after a restore (admin scope)."},
    {"name": "health", "description": "Liveness and readiness probes (no key)."},
    {"name": "dashboard", "description": "The budget dashboard's page and files (no key: its "
     "script sends the key the user types)."},
    # Only in build_worker_document: /internal/v1 is no part of the public document.
    {"name": "internal", "description": "The workers' endpoints (the workers' shared token)."},
]
TAG_NAMES = frozenset(tag["name"] for tag in TAGS)


def derived_codes(status: int, *, idempotent: bool, ledger: bool,
                  path: str) -> tuple[ErrorCode, ...]:
    """The codes behind a derived ``status`` of an operation at ``path``."""
    codes = list(DERIVED_CODES.get(status, ()))
    if status == 422 and path == "/v1/jobs":
        codes = [C.INVALID_SPEC]  # a job spec's validation error (errors.py)
    if idempotent:
        codes += [c for c in IDEMPOTENCY_CODES if HTTP_STATUS[c] == status]
    if ledger:
        codes += [c for c in LEDGER_CODES if HTTP_STATUS[c] == status]
    return tuple(codes)


def domain_statuses(method: str, path: str) -> set[int]:
    """The statuses of :data:`DOMAIN_CODES`' codes for one operation."""
    return {HTTP_STATUS[code] for code in DOMAIN_CODES.get((method, path), ())}
