"""The ledger's OpenAPI document, made to say what the ledger really answers (issue 14,
item 15; the api's is :mod:`dpsynth_api.openapi`).

FastAPI documents a route's success, its request-validation error (as ``application/json``)
and the router's blanket ``responses=`` (400/401/404/409 on every route, true of few). The
ledger answers every error as RFC 9457 ``application/problem+json`` (:mod:`.problems`), from
places no route declares. This hook replaces the error responses of each operation with
those derived once from what the route depends on:

==============================  ==================================================
every operation                 400 (malformed body, NUL in a path id or query),
                                422 (validation)
the bearer service token        401 (every ``/v1`` route: :class:`.auth.ServiceTokens`)
``/v1/admin/*``                 403 (a token that is not an admin token)
a path parameter                404 (unknown id)
the database or heavy work      503 (``ledger_busy`` with ``Retry-After``,
                                ``ledger_behind_anchor``, ``service_unavailable``)
==============================  ==================================================

What only the domain knows (a 409 on an exhausted budget, a 403 without a read grant) is in
:data:`DOMAIN_STATUSES`, one line per operation. ``tests/integration/ledger/
test_ledger_openapi_schemathesis.py`` runs schemathesis over every operation against this
document and a real ledger (docs/api-contract.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from dpsynth_shared.openapi_problems import declare_problems, finish_components, problem
from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute, RouteContext, iter_route_contexts

from dpsynth_ledger.auth import ADMIN_PREFIX, ServiceTokens

DESCRIPTIONS: dict[int, str] = {
    400: "invalid_request: a malformed body, a NUL byte in a path id or query value, or a "
         "request the ledger's rules refuse",
    401: "unauthenticated: no valid service token (Authorization: Bearer ...)",
    403: "forbidden: not an admin token (/v1/admin), or grant_required / invalid_grant",
    404: "not_found: no such budget, reservation, lease or evaluation",
    409: "a conflict with the budget's state: privacy_budget_exhausted, "
         "reservation_exhausted, stale_attempt, lease_expired, conflict",
    410: "dataset_deleted: the dataset's budget is closed",
    422: "invalid_request / plan_too_large / policy_violation and the other validation codes",
    503: "ledger_busy (retry after Retry-After), ledger_behind_anchor (reconcile first) or "
         "service_unavailable",
}

# Statuses the domain answers beyond the derived ones, by (method, path).
DOMAIN_STATUSES: dict[tuple[str, str], tuple[int, ...]] = {
    ("POST", "/v1/budgets"): (409,),
    ("POST", "/v1/budgets/{dataset_id}/histogram-releases"): (409,),
    ("PUT", "/v1/budgets/{dataset_id}/class-sizes"): (409,),
    ("POST", "/v1/budgets/{dataset_id}/limit"): (409,),
    ("POST", "/v1/plans"): (404, 409),
    ("POST", "/v1/reservations"): (404, 409),
    ("POST", "/v1/reservations/{reservation_id}/read-grants"): (403, 409),
    ("POST", "/v1/reservations/{reservation_id}/leases"): (403, 409),
    ("POST", "/v1/reservations/{reservation_id}/leases/{lease_id}/end"): (409,),
    ("POST", "/v1/reservations/{reservation_id}/extend"): (409,),
    ("POST", "/v1/reservations/{reservation_id}/close"): (409,),
    ("POST", "/v1/reservations/{reservation_id}/central-images"): (409,),
    ("POST", "/v1/evaluations"): (403, 404, 409),
    ("POST", "/v1/evaluations/{evaluation_id}/grant"): (403, 409),
    ("POST", "/v1/evaluations/{evaluation_id}/dp-releases"): (409,),
    ("POST", "/v1/job-epsilon"): (404,),
    ("POST", "/v1/admin/reconcile"): (409,),
}

SECURITY_SCHEMES = {
    "serviceToken": {"type": "http", "scheme": "bearer",
                     "description": "a ledger service token (the api's or a worker's); "
                                    "/v1/admin/* takes an admin token "
                                    "(DPSYNTH_LEDGER_ADMIN_TOKENS)"},
}


def _calls(dependant: Dependant) -> Iterator[Callable[..., Any]]:
    for dep in dependant.dependencies:
        if dep.call is not None:
            yield dep.call
        yield from _calls(dep)


def _uses_state(calls: set[Callable[..., Any]]) -> bool:
    # The router's session and context dependencies (router._session, router._ctx): the
    # database, the anchor's write guard and the heavy-work slots are behind them.
    return any(getattr(c, "__module__", "") == "dpsynth_ledger.router" for c in calls)


def statuses_of(route: RouteContext, path: str, method: str) -> tuple[set[int], bool]:
    """The problem statuses ``route`` (at ``path``) can answer for ``method``, and whether
    it takes the service token."""
    calls = set(_calls(route.dependant))
    statuses = {400, 422}
    authenticated = any(isinstance(c, ServiceTokens) for c in calls)
    if authenticated:
        statuses.add(401)
        if path.startswith(ADMIN_PREFIX):
            statuses.add(403)
    if route.param_convertors:
        statuses.add(404)
    if _uses_state(calls):
        statuses.add(503)
    statuses.update(DOMAIN_STATUSES.get((method, path), ()))
    return statuses, authenticated


RESPONSES: dict[int, dict[str, Any]] = {
    401: problem(401, DESCRIPTIONS[401]),
    503: problem(503, DESCRIPTIONS[503], retry_after=False),  # sent with ledger_busy
}


def _complete(document: dict[str, Any], route: RouteContext) -> None:
    path = route.path_format or ""
    for method in sorted(route.methods or ()):
        operation = document["paths"].get(path, {}).get(method.lower())
        if operation is None:
            continue
        statuses, authenticated = statuses_of(route, path, method)
        responses: dict[str, Any] = operation.setdefault("responses", {})
        for status in [s for s in responses if s[:1] in "45" and int(s) not in statuses]:
            del responses[status]  # the router's blanket declarations that do not apply
        declare_problems(operation, statuses, RESPONSES, DESCRIPTIONS)
        if authenticated:
            operation["security"] = [{"serviceToken": []}]


def build_document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document of ``app`` with every operation's real error responses."""
    document = get_openapi(title=app.title, version=app.version, description=app.description,
                           routes=app.routes)
    for route in iter_route_contexts(app.routes):
        if isinstance(route.original_route, APIRoute) and route.include_in_schema:
            _complete(document, route)
    finish_components(document, SECURITY_SCHEMES)
    return document


def install_openapi(app: FastAPI) -> None:
    """Serve :func:`build_document` at ``/openapi.json`` (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
