"""The api's documentation works offline and documents what a new user needs (issue 15,
item 7), without a browser (tests/e2e/test_docs_offline.py renders the pages in one).

One api, served by uvicorn on a real, migrated PostgreSQL (fake ledger and sender): its
``/openapi.json`` names the bearer scheme on every operation that takes a key, declares each
operation's problem+json errors with their known codes, tags every operation, and leaves the
workers' ``/internal/v1`` routes out, which still answer; ``/docs`` and ``/redoc`` load every
file from this api, under a Content-Security-Policy with no inline script.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
import pytest
from dpsynth_api.app import create_app
from dpsynth_api.db import make_session_factory
from dpsynth_api.fakes import FakeLedger, RecordingSender
from dpsynth_api.migrate import upgrade_head
from dpsynth_api.openapi import build_worker_document
from dpsynth_api.openapi_codes import DOMAIN_CODES
from dpsynth_api.tenants.security import ALL_SCOPES
from dpsynth_api.tenants.service import create_tenant
from dpsynth_shared.security_headers import STRICT_CSP
from dpsynth_shared.stores.local import LocalDirStore
from sqlalchemy import create_engine

from tests.integration.api.conftest import WORKER_TOKEN, auth, make_settings

PROBLEM = "application/problem+json"
# The only operations that take no key (tests/unit/api/test_openapi_document.py's list).
PUBLIC = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/v1/presigned/{token}"),
          ("GET", "/dashboard"), ("GET", "/dashboard/static/{name}")}
CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}


@dataclass
class Served:
    url: str
    key: str


@pytest.fixture(scope="module")
def served(pg: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from tests.support.servers import serve_asgi

    tmp = tmp_path_factory.mktemp("openapi-docs")
    settings = make_settings(pg.url(pg.create_database()), tmp)
    upgrade_head(settings)
    engine = create_engine(settings.database.url)
    try:
        with make_session_factory(engine)() as session:
            key = create_tenant(session, name="root", scopes=sorted(ALL_SCOPES)).key.api_key
    finally:
        engine.dispose()
    app = create_app(settings, store=LocalDirStore(tmp / "objects"), ledger=FakeLedger(),
                     task_sender=RecordingSender())
    with serve_asgi(app) as url:
        yield Served(url, key)


@pytest.fixture(scope="module")
def document(served: Served) -> dict[str, Any]:
    response = httpx.get(f"{served.url}/openapi.json", timeout=30)
    assert response.status_code == 200
    return dict(response.json())


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method.upper(), path, op) for path, ops in document["paths"].items()
            for method, op in ops.items()]


class _Links(HTMLParser):
    """Every URL a page loads or links to (src, href, data-*-url)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is not None and (name in ("src", "href") or name.endswith("-url")):
                self.urls.append((f"{tag}.{name}", value))


def _links(page: str) -> list[tuple[str, str]]:
    parser = _Links()
    parser.feed(page)
    return parser.urls


# ---- the document ------------------------------------------------------------------------

def test_bearer_scheme_on_every_operation_that_takes_a_key(document: dict[str, Any]) -> None:
    assert document["components"]["securitySchemes"] == {"apiKey": {
        "type": "http", "scheme": "bearer", "bearerFormat": "dps_...",
        "description": "a tenant's API key (scopes: read, submit, owner, admin)"}}
    operations = _operations(document)
    assert len(operations) >= 30
    for method, path, op in operations:
        expected = None if (method, path) in PUBLIC else [{"apiKey": []}]
        assert op.get("security") == expected, (method, path)


def test_workers_routes_are_not_public_but_still_answer(document: dict[str, Any],
                                                        served: Served) -> None:
    assert [p for p in document["paths"] if p.startswith("/internal")] == []
    assert "workerToken" not in document["components"]["securitySchemes"]
    assert "internal" not in {tag["name"] for tag in document["tags"]}
    claim = f"{served.url}/internal/v1/jobs/job_nope/claim"
    body = {"attempt": 1, "worker_id": "w"}
    refused = httpx.post(claim, json=body, timeout=30)
    assert (refused.status_code, refused.json()["code"]) == (401, "unauthenticated")
    unknown = httpx.post(claim, json=body, headers=auth(WORKER_TOKEN), timeout=30)
    assert unknown.status_code == 404, unknown.text
    assert unknown.json()["code"] == "not_found"
    assert "no route" not in unknown.json()["detail"]  # the route ran: the job is unknown
    worker = build_worker_document()
    assert sorted(worker["paths"]) == [f"/internal/v1/jobs/{{job_id}}/{name}" for name in
                                       ("artifacts", "claim", "heartbeat", "transition")]
    assert list(worker["components"]["securitySchemes"]) == ["workerToken"]
    for _, _, op in _operations(worker):
        assert op["security"] == [{"workerToken": []}]


def test_every_operation_is_tagged_and_every_tag_described(document: dict[str, Any]) -> None:
    tags = [tag["name"] for tag in document["tags"]]
    assert tags[:6] == ["datasets", "budgets", "ledger", "models", "jobs", "artifacts"]
    assert {"tenants", "admin", "health"} <= set(tags)
    assert all(len(tag["description"]) > 20 for tag in document["tags"])
    used = set()
    for method, path, op in _operations(document):
        assert len(op.get("tags", [])) == 1 and op["tags"][0] in tags, (method, path)
        used.add(op["tags"][0])
    assert used == set(tags)


def test_every_operation_documents_its_problems(document: dict[str, Any]) -> None:
    problem_ref = {"$ref": "#/components/schemas/Problem"}
    assert "code" in document["components"]["schemas"]["Problem"]["properties"]
    for method, path, op in _operations(document):
        errors = {status: r for status, r in op["responses"].items() if int(status) >= 400}
        assert {"400", "422"} <= set(errors), (method, path)
        if (method, path) not in PUBLIC:
            assert {"401", "403", "429"} <= set(errors), (method, path)
        for status, response in errors.items():
            assert response["content"] == {PROBLEM: {"schema": problem_ref}}, (path, status)
            codes = response.get("x-problem-codes", [])
            assert all(f"`{code}`" in response["description"] for code in codes)
        assert errors["400"]["x-problem-codes"] == ["invalid_request",
                                                    "api_key_in_query_string"]
    jobs = document["paths"]["/v1/jobs"]["post"]["responses"]
    assert "privacy_budget_exhausted" in jobs["409"]["x-problem-codes"]
    assert "idempotency_in_progress" in jobs["409"]["x-problem-codes"]
    assert jobs["422"]["x-problem-codes"][0] == "invalid_spec"
    assert jobs["410"]["x-problem-codes"] == ["dataset_deleted"]
    budget = document["paths"]["/v1/datasets/{dataset_id}/budget"]["get"]["responses"]
    assert budget["401"]["x-problem-codes"] == ["unauthenticated"]
    assert budget["404"]["x-problem-codes"] == ["not_found"]
    # every operation DOMAIN_CODES names exists, and each of its codes is listed there
    operations = {(method, path): op for method, path, op in _operations(document)}
    for (method, path), codes in DOMAIN_CODES.items():
        listed = {code for response in operations[(method, path)]["responses"].values()
                  for code in response.get("x-problem-codes", [])}
        assert {str(code) for code in codes} <= listed, (method, path)


def test_the_documented_key_works(served: Served) -> None:
    listed = httpx.get(f"{served.url}/v1/datasets", headers=auth(served.key), timeout=30)
    assert listed.status_code == 200, listed.text
    assert listed.json()["items"] == []
    anonymous = httpx.get(f"{served.url}/v1/datasets", timeout=30)
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"] == "Bearer"


# ---- the pages ---------------------------------------------------------------------------

@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_pages_load_everything_from_this_api(served: Served, page: str) -> None:
    response = httpx.get(served.url + page, timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert re.findall(r"https?://", response.text) == []  # no absolute URL at all
    origin = urlsplit(served.url).netloc
    links = _links(response.text)
    scripts = [url for where, url in links if where == "script.src"]
    assert len(scripts) == 2 and scripts[-1].endswith("-init.js"), links
    assets = 0
    for where, url in links:
        absolute = urljoin(served.url + page, url)
        assert urlsplit(absolute).netloc == origin, (where, url)
        suffix = Path(urlsplit(absolute).path).suffix
        if suffix in CONTENT_TYPES:
            asset = httpx.get(absolute, timeout=30)
            assert asset.status_code == 200, url
            assert asset.headers["content-type"].startswith(CONTENT_TYPES[suffix]), url
            assert asset.headers["x-content-type-options"] == "nosniff"
            assert len(asset.content) > 100, url
            assets += 1
    assert assets >= 4  # icon, style sheet(s), the viewer, its start-up script


def test_pages_have_a_strict_content_security_policy(served: Served) -> None:
    swagger = httpx.get(f"{served.url}/docs", timeout=30)
    csp = swagger.headers["content-security-policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'none'"
    assert directives["script-src"] == "'self'"  # no inline script, no eval, no CDN
    assert directives["connect-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'"
    assert "<script>" not in swagger.text and "unsafe-inline" not in csp
    assert swagger.headers["cache-control"] == "no-store"

    nonces = []
    for _ in range(2):
        redoc = httpx.get(f"{served.url}/redoc", timeout=30)
        directives = dict(d.strip().split(" ", 1) for d in
                          redoc.headers["content-security-policy"].split(";"))
        assert directives["script-src"] == "'self'"
        nonce = re.search(r'data-style-nonce="([^"]+)"', redoc.text)
        assert nonce is not None
        sources = directives["style-src"].split()
        assert sources[:2] == ["'self'", f"'nonce-{nonce.group(1)}'"]
        assert all(source.startswith("'sha256-") for source in sources[2:])  # no inline
        nonces.append(nonce.group(1))
    assert nonces[0] != nonces[1] and len(nonces[0]) >= 22  # fresh per response


def test_only_the_listed_files_are_served(served: Served) -> None:
    bundle = httpx.get(f"{served.url}/docs/static/swagger-ui-bundle.js", timeout=30)
    assert bundle.status_code == 200 and b"SwaggerUIBundle" in bundle.content
    assert bundle.headers["cache-control"] == "public, max-age=3600"
    redoc = httpx.get(f"{served.url}/docs/static/redoc.standalone.js", timeout=30)
    assert redoc.status_code == 200 and b"Redoc" in redoc.content
    for name in ("router.py", "..%2Frouter.py", "swagger-ui-bundle.js.map", "index.html"):
        missing = httpx.get(f"{served.url}/docs/static/{name}", timeout=30)
        assert missing.status_code == 404, name
        assert missing.headers["content-type"] == PROBLEM
        assert missing.headers["content-security-policy"] == STRICT_CSP
    # FastAPI's CDN pages are gone: nothing else answers under these names
    assert httpx.get(f"{served.url}/docs/oauth2-redirect", timeout=30).status_code == 404
