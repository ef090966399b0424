"""Audit lines of tenant, key and platform administration (issue 14, item 6).

Each call of the tenant and key endpoints and each platform action (a tenant created, a key
minted or revoked, a tenant's policy set, the ledger reconciled) writes one JSON line to the
api's log through the ``dpsynth_api.audit`` logger: who acted (tenant and key id), the action,
the tenant acted on, whether that crossed tenants, and the outcome (``ok`` or the problem's
stable code). An operator can then answer "who touched tenant T's keys" from the log alone.

Only ids, scope names and codes enter a line: never a key's secret or token, never a value
computed from private data.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from dpsynth_shared.errors import DpsynthError

from dpsynth_api.tenants.security import Principal

AUDIT_LOGGER = "dpsynth_api.audit"
ALL_TENANTS = "*"  # the target of an action on every tenant at once (ledger reconciliation)

log = logging.getLogger(AUDIT_LOGGER)


@dataclass
class AuditEntry:
    """What the use case learns while it runs: the target tenant of a key is known only once
    the key is loaded, the id of a new tenant only once it is created."""

    target_tenant_id: str | None
    details: dict[str, str] = field(default_factory=dict)


@contextmanager
def audited(actor: Principal, action: str, *, target_tenant_id: str | None = None,
            **details: str) -> Iterator[AuditEntry]:
    """Write one audit line when the block ends: outcome ``ok``, the code of the
    :class:`DpsynthError` it raised (a refusal, logged as a warning), or ``error``."""
    entry = AuditEntry(target_tenant_id, dict(details))
    outcome = "error"
    try:
        yield entry
        outcome = "ok"
    except DpsynthError as exc:
        outcome = str(exc.code)
        raise
    finally:
        target = entry.target_tenant_id
        log.log(logging.INFO if outcome == "ok" else logging.WARNING,
                "audit %s by %s: %s", action, actor.tenant_id, outcome, extra={
                    "audit": True, "action": action, "actor_tenant_id": actor.tenant_id,
                    "actor_key_id": actor.key_id, "target_tenant_id": target,
                    "cross_tenant": target != actor.tenant_id, "outcome": outcome,
                    **entry.details})
