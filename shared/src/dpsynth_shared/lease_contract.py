"""A reservation's step leases and read grants (``/v1/reservations/{id}/leases``,
``/read-grants``, ``/extend``, ``/close`` of services/ledger): what a worker holds while a DP
job runs. Part of the ledger's contract (:mod:`dpsynth_shared.ledger_contract` re-exports
every name)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from dpsynth_shared.text import ContractBody


class _Body(ContractBody):
    """A body of this contract (dpsynth_shared.text.ContractBody)."""


class ReadGrantRequest(_Body):
    attempt: int = Field(ge=1)
    worker_id: str


class ReadGrant(BaseModel):
    """A signed token the object store checks before serving a private object."""

    token: str
    dataset_id: str
    reservation_id: str
    attempt: int
    expires_at: datetime


class LeaseRequest(_Body):
    attempt: int = Field(ge=1)
    start_step: int = Field(ge=0)
    steps: int = Field(ge=1)
    partition: str | None = Field(None, description="per-label job: the class whose steps "
                                  "are leased (its steps count from 0); None otherwise")


class Lease(BaseModel):
    lease_id: str
    reservation_id: str
    attempt: int
    start_step: int
    steps: int
    expires_at: datetime
    grant: ReadGrant = Field(description="read grant renewed to the lease's expiry")
    partition: str | None = None
    steps_granted_total: int = Field(description="steps granted so far (per label: in the "
                                     "lease's class)")
    job_epsilon_granted: float = Field(description="standalone epsilon of the job's granted "
                                       "steps (per label: max over classes)")


class ExtendRequest(_Body):
    attempt: int = Field(ge=1)
    additional_steps: int = Field(ge=1)
    partition: str | None = Field(None, description="per-label job: the class to extend")


class CloseRequest(_Body):
    outcome: Literal["succeeded", "failed", "cancelled"]
