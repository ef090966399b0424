"""Bearer authentication with the configured service tokens (constant-time comparison).

Calls under ``/v1/admin/`` act on every tenant's budgets at once (reconciliation after a
restore), so each one, accepted or refused, leaves an audit line in the ledger's log through
the ``dpsynth_ledger.audit`` logger: the action (method and path), which configured token
was presented (its position in ``DPSYNTH_LEDGER_SERVICE_TOKENS``, never the token) and the
outcome (issue 14, item 6). The platform admin who asked is in the api's audit line of the
same request.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterator

from dpsynth_shared.errors import DpsynthError, ErrorCode
from fastapi import Request

ADMIN_PREFIX = "/v1/admin/"

audit_log = logging.getLogger("dpsynth_ledger.audit")


class ServiceTokens:
    """The accepted bearer tokens (the api's and the workers').

    ``admin``: the tokens that may call ``/v1/admin/*`` (the api's); a worker's token there
    is refused with 403 ``forbidden``, so a stolen worker token cannot reconcile every
    tenant's budgets. Empty: every accepted token may (a deployment from before the
    setting; the app warns at start).
    """

    def __init__(self, tokens: list[str], admin: list[str] | None = None) -> None:
        self._tokens = [t.encode() for t in tokens]
        admin_set = {a.encode() for a in admin or []}
        self._admin = [any(hmac.compare_digest(t, a) for a in admin_set) for t in self._tokens]
        self._restricted = bool(admin_set)

    def _token_index(self, request: Request) -> int:
        """The position of the presented token among the accepted ones (401 otherwise)."""
        header = request.headers.get("authorization", "")
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer" or not presented:
            raise DpsynthError(ErrorCode.UNAUTHENTICATED, "a bearer service token is required")
        given = presented.strip().encode()
        found = -1
        for index, token in enumerate(self._tokens):  # compare with every token: no early exit
            if hmac.compare_digest(given, token):
                found = index
        if found < 0:
            raise DpsynthError(ErrorCode.UNAUTHENTICATED, "unknown service token")
        return found

    def __call__(self, request: Request) -> Iterator[None]:
        """FastAPI dependency: refuse a request without an accepted bearer token; audit the
        admin calls (see the module's docstring)."""
        if not request.url.path.startswith(ADMIN_PREFIX):
            self._token_index(request)
            yield
            return
        index: int | None = None
        outcome = "error"
        try:
            index = self._token_index(request)
            if self._restricted and not self._admin[index]:
                raise DpsynthError(ErrorCode.FORBIDDEN, "this service token may not call the "
                                   "ledger's admin operations (DPSYNTH_LEDGER_ADMIN_TOKENS)")
            yield
            outcome = "ok"
        except DpsynthError as exc:
            outcome = str(exc.code)
            raise
        finally:
            audit_log.log(logging.INFO if outcome == "ok" else logging.WARNING,
                          "audit %s %s: %s", request.method, request.url.path, outcome,
                          extra={"audit": True, "action": f"{request.method} "
                                 f"{request.url.path}", "service_token_index": index,
                                 "outcome": outcome})
