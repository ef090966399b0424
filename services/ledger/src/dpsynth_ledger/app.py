"""The ledger's FastAPI application factory (settings are passed in, never read here)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio.to_thread
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.instance_proof import proof_headers
from dpsynth_shared.metrics_auth import check_metrics_token
from dpsynth_shared.security_headers import SecurityHeadersMiddleware
from dpsynth_shared.text import refuse_bad_request_strings
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session, sessionmaker

from dpsynth_ledger import problems
from dpsynth_ledger.anchor import RECONCILE_HINT, ChainKeeper, build_anchor
from dpsynth_ledger.auth import ServiceTokens
from dpsynth_ledger.chain import adopt_existing_chain, anchor_status, install_anchor_hooks
from dpsynth_ledger.context import LedgerContext
from dpsynth_ledger.heavy import HeavyWork
from dpsynth_ledger.metrics import LedgerMetrics
from dpsynth_ledger.openapi import install_openapi
from dpsynth_ledger.router import router
from dpsynth_ledger.settings import LedgerSettings
from dpsynth_ledger.tight import TightWorker

log = logging.getLogger(__name__)


def check_anchor_at_startup(sessions: sessionmaker[Session], keeper: ChainKeeper) -> None:
    """At start-up: anchor an existing, never-anchored chain once, then log where the
    database stands against the anchor (behind: every write is refused until
    reconciliation; ``/readyz`` says so). A database without the ledger's tables is skipped.
    """
    try:
        with sessions() as session:
            if adopt_existing_chain(session, keeper):
                log.warning("anchored an existing, unanchored chain at its current head",
                            extra={"anchor": keeper.anchor.location})
            status = anchor_status(session, keeper)
    except Exception as exc:  # noqa: BLE001 - readiness reports it; start anyway
        log.warning("could not compare the chain with its anchor at start-up: %s",
                    type(exc).__name__)
        return
    if status.behind or status.diverged:
        log.error(RECONCILE_HINT, extra={"local_seq": status.local_seq,
                                         "anchored_seq": status.anchored_seq})


def _refuse_bad_strings(request: Request) -> None:
    # A NUL byte in a path id or query value would reach PostgreSQL (a 500): refuse it first.
    refuse_bad_request_strings(request.path_params, request.query_params.multi_items())


def create_app(settings: LedgerSettings) -> FastAPI:
    """Build the ledger app: engine, session factory, context, routes, problem handlers."""
    # hide_parameters: a failed statement's error (and its log record) never carries the
    # values it was writing (issue 14, item 10).
    engine = create_engine(settings.database.url, pool_size=settings.database.pool_size,
                           max_overflow=20, echo=settings.database.echo, pool_pre_ping=True,
                           hide_parameters=True)
    keeper = ChainKeeper(settings.chain_signing_key.get_secret_value(), build_anchor(settings),
                         settings.chain_retired_public_keys)
    sessions = sessionmaker(engine, expire_on_commit=False)
    install_anchor_hooks(sessions, keeper)

    tight = TightWorker(sessions, settings.pld_discretization, settings.tight_poll_s)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        check_anchor_at_startup(sessions, keeper)
        # synchronous routes run in this pool; heavy work may hold only part of it (heavy.py)
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.threads
        tight.start()  # the tight figures, off the request path (tight.py)
        yield
        tight.stop()
        engine.dispose()

    app = FastAPI(title="dpsynth ledger", version="0.1.0", lifespan=lifespan,
                  description="Privacy budgets, RDP-filter admission, step leases, audit chain.")
    app.state.engine = engine
    app.state.sessions = sessions
    metrics = LedgerMetrics()
    app.state.ctx = LedgerContext(
        lease_ttl_s=settings.lease_ttl_s,
        signing_key=settings.grant_signing_key.get_secret_value(),
        discretization=settings.pld_discretization, metrics=metrics, chain=keeper,
        heavy=HeavyWork(sessions, limits=settings.plan_limits,
                        concurrency=settings.heavy_concurrency, wait_s=settings.heavy_wait_s,
                        discretization=settings.pld_discretization,
                        max_composition=settings.max_tight_composition,
                        max_waiting=settings.heavy_queue),
        tight_inline=settings.tight_inline)
    auth = ServiceTokens([t.get_secret_value() for t in settings.service_tokens],
                         admin=[t.get_secret_value() for t in settings.admin_tokens])
    if not settings.admin_tokens:
        log.warning("DPSYNTH_LEDGER_ADMIN_TOKENS is unset: every service token (a worker's "
                    "too) may call /v1/admin/*; set it to the api's ledger token")
    app.include_router(router, dependencies=[Depends(auth), Depends(_refuse_bad_strings)])
    install_openapi(app)  # every operation's real problem+json errors (openapi.py)
    problems.install(app)
    app.add_middleware(SecurityHeadersMiddleware)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    instance_secret = (settings.instance_secret.get_secret_value()
                       if settings.instance_secret is not None else None)

    @app.get("/readyz", include_in_schema=False)
    def readyz(request: Request, challenge: str | None = None) -> JSONResponse:
        """Readiness; with ``?challenge=HEX`` every answer also carries the instance proof
        (dpsynth_shared.instance_proof: how ``dpsynth up`` tells its own ledger from a
        foreign server on the port)."""
        proof = proof_headers(instance_secret, challenge)  # malformed: 400 before any work
        answer = _readiness(request)
        answer.headers.update(proof)
        return answer

    def _readiness(request: Request) -> JSONResponse:
        try:
            with request.app.state.engine.connect() as conn:
                conn.execute(text("SELECT 1 FROM ledger.chain_head"))
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready"
            return problems.problem_response(
                DpsynthError(ErrorCode.SERVICE_UNAVAILABLE,
                             f"database not ready: {type(exc).__name__}"))
        try:
            with request.app.state.sessions() as session:
                status = anchor_status(session, keeper)
        except Exception as exc:  # noqa: BLE001 - an unreadable anchor means "not ready"
            return problems.problem_response(
                DpsynthError(ErrorCode.SERVICE_UNAVAILABLE,
                             f"anchor not readable: {type(exc).__name__}"))
        if status.behind or status.diverged:
            return problems.problem_response(DpsynthError(
                ErrorCode.LEDGER_BEHIND_ANCHOR, RECONCILE_HINT,
                **status.model_dump(mode="json")), "/readyz")
        return JSONResponse({"status": "ready"})

    per_dataset = settings.metrics_max_datasets if settings.metrics_per_dataset else 0
    metrics.track_budgets(app.state.sessions, per_dataset,
                          anchor=lambda session: anchor_status(session, keeper))

    scrape_token = (settings.metrics_token.get_secret_value()
                    if settings.metrics_token is not None else None)

    @app.get("/metrics", include_in_schema=False)
    def prometheus(request: Request) -> Response:
        """Counters of this process and budget figures read from the database now (with the
        metrics token when one is set; per-dataset gauges only when an operator enables
        them)."""
        check_metrics_token(request.headers.get("authorization", ""), scrape_token)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
