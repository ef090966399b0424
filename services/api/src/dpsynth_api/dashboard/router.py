"""``/dashboard``: the budget dashboard's page and its static files (script modules, style).

The page holds no data and needs no credential: the browser script asks the public REST
endpoints (``/v1/datasets``, ``/v1/datasets/{id}/budget``, ``/v1/jobs``) with the key the user
typed, kept in ``sessionStorage`` and sent as ``Authorization: Bearer``. A key in a query
string never reaches these routes: :class:`dpsynth_api.middleware.GuardMiddleware` refuses it
(400 ``api_key_in_query_string``) for every path. Every response carries a strict
Content-Security-Policy (``default-src 'self'``, no inline script or style, no framing), and
the files come from the package's data: nothing is fetched from anywhere else at run time.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from dpsynth_shared.errors import DpsynthError, ErrorCode
from fastapi import APIRouter, Response

router = APIRouter(tags=["dashboard"])

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
}
# The only files served (an allow-list: no path from the request ever reaches the filesystem).
# ``dashboard.js`` is the entry module; it imports the others (same origin, plain ES modules:
# no build step).
_JS = "text/javascript; charset=utf-8"
STATIC_FILES = {
    "dashboard.js": _JS,
    "api.js": _JS,
    "dom.js": _JS,
    "chart.js": _JS,
    "overview.js": _JS,
    "detail.js": _JS,
    "dashboard.css": "text/css; charset=utf-8",
}


@cache
def _read(name: str) -> bytes:
    """A packaged file's bytes (read once per process)."""
    return files("dpsynth_api.dashboard").joinpath("static", name).read_bytes()


def _response(name: str, media_type: str) -> Response:
    return Response(_read(name), media_type=media_type, headers=SECURITY_HEADERS)


@router.get("/dashboard", response_class=Response, responses={
    200: {"description": "the page", "content": {"text/html": {"schema": {"type": "string"}}}}})
def dashboard_page() -> Response:
    """The dashboard's page: a key-entry form, the overview and the per-dataset detail."""
    return _response("index.html", "text/html; charset=utf-8")


@router.get("/dashboard/static/{name}", response_class=Response, responses={
    200: {"description": "a script module or the style sheet",
          "content": {media_type.split(";")[0]: {"schema": {"type": "string"}}
                      for media_type in STATIC_FILES.values()}}})
def dashboard_static(name: str) -> Response:
    """The dashboard's script modules and style sheet (404 for any other name)."""
    media_type = STATIC_FILES.get(name)
    if media_type is None:
        raise DpsynthError(ErrorCode.NOT_FOUND, "no such dashboard file")
    return _response(name, media_type)
