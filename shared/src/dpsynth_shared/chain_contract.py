"""The ledger's chain, anchor, reconciliation and audit views (``/v1`` of services/ledger):
the hash-chained entries and their signatures, the chain's verification and recomputation,
the reconciliation after a restore, a budget's limit update. Part of the ledger's contract
(:mod:`dpsynth_shared.ledger_contract` re-exports every name)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from dpsynth_shared.text import ContractBody


class _Body(ContractBody):
    """A body of this contract (dpsynth_shared.text.ContractBody)."""


class LedgerEntry(BaseModel):
    """One raw hash-chained entry (for export and independent replay)."""

    seq: int
    at: datetime
    dataset_id: str
    kind: str
    payload: dict[str, Any]
    prev_hash: str
    hash: str
    signature: str | None = Field(None, description="Ed25519 signature (urlsafe base64) of "
                                  "signed_message(seq, hash) by the ledger's chain key")
    key_id: str | None = Field(None, description="key_id_of(public key) of the signing key")


def signed_message(seq: int, entry_hash: str) -> bytes:
    """The bytes a chain head's signature covers: the entry's sequence number and hash."""
    return f"dpsynth-ledger-head\n{seq}\n{entry_hash}".encode("ascii")


class AnchorStatus(BaseModel):
    """The ledger's head against the newest head written to its append-only anchor."""

    location: str = Field(description="where the anchor log is (file path or s3://bucket/key)")
    local_seq: int
    local_hash: str
    anchored_seq: int
    anchored_hash: str
    behind: bool = Field(description="the database is behind the anchor (restored from an "
                         "older backup?): admissions are refused until reconciliation")
    diverged: bool = Field(False, description="the anchored entry at local_seq has a "
                           "different hash than the database's")
    public_key: str = Field(description="the chain key's public half (urlsafe base64)")
    key_id: str


class VerifyReport(BaseModel):
    ok: bool
    entries: int
    head: str
    problems: list[str] = Field(default_factory=list)
    details: dict[str, Any] = Field(default_factory=dict)
    signatures_checked: int = 0
    anchor: AnchorStatus | None = None


class ApiJobRecord(_Body):
    """A DP job as the api knows it (reconciliation re-charges what the ledger lost)."""

    job_id: str
    dataset_id: str = Field(description="the ledger budget the job was charged to")
    reservation_id: str | None
    state: str
    target_epsilon: float | None = None
    expected_batch_size: int | None = None
    steps: int | None = Field(None, description="the job's reserved/planned steps")
    noise_multiplier: float | None = None
    sample_rate: float | None = None
    progress_step: int = 0


class ReconcileRequest(_Body):
    api_jobs: list[ApiJobRecord] = Field(default_factory=list)


class ReconcileReport(BaseModel):
    ok: bool
    anchored_seq: int
    head_seq_before: int
    head_seq_after: int
    entries_replayed: int = Field(description="anchored entries re-applied as new entries")
    jobs_recharged: list[str] = Field(default_factory=list,
                                      description="api jobs unknown to the ledger, charged")
    spent_before: dict[str, float] = Field(default_factory=dict)
    spent_after: dict[str, float] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)


class LimitUpdate(_Body):
    """Lower a dataset's epsilon limit (never raised) or change its warning fraction."""

    epsilon_limit: float | None = Field(None, gt=0, le=100)
    warning_fraction: float | None = Field(None, gt=0, le=1)


class ChainKey(BaseModel):
    """The public half of the ledger's chain-signing key (what an auditor verifies with)."""

    public_key: str = Field(description="Ed25519 public key, urlsafe base64 (unpadded)")
    key_id: str = Field(description="key_id_of(public_key): first 16 hex digits of its sha256")
    retired_public_keys: list[str] = Field(
        default_factory=list, description="public halves of earlier chain keys (after a key "
        "rotation, older entries carry one of their key ids)")


class RecomputedCharge(BaseModel):
    """One charging entry, its recorded RDP and the RDP the CURRENT accountant code gives."""

    seq: int
    kind: str
    job_id: str | None = None
    reservation_id: str | None = None
    recorded_rdp: dict[str, float] = Field(description="RDP at the order recorded per "
                                           "partition when the entry was written")
    recomputed_rdp: float | None = Field(description="the same charge from the recorded DP "
                                         "event with today's code (None: not recomputable)")
    recorded_dataset_epsilon_spent_after: float | None = None
    recomputed_dataset_epsilon_spent_after: float | None = None
    differs: bool = False


class RecomputeReport(BaseModel):
    """A dataset's charges and figures recomputed with the current accountant code.

    A REPORT only: admission decisions are immutable records. Nothing stored is changed,
    nothing is re-admitted or refunded; a difference is listed for a human to judge.
    """

    dataset_id: str
    accountant: str = Field(description="the accountant code that recomputed the figures")
    conversion_recorded: str | None = Field(None, description="the RDP->DP conversion named "
                                            "in the budget_created entry")
    conversion: str = Field(description="the conversion used today")
    admission_order: int = Field(description="the dataset's fixed order (never re-chosen)")
    delta: float
    epsilon_limit: float
    charges: list[RecomputedCharge] = Field(default_factory=list)
    recorded: dict[str, Any] = Field(default_factory=dict, description="stored figures: "
                                     "rdp_committed per partition, dataset_epsilon_spent")
    recomputed: dict[str, Any] = Field(default_factory=dict, description="the same from the "
                                       "recomputed charges; dataset_tight_epsilon (the tight "
                                       "figure is never stored: always computed on read)")
    differences: list[str] = Field(default_factory=list)
    note: str = ("a report: admission decisions are immutable; no stored figure was changed "
                 "and nothing was re-admitted")


