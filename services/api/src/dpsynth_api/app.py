"""The api's application factory: settings and ports in, a FastAPI app out."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from dpsynth_shared.text import refuse_bad_request_strings
from fastapi import Depends, FastAPI, Request
from PIL import Image

from dpsynth_api import health
from dpsynth_api.adapters.celery_sender import CelerySender
from dpsynth_api.adapters.ledger_http import HttpLedger
from dpsynth_api.artifacts.router import router as artifacts_router
from dpsynth_api.budgets.router import router as budgets_router
from dpsynth_api.context import AppContext
from dpsynth_api.dashboard.router import router as dashboard_router
from dpsynth_api.datasets.router import router as datasets_router
from dpsynth_api.db import make_engine, make_session_factory
from dpsynth_api.docs_ui.router import router as docs_ui_router
from dpsynth_api.errors import install_error_handlers
from dpsynth_api.idempotency import IdempotencyMiddleware, IdempotencyStore
from dpsynth_api.internal.router import router as internal_router
from dpsynth_api.jobs.reaper import Reaper
from dpsynth_api.jobs.router import router as jobs_router
from dpsynth_api.ledger_views.router import router as ledger_views_router
from dpsynth_api.metrics import ApiMetrics
from dpsynth_api.middleware import (
    GuardMiddleware,
    ObservabilityMiddleware,
    SecurityHeadersMiddleware,
)
from dpsynth_api.models.router import router as models_router
from dpsynth_api.openapi import install_openapi
from dpsynth_api.ports import LedgerPort, ObjectStore, TaskSender
from dpsynth_api.ratelimit import RateLimiter, RateLimitMiddleware
from dpsynth_api.settings import ApiSettings
from dpsynth_api.sweeper import Sweeper
from dpsynth_api.tenants.ledger_admin import router as ledger_admin_router
from dpsynth_api.tenants.router import router as tenants_router

MULTIPART_OVERHEAD_BYTES = 1 << 20
DESCRIPTION = """\
DP fine-tuning of latent diffusion models on private images, synthetic corpora, and an exact
account of each dataset's privacy budget.

**Authentication.** Every `/v1/...` operation except `/v1/presigned/{token}` takes a tenant's
API key as `Authorization: Bearer dps_...` ("Authorize" above). A key in a query string is
refused (400 `api_key_in_query_string`): keys leak from URLs.

**Errors** are RFC 9457 `application/problem+json` bodies with a stable, machine-readable
`code` (e.g. `privacy_budget_exhausted`, `not_found`, `invalid_spec`); each operation lists
the statuses it can answer and, per status, the codes (docs/api-contract.md).

**Retries.** A `POST /v1/...` takes an optional `Idempotency-Key` header; a 429 or 503 says
when to retry in `Retry-After`.
"""
log = logging.getLogger(__name__)


def _default_store(settings: ApiSettings) -> ObjectStore:
    from dpsynth_shared.stores import from_settings  # the adapters live in shared

    store: ObjectStore = from_settings(settings.object_store,
                                       grant_public_key=settings.grant_public_keys or None)
    return store


def _refuse_bad_strings(request: Request) -> None:
    # A NUL byte in a path id or query value would reach PostgreSQL (a 500): refuse it first.
    refuse_bad_request_strings(request.path_params, request.query_params.multi_items())


def _sweep_at_start(sweeper: Sweeper) -> None:
    # A store or database not reachable yet must not keep the api down: the periodic
    # sweep retries.
    try:
        sweeper.sweep()
    except Exception:
        log.exception("the upload sweep at start failed")


def create_app(settings: ApiSettings, *, store: ObjectStore | None = None,
               ledger: LedgerPort | None = None,
               task_sender: TaskSender | None = None) -> FastAPI:
    """Build the api. Ports default to the real adapters; tests inject fakes.

    Args:
        settings: read once at process start.
        store: the object store (default: from ``settings.object_store``).
        ledger: the ledger port (default: :class:`HttpLedger`).
        task_sender: the task sender (default: :class:`CelerySender`).
    """
    # PIL's own decompression-bomb guard, set to the api's cap (the api owns its process).
    Image.MAX_IMAGE_PIXELS = settings.max_image_pixels
    engine = make_engine(settings.database)
    ctx = AppContext(
        settings=settings, engine=engine, sessions=make_session_factory(engine),
        store=store if store is not None else _default_store(settings),
        ledger=ledger if ledger is not None else HttpLedger(
            settings.ledger.url, settings.ledger.token.get_secret_value(),
            timeout_s=settings.ledger_timeout_s),
        sender=task_sender if task_sender is not None else CelerySender(settings.broker_url),
        metrics=ApiMetrics())
    reaper = Reaper(ctx.sessions, ctx.ledger, ctx.sender, lease_ttl_s=settings.lease_ttl_s,
                    max_attempts=settings.max_attempts,
                    max_drained_attempts=settings.max_drained_attempts,
                    queued_resend_s=settings.queued_resend_s,
                    interval_s=settings.heartbeat_s,
                    on_pass=lambda report: ctx.metrics.count_reap(report.counts()))
    limiter = RateLimiter(settings) if settings.rate_limit_enabled else None
    sweeper = Sweeper(settings.spool_dir, ctx.sessions, ctx.store,
                      grace_s=settings.sweep_grace_s, interval_s=settings.sweep_interval_s,
                      metrics=ctx.metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.reaper_enabled:
            reaper.start()
        if settings.sweep_enabled:  # what a crash left behind (issue 14, item 9)
            _sweep_at_start(sweeper)
            sweeper.start()
        try:
            yield
        finally:
            sweeper.stop()
            reaper.stop()
            if limiter is not None:
                await limiter.close()
            engine.dispose()

    # FastAPI's own /docs and /redoc load their files from a CDN: dpsynth_api.docs_ui serves
    # the same viewers from the installed packages instead (issue 15, item 7).
    app = FastAPI(title="dpsynth api", version="0.1.0", lifespan=lifespan,
                  dependencies=[Depends(_refuse_bad_strings)], description=DESCRIPTION,
                  docs_url=None, redoc_url=None, swagger_ui_oauth2_redirect_url=None)
    app.state.ctx = ctx
    app.state.reaper = reaper
    app.state.sweeper = sweeper
    install_error_handlers(app)
    for router in (health.router, tenants_router, datasets_router, budgets_router,
                   models_router, jobs_router, artifacts_router):
        app.include_router(router)
    # The workers' endpoints work as before but are no part of the public document
    # (dpsynth_api.openapi.build_worker_document documents them for the worker contract).
    app.include_router(internal_router, include_in_schema=False)
    app.include_router(dashboard_router)
    app.include_router(docs_ui_router)
    app.include_router(ledger_views_router)
    app.include_router(ledger_admin_router)
    install_openapi(app)
    # Inside the guard: an oversized body is refused before a key is claimed for it.
    app.add_middleware(IdempotencyMiddleware, store=IdempotencyStore(
        ctx.sessions, ttl_s=settings.idempotency_ttl_s,
        lock_timeout_s=settings.idempotency_lock_timeout_s))
    app.add_middleware(GuardMiddleware,
                       max_body_bytes=settings.max_upload_bytes + MULTIPART_OVERHEAD_BYTES)
    if limiter is not None:  # before the guard and the key lookup: the cheapest refusal
        app.add_middleware(RateLimitMiddleware, limiter=limiter)
    app.add_middleware(ObservabilityMiddleware, metrics=ctx.metrics)
    # Outermost: every answer (problem+json from the guard included) gets the headers. No
    # path is exempt from the strict policy: /docs and /redoc set their own (docs_ui).
    app.add_middleware(SecurityHeadersMiddleware, csp_exempt=())
    return app
