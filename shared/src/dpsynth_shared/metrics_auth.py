"""The bearer token that guards a service's ``/metrics`` (issue 14, item 11).

A scrape presents ``Authorization: Bearer <metrics token>``; the token is a setting of each
service (``DPSYNTH_API_METRICS_TOKEN``, ``DPSYNTH_LEDGER_METRICS_TOKEN``), separate from
every API key and service token, so what Prometheus holds cannot call any API.
"""

from __future__ import annotations

import hmac

from dpsynth_shared.errors import DpsynthError, ErrorCode


def check_metrics_token(authorization: str, token: str | None) -> None:
    """Refuse a scrape whose ``Authorization`` header lacks the metrics token (401).

    ``token`` None: no metrics token is configured and the scrape is let through.
    """
    if token is None:
        return
    scheme, _, presented = authorization.partition(" ")
    if scheme.lower() != "bearer" or not presented:
        raise DpsynthError(ErrorCode.UNAUTHENTICATED, "a bearer metrics token is required")
    if not hmac.compare_digest(presented.strip().encode(), token.encode()):
        raise DpsynthError(ErrorCode.UNAUTHENTICATED, "unknown metrics token")
