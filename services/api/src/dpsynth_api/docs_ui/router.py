"""``/docs`` and ``/redoc``: the api's interactive documentation, with no CDN (issue 15,
item 7).

FastAPI's own pages load Swagger UI and ReDoc from a CDN, a blank page in a hospital
network without internet. These pages load every file from this api instead:

* the viewers' files come from the ``fastapi-offline`` package (MIT; its 1.7.7 ships Swagger
  UI 5.32.6, Apache-2.0, and ReDoc 2.5.3, MIT), read from the installed package, not copied
  into this repository; only its files are used, not its FastAPI factory;
* the start-up scripts and a few style rules are this package's own files (``static/``);
* the pages hold no inline script, so their Content-Security-Policy is strict:
  ``script-src 'self'``, ``connect-src 'self'`` (Swagger UI's "Try it out" calls this api
  only), nothing framed. ReDoc injects its styles as ``<style>`` elements: each /redoc
  response carries a fresh nonce that the policy's ``style-src`` names and that ReDoc puts
  on them (no ``'unsafe-inline'``). One sheet is injected while the script loads, before
  ReDoc can be given the nonce (perfect-scrollbar's): the policy names it by its hash
  (:data:`REDOC_STYLE_HASHES`). Its search index runs in a ``blob:`` worker.
* one request to another origin is built into ReDoc 2.5.3: its menu's "API docs by Redocly"
  logo, an ``<img>`` from ``cdn.redoc.ly``. :data:`PATCHES` replaces that URL, as the file is
  served, with an empty inline image (the CSP would refuse it anyway, with a console error);
  tests/e2e/test_docs_offline.py fails if a new version asks the network for anything.

The pages and files are public (like ``/openapi.json``): they hold no data. The key a user
types under "Authorize" stays in the tab's memory (``persistAuthorization`` is off) and is
sent only as ``Authorization: Bearer`` to this api.
"""

from __future__ import annotations

import html
import secrets
from functools import cache
from importlib.resources import files

from dpsynth_shared.errors import DpsynthError, ErrorCode
from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse

router = APIRouter(include_in_schema=False)

DOCS_PATH = "/docs"
REDOC_PATH = "/redoc"
STATIC_PATH = "/docs/static"
VENDOR_PACKAGE = "fastapi_offline"  # the package that ships the viewers' files
OWN_PACKAGE = "dpsynth_api.docs_ui"

# The only files served, by name: (package, media type). An allow-list: no path from the
# request ever reaches the filesystem.
STATIC_FILES: dict[str, tuple[str, str]] = {
    "swagger-ui-bundle.js": (VENDOR_PACKAGE, "text/javascript; charset=utf-8"),
    "swagger-ui.css": (VENDOR_PACKAGE, "text/css; charset=utf-8"),
    "redoc.standalone.js": (VENDOR_PACKAGE, "text/javascript; charset=utf-8"),
    "favicon.png": (VENDOR_PACKAGE, "image/png"),
    "swagger-init.js": (OWN_PACKAGE, "text/javascript; charset=utf-8"),
    "redoc-init.js": (OWN_PACKAGE, "text/javascript; charset=utf-8"),
    "docs.css": (OWN_PACKAGE, "text/css; charset=utf-8"),
}

# Byte replacements made once, when a vendor file is first read (see the module docstring).
EMPTY_IMAGE = b"data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg'/%3E"
PATCHES: dict[str, tuple[tuple[bytes, bytes], ...]] = {
    "redoc.standalone.js": ((b'src:"https://cdn.redoc.ly/redoc/logo-mini.svg"',
                             b'src:"' + EMPTY_IMAGE + b'"'),),
}

_COMMON_CSP = ("default-src 'none'; script-src 'self'; img-src 'self' data: blob:; "
               "font-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; "
               "frame-ancestors 'none'")
SWAGGER_CSP = f"{_COMMON_CSP}; style-src 'self'"
PAGE_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
}
# The files are public and change only with an upgrade: a browser may keep them an hour
# (the api's default ``no-store`` is for private bodies).
STATIC_HEADERS = {"X-Content-Type-Options": "nosniff", "Cache-Control": "public, max-age=3600",
                  "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'"}


# The <style> sheets ReDoc 2.5.3's style-loader injects as its script loads, before
# Redoc.init passes it the nonce: the empty element it inserts first, then perfect-scrollbar's
# sheet (6,493 characters). A new ReDoc with other sheets shows in the browser's console (and
# fails tests/e2e/test_docs_offline.py) with the hashes to put here.
REDOC_STYLE_HASHES = ("'sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU='",
                      "'sha256-QMIg+bpjm3JdElJ388KYke01izlUW0UoNOeKjpMxdgc='")


def redoc_csp(nonce: str) -> str:
    """The /redoc policy: :data:`SWAGGER_CSP`'s, plus ReDoc's nonced ``<style>`` elements,
    its sheets known by hash and its search worker."""
    styles = " ".join(("'self'", f"'nonce-{nonce}'", *REDOC_STYLE_HASHES))
    return f"{_COMMON_CSP}; style-src {styles}; worker-src blob:"


@cache
def _read(name: str) -> bytes:
    """A served file's bytes (read once per process)."""
    package, _ = STATIC_FILES[name]
    data = files(package).joinpath("static", name).read_bytes()
    for old, new in PATCHES.get(name, ()):
        data = data.replace(old, new)
    return data


def _head(title: str, root: str, stylesheet: str | None) -> str:
    sheet = f'<link rel="stylesheet" href="{root}{STATIC_PATH}/{stylesheet}">\n' \
        if stylesheet else ""
    return ('<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            '<meta name="referrer" content="no-referrer">\n'
            f"<title>{html.escape(title)}</title>\n"
            f'<link rel="icon" type="image/png" href="{root}{STATIC_PATH}/favicon.png">\n'
            f'{sheet}<link rel="stylesheet" href="{root}{STATIC_PATH}/docs.css">\n</head>\n')


def _note(root: str, other: str) -> str:
    label = "ReDoc" if other == REDOC_PATH else "Swagger UI"
    return ('<p class="dpsynth-offline-note">Served by this api, with no internet needed. '
            'Authenticated calls need an API key (<code>dps_...</code>) as '
            '<code>Authorization: Bearer</code>; errors are RFC 9457 '
            '<code>application/problem+json</code> with a stable <code>code</code>. '
            f'Also: <a href="{root}{other}">{label}</a> · '
            f'<a href="{root}/openapi.json">openapi.json</a></p>\n')


def _root(request: Request) -> str:
    # Behind a proxy that mounts the api under a prefix (uvicorn --root-path).
    return html.escape(str(request.scope.get("root_path", "")).rstrip("/"))


def swagger_page(title: str, root: str) -> str:
    """The /docs page: Swagger UI's style sheet and script, then :file:`swagger-init.js`."""
    return (_head(f"{title} · Swagger UI", root, "swagger-ui.css") + "<body>\n"
            + _note(root, REDOC_PATH)
            + f'<div id="swagger-ui" data-openapi-url="{root}/openapi.json"></div>\n'
            f'<script src="{root}{STATIC_PATH}/swagger-ui-bundle.js"></script>\n'
            f'<script src="{root}{STATIC_PATH}/swagger-init.js"></script>\n'
            "</body>\n</html>\n")


def redoc_page(title: str, root: str, nonce: str) -> str:
    """The /redoc page: ReDoc's script, then :file:`redoc-init.js` (which passes ``nonce``
    to ReDoc for its ``<style>`` elements)."""
    return (_head(f"{title} · ReDoc", root, None) + "<body>\n" + _note(root, DOCS_PATH)
            + f'<div id="redoc" data-openapi-url="{root}/openapi.json" '
            f'data-style-nonce="{nonce}"></div>\n'
            f'<script src="{root}{STATIC_PATH}/redoc.standalone.js"></script>\n'
            f'<script src="{root}{STATIC_PATH}/redoc-init.js"></script>\n'
            "</body>\n</html>\n")


@router.get(DOCS_PATH)
def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI over ``/openapi.json``: "Authorize" with a key, then "Try it out"."""
    page = swagger_page(request.app.title, _root(request))
    return HTMLResponse(page, headers={**PAGE_HEADERS, "Content-Security-Policy": SWAGGER_CSP})


@router.get(REDOC_PATH)
def redoc(request: Request) -> HTMLResponse:
    """ReDoc over ``/openapi.json`` (reading only)."""
    nonce = secrets.token_urlsafe(18)
    page = redoc_page(request.app.title, _root(request), nonce)
    return HTMLResponse(page, headers={**PAGE_HEADERS,
                                       "Content-Security-Policy": redoc_csp(nonce)})


@router.get(STATIC_PATH + "/{name}")
def docs_static(name: str) -> Response:
    """A file of the docs pages (404 ``not_found`` for any name not in the allow-list)."""
    entry = STATIC_FILES.get(name)
    if entry is None:
        raise DpsynthError(ErrorCode.NOT_FOUND, "no such docs file")
    return Response(_read(name), media_type=entry[1], headers=STATIC_HEADERS)
