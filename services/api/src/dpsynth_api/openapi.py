"""The api's OpenAPI document, made to say what the api really answers (issue 14, item 15).

FastAPI documents only a route's success and its request-validation error, the latter as
``application/json``. The api answers every error as RFC 9457 ``application/problem+json``
(:mod:`dpsynth_api.errors`), from places no route declares: the guard middleware (400, 413),
the authentication and scope dependencies (401, 403), the per-key rate limit (429), the
idempotency keys (409, 422), the database pool and the ledger (503). Declaring those on each
route would be 35 copies that drift apart, so this hook derives them once from what each
route depends on:

==========================  =====================================================
every operation             400 (NUL or a key in the query), 422 (validation)
a path parameter            404 (unknown, foreign, or a malformed id)
a request body              413 (over the upload cap, counted on the wire)
an API key                  401 (``WWW-Authenticate: Bearer``), 403 with a scope check
the worker token            401
``/v1/...``                 429 (the per-key rate limit, ``Retry-After``)
a ``POST /v1/...``          the optional ``Idempotency-Key`` header, 409, 422
the database or the ledger  503 (pool exhausted, ledger unreachable, ``Retry-After``)
==========================  =====================================================

What only the domain knows (a 409 on a budget, a 410 on a deleted dataset) is in
:data:`DOMAIN_STATUSES`, one line per operation, and, where known, the stable ``code``\\s
behind each status in :mod:`dpsynth_api.openapi_codes` (issue 15, item 7): each problem
response names them ("Known codes", ``x-problem-codes``).

The public document is what ``/docs`` and ``/redoc`` show (:mod:`dpsynth_api.docs_ui`): its
operations are grouped by tags (:data:`dpsynth_api.openapi_codes.TAGS`), every operation that
takes a key names the ``apiKey`` bearer scheme (Swagger UI's "Authorize"), and the workers'
``/internal/v1`` routes are left out (registered with ``include_in_schema=False``; they work
as before). :func:`build_worker_document` documents those for the worker contract.

``tests/integration/api/test_openapi_schemathesis.py`` runs schemathesis over every operation
against this document, so a route that answers a status, a content type or a body it does
not declare fails there (docs/api-contract.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from dpsynth_shared.errors import HTTP_STATUS
from dpsynth_shared.openapi_problems import FASTAPI_422, finish_components, with_codes
from dpsynth_shared.openapi_problems import problem as problem_object
from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute, RouteContext, iter_route_contexts

from dpsynth_api.deps import get_ledger, get_principal, get_session, require, require_worker
from dpsynth_api.idempotency import KEY_PATTERN
from dpsynth_api.openapi_codes import DOMAIN_CODES, TAGS, derived_codes, domain_statuses

# Short reasons per status; the body's ``code`` is the stable, machine-readable part.
DESCRIPTIONS: dict[int, str] = {
    400: "invalid_request (a NUL byte in a query value) or api_key_in_query_string",
    401: "unauthenticated: no valid key (Authorization: Bearer ...)",
    403: "forbidden: the key lacks the scope, or a grant or policy refuses the action",
    404: "not_found: no such resource for this tenant (a foreign id answers the same)",
    409: "a conflict with the resource's state (budget, job state, overlap, idempotency)",
    410: "dataset_deleted: the dataset's data was deleted",
    413: "payload_too_large: the body or an archive member is over its cap",
    422: "invalid_request / invalid_spec and the other validation codes",
    429: "rate_limited: too many requests for this key; retry after Retry-After seconds",
    503: "service_unavailable / ledger_unavailable: retry shortly",
}

# Statuses the domain answers beyond the derived ones, by (method, path).
DOMAIN_STATUSES: dict[tuple[str, str], tuple[int, ...]] = {
    ("GET", "/readyz"): (503,),
    ("POST", "/v1/tenants"): (409,),
    ("POST", "/v1/tenants/{tenant_id}/keys"): (409,),
    ("POST", "/v1/keys/{key_id}/revoke"): (409,),
    ("POST", "/v1/datasets"): (404, 409),
    ("DELETE", "/v1/datasets/{dataset_id}"): (409, 410),
    ("GET", "/v1/datasets/{dataset_id}/holdout"): (410,),
    ("POST", "/v1/datasets/{dataset_id}/class-sizes/release"): (409, 410),
    ("POST", "/v1/datasets/{dataset_id}/derive"): (409, 410),
    ("PATCH", "/v1/datasets/{dataset_id}/budget"): (409,),
    ("GET", "/v1/models/{model_id}/download"): (409,),
    ("POST", "/v1/jobs"): (404, 409, 410),
    ("POST", "/v1/jobs/{job_id}/cancel"): (409,),
    ("GET", "/v1/jobs/{job_id}/report"): (409,),
    ("GET", "/v1/artifacts/{artifact_id}/download"): (409,),
    ("POST", "/v1/admin/ledger/reconcile"): (409,),
}
# The same for the workers' routes (in build_worker_document only).
WORKER_STATUSES: dict[tuple[str, str], tuple[int, ...]] = {
    ("POST", "/internal/v1/jobs/{job_id}/claim"): (409,),
    ("POST", "/internal/v1/jobs/{job_id}/heartbeat"): (409,),
    ("POST", "/internal/v1/jobs/{job_id}/artifacts"): (409,),
    ("POST", "/internal/v1/jobs/{job_id}/transition"): (409,),
}

IDEMPOTENCY_KEY: dict[str, Any] = {
    "name": "Idempotency-Key", "in": "header", "required": False,
    "description": "a client-chosen key (per tenant): a replay with the same key and body "
                   "returns the first response; another body is a 422 "
                   "idempotency_key_reused; a replay while the first runs is a 409 "
                   "idempotency_in_progress (docs/api-contract.md)",
    "schema": {"type": "string", "pattern": f"^{KEY_PATTERN.pattern}$"},
}
# dpsynth_api.ratelimit limits every path under this prefix, with a key or without.
RATE_LIMITED_PREFIX = "/v1/"
BINARY = {"type": "string", "format": "binary"}
SECURITY_SCHEMES = {
    "apiKey": {"type": "http", "scheme": "bearer", "bearerFormat": "dps_...",
               "description": "a tenant's API key (scopes: read, submit, owner, admin)"},
    "workerToken": {"type": "http", "scheme": "bearer",
                    "description": "the workers' shared token (/internal/v1 only)"},
}


def problem(status: int) -> dict[str, Any]:
    """The OpenAPI response object of a problem+json answer with ``status``."""
    # Always sent with a 429 (the limiter) and a 401 (errors.py); a 503 has it when retrying
    # soon helps (pool exhausted, ledger busy). The object is dpsynth_shared.openapi_problems'.
    return problem_object(status, DESCRIPTIONS.get(status, "RFC 9457 problem details"),
                          retry_after=status == 429 if status in (429, 503) else None,
                          www_authenticate=status == 401)


def _calls(dependant: Dependant) -> Iterator[Callable[..., Any]]:
    for dep in dependant.dependencies:
        if dep.call is not None:
            yield dep.call
        yield from _calls(dep)


def _is_scope_check(call: Callable[..., Any]) -> bool:
    # ``require(scope)`` returns a fresh closure per scope; its qualified name is stable.
    return getattr(call, "__qualname__", "").startswith(f"{require.__qualname__}.<locals>.")


def takes_idempotency_key(path: str, method: str) -> bool:
    """``dpsynth_api.idempotency`` honours the header on every ``POST /v1/...``."""
    return method == "POST" and path.startswith("/v1/")


def statuses_of(route: RouteContext, path: str,
                method: str) -> tuple[set[int], str | None]:
    """The problem statuses ``route`` (at ``path``) can answer for ``method``, and its
    security scheme."""
    calls = set(_calls(route.dependant))
    statuses = {400, 422}
    scheme: str | None = None
    if route.param_convertors:
        statuses.add(404)
    if route.body_field is not None:
        statuses.add(413)
    if get_principal in calls:
        statuses.add(401)
        scheme = "apiKey"
    if any(_is_scope_check(c) for c in calls):
        statuses.add(403)
    if require_worker in calls:
        statuses.add(401)
        scheme = "workerToken"
    if path.startswith(RATE_LIMITED_PREFIX):
        statuses.add(429)
    if calls & {get_session, get_ledger}:
        statuses.add(503)
    if takes_idempotency_key(path, method):
        statuses.add(409)
    statuses.update(DOMAIN_STATUSES.get((method, path), ()))
    statuses.update(WORKER_STATUSES.get((method, path), ()))
    statuses.update(domain_statuses(method, path))
    return statuses, scheme


def codes_of(route: RouteContext, path: str, method: str, status: int) -> list[str]:
    """The known problem codes of ``status`` on one operation (derived, then the domain's)."""
    uses_ledger = get_ledger in set(_calls(route.dependant))
    codes = [*derived_codes(status, idempotent=takes_idempotency_key(path, method),
                            ledger=uses_ledger, path=path),
             *(c for c in DOMAIN_CODES.get((method, path), ()) if HTTP_STATUS[c] == status)]
    return [str(code) for code in codes]


def _tidy_success(operation: dict[str, Any], route: RouteContext) -> None:
    # A route without a response model declares its own success content (a file, a page);
    # FastAPI still adds an application/json placeholder without a schema: drop it.
    for status, response in operation.get("responses", {}).items():
        content: dict[str, Any] = response.get("content", {})
        if (status.startswith("2") and route.response_model is None and len(content) > 1
                and not content.get("application/json", {}).get("schema")):
            content.pop("application/json", None)


def _complete(document: dict[str, Any], route: RouteContext) -> None:
    path = route.path_format or ""
    for method in sorted(route.methods or ()):
        operation = document["paths"].get(path, {}).get(method.lower())
        if operation is None:
            continue
        _tidy_success(operation, route)
        statuses, scheme = statuses_of(route, path, method)
        responses: dict[str, Any] = operation.setdefault("responses", {})
        for status in sorted(statuses):
            declared = responses.get(str(status), {}).get("description")
            response = problem(status)
            if declared and declared != FASTAPI_422:  # a route's own, more specific reason
                response["description"] = declared
            responses[str(status)] = with_codes(response, codes_of(route, path, method, status))
        if scheme is not None:
            operation["security"] = [{scheme: []}]
        if takes_idempotency_key(path, method):
            params: list[dict[str, Any]] = operation.setdefault("parameters", [])
            if not any(p["name"] == IDEMPOTENCY_KEY["name"] for p in params):
                params.append(dict(IDEMPOTENCY_KEY))


def _schemes_used(document: dict[str, Any]) -> dict[str, Any]:
    used = {name for ops in document["paths"].values() for op in ops.values()
            for requirement in op.get("security", ()) for name in requirement}
    return {name: scheme for name, scheme in SECURITY_SCHEMES.items() if name in used}


def build_document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document of ``app`` with every operation's real error responses, its tags
    (only those in use, in :data:`~dpsynth_api.openapi_codes.TAGS`' order) and the security
    schemes its operations name."""
    document = get_openapi(title=app.title, version=app.version, description=app.description,
                           routes=app.routes)
    for route in iter_route_contexts(app.routes):
        if isinstance(route.original_route, APIRoute) and route.include_in_schema:
            _complete(document, route)
    used_tags = {tag for ops in document["paths"].values() for op in ops.values()
                 for tag in op.get("tags", ())}
    document["tags"] = [tag for tag in TAGS if tag["name"] in used_tags]
    # FastAPI's own 422 body is never sent (errors.py answers a Problem instead).
    finish_components(document, _schemes_used(document))
    return document


def build_worker_document() -> dict[str, Any]:
    """The workers' ``/internal/v1`` routes, documented as the public ones are (the
    ``workerToken`` scheme): for the worker contract's tests, never served."""
    from dpsynth_api.internal.router import router as internal_router  # no import cycle

    app = FastAPI(title="dpsynth api: the workers' endpoints", version="0.1.0",
                  docs_url=None, redoc_url=None)
    app.include_router(internal_router)
    return build_document(app)


def install_openapi(app: FastAPI) -> None:
    """Serve :func:`build_document` at ``/openapi.json`` (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
