"""FastAPI dependencies as ``Annotated`` aliases (full-stack-fastapi-template's habit)."""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterator
from typing import Annotated

from dpsynth_shared.errors import DpsynthError, ErrorCode
from fastapi import Depends, Request
from sqlalchemy.orm import Session

from dpsynth_api.context import AppContext
from dpsynth_api.ports import LedgerPort, ObjectStore, TaskSender
from dpsynth_api.settings import ApiSettings
from dpsynth_api.tenants import service as tenants
from dpsynth_api.tenants.security import Principal, Scope


def get_context(request: Request) -> AppContext:
    """The app's :class:`AppContext`."""
    ctx: AppContext = request.app.state.ctx
    return ctx


ContextDep = Annotated[AppContext, Depends(get_context)]


def get_session(ctx: ContextDep) -> Iterator[Session]:
    """One session per request, closed (rolled back if uncommitted) at the end."""
    with ctx.sessions() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


def get_settings(ctx: ContextDep) -> ApiSettings:
    return ctx.settings


def get_store(ctx: ContextDep) -> ObjectStore:
    return ctx.store


def get_ledger(ctx: ContextDep) -> LedgerPort:
    return ctx.ledger


def get_sender(ctx: ContextDep) -> TaskSender:
    return ctx.sender


SettingsDep = Annotated[ApiSettings, Depends(get_settings)]
StoreDep = Annotated[ObjectStore, Depends(get_store)]
LedgerDep = Annotated[LedgerPort, Depends(get_ledger)]
SenderDep = Annotated[TaskSender, Depends(get_sender)]


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def get_principal(request: Request, session: SessionDep) -> Principal:
    """Authenticate the ``Authorization: Bearer dps_...`` header (401 otherwise)."""
    token = _bearer(request)
    if token is None:
        raise DpsynthError(ErrorCode.UNAUTHENTICATED,
                           "a valid API key is required (Authorization: Bearer dps_...)")
    principal = tenants.authenticate(session, token=token)
    request.state.principal = principal
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def require(scope: Scope, *alternatives: Scope) -> Callable[[Principal], Principal]:
    """A dependency that lets only keys granting ``scope`` (or one of ``alternatives``)
    through (403 otherwise, naming ``scope``)."""

    def _check(principal: PrincipalDep) -> Principal:
        if not any(principal.has(s) for s in (scope, *alternatives)):
            raise DpsynthError(ErrorCode.FORBIDDEN, f"this API key lacks the '{scope}' scope",
                               required_scope=str(scope))
        return principal

    return _check


ReaderDep = Annotated[Principal, Depends(require(Scope.READ))]
SubmitterDep = Annotated[Principal, Depends(require(Scope.SUBMIT))]
OwnerDep = Annotated[Principal, Depends(require(Scope.OWNER))]
# The admin scope is a platform scope: authentication grants it to keys of the platform's
# admin tenant only, so this lets the platform admin alone through (issue 14, item 6).
AdminDep = Annotated[Principal, Depends(require(Scope.ADMIN))]
# A tenant's keys: its owner keys, or the platform admin (the use case confines an owner to
# its own tenant).
KeyAdminDep = Annotated[Principal, Depends(require(Scope.OWNER, Scope.ADMIN))]


def require_worker(request: Request, settings: SettingsDep) -> None:
    """Workers present ``WORKER_TOKEN`` (or, during a rotation, one of
    ``WORKER_RETIRED_TOKENS``) on ``/internal/v1``, compared in constant time."""
    token = (_bearer(request) or "").encode()
    # every candidate is compared, so the time taken does not tell which one matched
    matches = [hmac.compare_digest(token, t.encode()) for t in settings.worker_tokens]
    if not any(matches):
        raise DpsynthError(ErrorCode.UNAUTHENTICATED, "the worker token is required")


WorkerDep = Depends(require_worker)
