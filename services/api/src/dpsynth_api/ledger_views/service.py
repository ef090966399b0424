"""Export, verify and recompute a private dataset's ledger history (read scope, tenant's own).

The chain is global across datasets (one hash chain over every entry of the ledger), so a
dataset's entries do not link to each other directly: each one is verifiable on its own, its
hash recomputed from its content and its ``prev_hash`` (:func:`dpsynth_shared.dp_events.
chain_hash` over ``{seq, dataset_id, kind, payload}``) and its Ed25519 signature checked over
``signed_message(seq, hash)`` with the chain key exported beside the entries.
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from typing import Any

from dpsynth_shared.dp_events import canonical_json
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.ledger_contract import LedgerEntry, RecomputeReport, VerifyReport
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from dpsynth_api.datasets.service import get_dataset
from dpsynth_api.policies import budget_id_of
from dpsynth_api.ports import LedgerPort
from dpsynth_api.tenants.security import Principal

HASH_RULE = ("hash = sha256(prev_hash || '\\n' || canonical_json({seq, dataset_id, kind, "
             "payload})); canonical JSON: sorted keys, separators (',', ':'), UTF-8; the "
             "signature is Ed25519 over 'dpsynth-ledger-head\\n{seq}\\n{hash}' (ASCII)")

CSV_COLUMNS = ["seq", "at", "dataset_id", "kind", "job_id", "reservation_id", "steps",
               "rdp_charges", "dataset_epsilon_spent_after", "hash", "prev_hash",
               "signature", "key_id", "payload"]


class LedgerExport(BaseModel):
    """A private dataset's (its budget's) hash-chained entries, with the chain key."""

    dataset_id: str
    budget_id: str = Field(description="the ledger budget the dataset charges (the entries' "
                           "dataset_id)")
    exported_at: datetime
    public_key: str | None = Field(description="the chain key's Ed25519 public half "
                                   "(urlsafe base64); compare its key_id with the one your "
                                   "operator publishes")
    key_id: str | None
    retired_public_keys: list[str] = Field(
        default_factory=list, description="earlier chain keys' public halves: entries signed "
        "before a chain-key rotation carry one of their key ids")
    hash_rule: str = HASH_RULE
    entries: list[LedgerEntry]


def _budget_of(session: Session, principal: Principal, dataset_id: str) -> tuple[str, str]:
    dataset = get_dataset(session, principal=principal, dataset_id=dataset_id)
    if dataset.visibility != "private":
        raise DpsynthError(ErrorCode.VISIBILITY_MISMATCH,
                           "a public dataset has no privacy budget and no ledger history")
    return dataset.id, budget_id_of(dataset)


def export(session: Session, *, principal: Principal, ledger: LedgerPort,
           dataset_id: str) -> LedgerExport:
    """The dataset's entries in seq order and the chain key (404 for others' datasets)."""
    dataset, budget = _budget_of(session, principal, dataset_id)
    entries = ledger.entries(budget)
    key = ledger.chain_key()
    return LedgerExport(dataset_id=dataset, budget_id=budget, exported_at=datetime.now(UTC),
                        public_key=key.public_key if key else None,
                        key_id=key.key_id if key else None,
                        retired_public_keys=key.retired_public_keys if key else [],
                        entries=entries)


def _steps(payload: dict[str, Any]) -> Any:
    if payload.get("steps") is not None:
        return payload["steps"]
    event = payload.get("event")
    return event.get("steps") if isinstance(event, dict) else None


def to_csv(body: LedgerExport) -> str:
    """One row per entry; ``payload`` and ``rdp_charges`` as canonical JSON (so the hash can
    be recomputed from the CSV alone)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for e in body.entries:
        p = e.payload
        charges = p.get("rdp_delta")
        raw = p.get("figures")
        figures: dict[str, Any] = raw if isinstance(raw, dict) else {}
        writer.writerow([
            e.seq, e.at.isoformat(), e.dataset_id, e.kind, p.get("job_id") or "",
            p.get("reservation_id") or "", _steps(p) if _steps(p) is not None else "",
            canonical_json(charges).decode() if isinstance(charges, dict) else "",
            "" if figures.get("dataset_epsilon_spent") is None
            else repr(float(figures["dataset_epsilon_spent"])),
            e.hash, e.prev_hash, e.signature or "", e.key_id or "",
            canonical_json(p).decode()])
    return out.getvalue()


def verify(session: Session, *, principal: Principal, ledger: LedgerPort,
           dataset_id: str) -> VerifyReport:
    """The ledger's verification of the chain, filtered to the dataset's budget, with every
    epsilon of it recomputed (filter figure, each recorded spent figure, limit changes)."""
    _, budget = _budget_of(session, principal, dataset_id)
    return ledger.verify_budget(budget)


def recompute(session: Session, *, principal: Principal, ledger: LedgerPort,
              dataset_id: str) -> RecomputeReport:
    """Every charge and figure recomputed with the ledger's current accountant code, next to
    the recorded ones. A report: nothing stored changes and nothing is re-admitted."""
    _, budget = _budget_of(session, principal, dataset_id)
    return ledger.recompute(budget)
