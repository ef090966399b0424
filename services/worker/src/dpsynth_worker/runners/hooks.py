"""Implementations of :class:`dpsynth_ml.TrainingHooks` for the platform.

:class:`PlainHooks` (pretrain: public data) only reports progress and stops on request.
:class:`LeasedHooks` (finetune) charges the privacy budget *before* steps run by asking the
ledger for step leases (docs/privacy.md, "Charging"), uploads checkpoints, and keeps the
owner-only, non-DP statistics in memory for one upload at the end: never logged, never
sent in heartbeats or metrics.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.ledger_contract import LabelReservation, Lease, Reservation
from dpsynth_shared.release_contract import CentralImagesRelease, CentralImagesRequest

from dpsynth_worker.runners.artifacts import checkpoint_key, tar_folder, upload_and_register
from dpsynth_worker.runners.heartbeat import FENCED_CODES

if TYPE_CHECKING:
    from dpsynth_ml import CentralImages

    from dpsynth_worker.runners.context import JobContext

log = logging.getLogger(__name__)


class PlainHooks:
    """Progress and stop requests only (a non-private job grants every step)."""

    def __init__(self, ctx: JobContext) -> None:
        self._ctx = ctx

    def acquire_steps(self, start: int, count: int, partition: str | None = None) -> int:
        """Grant all steps: public data costs no budget."""
        return count

    def charge_release(self, release: CentralImages) -> None:
        """A pretrain releases nothing private: asking is a bug."""
        raise DpsynthError(ErrorCode.INVALID_SPEC, "only a finetune makes a DP release")

    def should_stop(self) -> bool:
        """Stop on cancel, SIGTERM or a fenced-off attempt."""
        return self._ctx.flags.any()

    def on_progress(self, step: int, total: int) -> None:
        """Forward progress to the heartbeat."""
        self._ctx.heartbeat.progress(step, total)

    def on_checkpoint(self, step: int, checkpoint_dir: Path) -> None:
        """Pretraining restarts from scratch; its checkpoints are not kept."""

    def on_private_stats(self, stats: Mapping[str, float]) -> None:
        """A pretrain has no private data."""


class LeasedHooks(PlainHooks):
    """Step leases from the ledger, checkpoint uploads and owner-only statistics.

    Args:
        ctx: the attempt.
        reservation_id: the job's reservation at the ledger.
        central: the job's central-image release as calibrated by the ledger (its request
            and the dry run's answer), charged by :meth:`charge_release`; None: the job
            makes no such release.
    """

    def __init__(self, ctx: JobContext, reservation_id: str, *,
                 central: tuple[CentralImagesRequest, CentralImagesRelease] | None = None
                 ) -> None:
        super().__init__(ctx)
        self._rid = reservation_id
        self._central = central
        self.releases: list[CentralImagesRelease] = []
        self.budget_refused = False
        self.lease: Lease | None = None
        self.leases: list[Lease] = []
        self.checkpoints: list[int] = []
        self.private_stats: list[dict[str, float]] = []
        self._step = 0

    def charge_release(self, release: CentralImages) -> None:
        """Charge the central-image release at the ledger before the ML core draws its noise.

        The release must be the one the ledger calibrated for this job (noise std and bound
        verbatim); the charged answer must match it too, or nothing is released. A refusal
        (409 ``privacy_budget_exhausted``) propagates: the job fails, nothing released.
        """
        from dpsynth_worker.runners.central_images import charge

        if self._central is None:
            raise DpsynthError(ErrorCode.INVALID_SPEC, "this job planned no central-image "
                               "release")
        request, planned = self._central
        if release.noise_std != planned.noise_std or release.bound != planned.bound:
            raise DpsynthError(ErrorCode.INVALID_SPEC, "the ML core asked to charge a release "
                               "other than the one calibrated for this job")
        charged = charge(self._ctx, self._rid, request, planned)
        self.releases.append(charged)
        log.info("central-image release charged",
                 extra={"release_id": charged.release_id, "epsilon": charged.epsilon})

    def should_stop(self) -> bool:
        """Also stop once the ledger refused more steps."""
        return self.budget_refused or super().should_stop()

    def acquire_steps(self, start: int, count: int, partition: str | None = None) -> int:
        """Lease ``[start, start + count)`` for this attempt; 0 stops the trainer.

        A resumed attempt replays steps its reservation already granted, so the ledger may
        answer ``reservation_exhausted``: the missing steps are then asked for through
        ``extend`` (a new admission) and the lease retried once. A refusal ends the job
        ``failed`` with its last checkpoint.

        A per-label job leases each class's steps under its ``partition`` (steps counted
        per class from 0); the ledger charges them to that class's accumulator only, and an
        extension is asked for that class alone.
        """
        ctx = self._ctx
        self._step = start
        try:
            lease = self._lease(start, count, partition)
        except DpsynthError as exc:
            if exc.code != ErrorCode.RESERVATION_EXHAUSTED:
                return self._refused(exc)
            try:
                self._extend(count, partition)
                lease = self._lease(start, count, partition)
            except DpsynthError as again:
                return self._refused(again)
        self.lease = lease
        self.leases.append(lease)
        ctx.heartbeat.set_epsilon(lease.job_epsilon_granted)
        log.info("steps leased", extra={"start_step": start, "steps": lease.steps,
                                        "partition": partition,
                                        "steps_granted_total": lease.steps_granted_total})
        return min(lease.steps, count)

    def _lease(self, start: int, count: int, partition: str | None) -> Lease:
        return self._ctx.ledger.lease(self._rid, attempt=self._ctx.attempt, start_step=start,
                                      steps=count, partition=partition)

    def _extend(self, count: int, partition: str | None) -> None:
        reservation = self._ctx.ledger.get_reservation(self._rid)
        run: Reservation | LabelReservation = reservation
        if partition is not None:
            if not reservation.per_label or partition not in reservation.per_label:
                raise DpsynthError(ErrorCode.INVALID_SPEC,
                                   "the reservation has no run for this class")
            run = reservation.per_label[partition]
        left = max(0, run.steps_reserved - run.steps_granted)
        missing = max(1, count - left)
        log.info("asking the ledger to extend the reservation",
                 extra={"steps": missing, "partition": partition})
        self._ctx.ledger.extend(self._rid, attempt=self._ctx.attempt, additional_steps=missing,
                                partition=partition)

    def _refused(self, exc: DpsynthError) -> int:
        if exc.code in FENCED_CODES:
            self._ctx.flags.stale.set()
        elif exc.code in (ErrorCode.PRIVACY_BUDGET_EXHAUSTED, ErrorCode.RESERVATION_EXHAUSTED):
            self.budget_refused = True
        else:
            raise exc
        log.warning("lease refused", extra={"code": str(exc.code), "start_step": self._step})
        return 0

    def on_progress(self, step: int, total: int) -> None:
        """Forward progress and the epsilon of the steps granted so far."""
        self._step = step
        self._ctx.heartbeat.progress(step, total)

    def on_checkpoint(self, step: int, checkpoint_dir: Path) -> None:
        """Upload the checkpoint (a DP output) and register it for resumption."""
        ctx = self._ctx
        ctx.heartbeat.phase("checkpointing")
        archive = tar_folder(checkpoint_dir, ctx.work_dir / f"checkpoint-{step}.tar")
        meta: dict[str, object] = {"step": step, "reservation_id": self._rid}
        key = checkpoint_key(ctx.job_id, step)
        upload_and_register(ctx, key=key, path=archive, kind="checkpoint", metadata=meta,
                            checkpoint_step=step)
        archive.unlink()
        log.info("checkpoint uploaded", extra={"step": step, "object_key": key})
        self.checkpoints.append(step)
        ctx.heartbeat.phase("training")

    def on_private_stats(self, stats: Mapping[str, float]) -> None:
        """Keep owner-only, non-DP statistics in memory (never logged or exported)."""
        self.private_stats.append({"step": float(self._step), **dict(stats)})

    def end_lease(self) -> None:
        """End the current lease early (SIGTERM); its steps stay charged."""
        if self.lease is None:
            return
        try:
            self._ctx.ledger.end_lease(self._rid, self.lease.lease_id)
        except DpsynthError as exc:
            log.warning("ending the lease failed", extra={"code": str(exc.code)})
            return
        log.info("lease ended early; its steps stay charged",
                 extra={"lease_id": self.lease.lease_id, "start_step": self.lease.start_step,
                        "steps": self.lease.steps, "stopped_at_step": self._step})
