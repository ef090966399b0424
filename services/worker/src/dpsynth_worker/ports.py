"""The ports the runners depend on: the api's internal endpoints and the ledger.

Adapters: :class:`dpsynth_worker.clients.ApiClient` and
:class:`dpsynth_worker.clients.LedgerClient` (httpx). Tests use in-memory fakes.
Every method raises :class:`dpsynth_shared.errors.DpsynthError` with the service's code.
"""

from __future__ import annotations

from typing import Literal, Protocol

from dpsynth_shared.ledger_contract import (
    BudgetView,
    GdpEnvelope,
    Lease,
    ReadGrant,
    Reservation,
)
from dpsynth_shared.release_contract import (
    CentralImagesRelease,
    CentralImagesRequest,
    DpEvaluationRelease,
    DpEvaluationRequest,
)
from dpsynth_shared.worker_contract import (
    Claim,
    Heartbeat,
    HeartbeatReply,
    ProposeTransition,
    RegisterArtifact,
    RegisteredArtifact,
)
from pydantic import BaseModel

CloseOutcome = Literal["succeeded", "failed", "cancelled"]
#: Per reservation id, the steps on a model's own path (a per-label one's: per class name).
StepsUsed = dict[str, int | dict[str, int]]


class JobEpsilon(BaseModel):
    """The ledger's answer to ``POST /v1/job-epsilon``: a model's standalone epsilon."""

    job_epsilon: float
    delta: float
    per_label: dict[str, float] | None = None


class ApiPort(Protocol):
    """The api's internal worker endpoints (``/internal/v1``)."""

    def claim(self, job_id: str, *, attempt: int, worker_id: str) -> Claim: ...

    def heartbeat(self, job_id: str, beat: Heartbeat) -> HeartbeatReply: ...

    def register_artifact(self, job_id: str, artifact: RegisterArtifact) -> RegisteredArtifact: ...

    def propose_transition(self, job_id: str, proposal: ProposeTransition) -> None: ...


class LedgerPort(Protocol):
    """The ledger's reservation, lease and budget endpoints (``/v1``)."""

    def get_reservation(self, reservation_id: str) -> Reservation: ...

    def read_grant(self, reservation_id: str, *, attempt: int, worker_id: str) -> ReadGrant: ...

    def evaluation_grant(self, evaluation_id: str, *, attempt: int,
                         worker_id: str) -> ReadGrant:
        """A read grant for an evaluate job's PRIVATE reference (a non-DP read the ledger
        records in its chain; no epsilon charged)."""
        ...

    def dp_evaluation_release(self, evaluation_id: str,
                              request: DpEvaluationRequest) -> DpEvaluationRelease:
        """Charge a DP evaluation release to the budget's held-out partition (committed at
        once; 409 ``privacy_budget_exhausted`` when the filter refuses it)."""
        ...

    def central_images_release(self, reservation_id: str,
                               request: CentralImagesRequest) -> CentralImagesRelease:
        """Charge a finetune's central-image release to its budget (every partition, at
        once; ``dry_run`` only calibrates); 409 ``privacy_budget_exhausted`` when the filter
        refuses it. The noise is drawn by the caller only after a charged answer."""
        ...

    def lease(self, reservation_id: str, *, attempt: int, start_step: int, steps: int,
              partition: str | None = None) -> Lease:
        """``partition``: the class of a per-label job's steps (None otherwise)."""
        ...

    def end_lease(self, reservation_id: str, lease_id: str) -> None: ...

    def extend(self, reservation_id: str, *, attempt: int, additional_steps: int,
               partition: str | None = None) -> Reservation: ...

    def close_reservation(self, reservation_id: str, *, outcome: CloseOutcome) -> None: ...

    def job_epsilon(self, *, dataset_id: str, reservation_ids: list[str],
                    steps_used: StepsUsed | None = None) -> JobEpsilon: ...

    def gdp_envelope(self, *, noise_multiplier: float, sample_rate: float,
                     steps: int) -> GdpEnvelope:
        """The Gaussian-DP envelope (μ, tail δ) of a DP-SGD run: the claim an audit tests
        (stateless; nothing is charged)."""
        ...

    def budget_view(self, dataset_id: str) -> BudgetView: ...
