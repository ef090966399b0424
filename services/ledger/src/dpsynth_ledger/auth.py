"""Bearer authentication with the configured service tokens (constant-time comparison)."""

from __future__ import annotations

import hmac

from dpsynth_shared.errors import DpsynthError, ErrorCode
from fastapi import Request


class ServiceTokens:
    """The accepted bearer tokens (the api's and the workers')."""

    def __init__(self, tokens: list[str]) -> None:
        self._tokens = [t.encode() for t in tokens]

    def __call__(self, request: Request) -> None:
        """FastAPI dependency: refuse a request without an accepted bearer token."""
        header = request.headers.get("authorization", "")
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer" or not presented:
            raise DpsynthError(ErrorCode.UNAUTHENTICATED, "a bearer service token is required")
        given = presented.strip().encode()
        ok = False
        for token in self._tokens:  # compare with every token: no early exit
            ok |= hmac.compare_digest(given, token)
        if not ok:
            raise DpsynthError(ErrorCode.UNAUTHENTICATED, "unknown service token")
