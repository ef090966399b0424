"""What the api's and the ledger's OpenAPI documents share: their errors are RFC 9457
problem+json bodies (issue 14, item 15).

Plain dictionaries only (this package imports no web framework): each service derives the
statuses of its operations from its own routes (dpsynth_api.openapi, dpsynth_ledger.openapi)
and declares them with :func:`declare_problems`; :func:`finish_components` replaces
FastAPI's validation-error schemas, which neither service ever sends, with :class:`Problem`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dpsynth_shared.errors import PROBLEM_CONTENT_TYPE, Problem

PROBLEM_REF = "#/components/schemas/Problem"
FASTAPI_422 = "Validation Error"  # FastAPI's own description of the 422 it documents
GENERIC = "RFC 9457 problem details"  # errors.problem_schema_fields' blanket description
RETRY_AFTER: dict[str, Any] = {"description": "seconds to wait before retrying",
                               "schema": {"type": "integer", "minimum": 0}}
CODES_EXTENSION = "x-problem-codes"  # a problem response's known ``code`` values
WWW_AUTHENTICATE: dict[str, Any] = {"description": "the scheme expected: Bearer",
                                    "schema": {"type": "string"}}


def problem(status: int, description: str, *, retry_after: bool | None = None,
            www_authenticate: bool = False) -> dict[str, Any]:
    """The OpenAPI response object of a problem+json answer.

    ``retry_after``: None, no header; False, an optional ``Retry-After``; True, a required
    one. ``www_authenticate``: a required ``WWW-Authenticate`` header (a 401 that sends it).
    """
    response: dict[str, Any] = {
        "description": description,
        "content": {PROBLEM_CONTENT_TYPE: {"schema": {"$ref": PROBLEM_REF}}}}
    headers: dict[str, Any] = {}
    if retry_after is not None:
        headers["Retry-After"] = {**RETRY_AFTER, "required": retry_after}
    if www_authenticate:
        headers["WWW-Authenticate"] = {**WWW_AUTHENTICATE, "required": True}
    if headers:
        response["headers"] = headers
    return response


def with_codes(response: dict[str, Any], codes: Iterable[str]) -> dict[str, Any]:
    """``response`` naming the problem ``code``\\s it is known to carry: in its description
    (what Swagger UI and ReDoc show) and as ``x-problem-codes`` (for tools), in order, once
    each. With no code it is returned unchanged."""
    known = list(dict.fromkeys(str(code) for code in codes))
    if not known:
        return response
    listed = ", ".join(f"`{code}`" for code in known)
    return {**response, "description": f"{response['description']}. Known codes: {listed}",
            CODES_EXTENSION: known}


def declare_problems(operation: dict[str, Any], statuses: Iterable[int],
                     make: Mapping[int, dict[str, Any]] | None = None,
                     describe: Mapping[int, str] | None = None) -> None:
    """Declare each of ``statuses`` on ``operation`` as a problem (``make[status]`` when
    given, else a plain :func:`problem` described by ``describe``), keeping a route's own,
    more specific description of a status it already declared."""
    responses: dict[str, Any] = operation.setdefault("responses", {})
    for status in sorted(set(statuses)):
        declared = responses.get(str(status), {}).get("description")
        if make is not None and status in make:
            response = {**make[status]}
        else:
            response = problem(status, (describe or {}).get(status, GENERIC))
        if declared and declared not in (FASTAPI_422, GENERIC):
            response["description"] = declared
        responses[str(status)] = response


def finish_components(document: dict[str, Any],
                      security_schemes: Mapping[str, Any]) -> None:
    """The :class:`Problem` schema in place of FastAPI's validation-error schemas, and the
    security schemes."""
    components = document.setdefault("components", {})
    schemas: dict[str, Any] = components.setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    schemas["Problem"] = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    components["securitySchemes"] = dict(security_schemes)
