"""Heartbeats: data-independent progress of one attempt, posted to the api.

A background thread posts every ``interval_s`` (so downloads and uploads are covered too);
progress updates from the training thread also post when a beat is due. A heartbeat
carries step, total, epsilon so far (from the ledger's last lease) and an ETA: the wall time
per step since the attempt's first step, times the steps left. Never anything computed from
private data: every logical step processes a fixed number of rows set by public numbers
(``dpsynth_ml.dp.padding``), so the time per step, hence the ETA and the beats' times, do not
depend on the data (docs/privacy.md, "What leaves a DP job" and "Progress, ETA and timing").
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.worker_contract import Heartbeat

from dpsynth_worker import metrics

if TYPE_CHECKING:
    from dpsynth_worker.ports import ApiPort
    from dpsynth_worker.runners.context import StopFlags

log = logging.getLogger(__name__)

#: Answers meaning "this attempt is no longer the job's current one": stop, report nothing.
FENCED_CODES = frozenset({ErrorCode.STALE_ATTEMPT, ErrorCode.INVALID_TRANSITION,
                          ErrorCode.CLAIM_REFUSED, ErrorCode.LEASE_EXPIRED})


@dataclass
class _Progress:
    step: int = 0
    total: int = 0
    epsilon: float | None = None
    phase: str = "starting"
    first_step: int | None = None
    first_at: float = 0.0


class Heartbeater:
    """Posts heartbeats for one attempt; sets ``flags.cancel`` / ``flags.stale`` from replies.

    Args:
        api: the api port.
        job_id: the job.
        attempt: the claimed attempt.
        interval_s: seconds between beats (the claim's ``heartbeat_s``).
        flags: the attempt's stop flags.
    """

    def __init__(self, api: ApiPort, *, job_id: str, attempt: int, interval_s: float,
                 flags: StopFlags) -> None:
        self._api, self._job_id, self._attempt = api, job_id, attempt
        self._interval_s, self._flags = interval_s, flags
        self._state = _Progress()
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._last_beat = 0.0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeater:
        self.beat()
        # In a copy of this context, so the thread's log lines carry the job id too.
        self._thread = threading.Thread(target=contextvars.copy_context().run,
                                        args=(self._loop,), name="heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def phase(self, name: str) -> None:
        """Name the current data-independent phase ('downloading', 'training', ...)."""
        with self._lock:
            self._state.phase = name
        self.beat()

    def progress(self, step: int, total: int, *, epsilon: float | None = None) -> None:
        """Record progress; post a heartbeat when one is due."""
        with self._lock:
            state = self._state
            if state.first_step is None or step < state.first_step:
                state.first_step, state.first_at = step, time.monotonic()
            state.step, state.total = step, total
            if epsilon is not None:
                state.epsilon = epsilon
        metrics.JOB_STEP.set(step)
        metrics.JOB_TOTAL_STEPS.set(total)
        if time.monotonic() - self._last_beat >= self._interval_s:
            self.beat()

    def set_epsilon(self, epsilon: float) -> None:
        """Record the ledger's standalone epsilon of the steps granted so far."""
        with self._lock:
            self._state.epsilon = epsilon

    def beat(self) -> None:
        """Post one heartbeat now; network trouble is logged, never raised."""
        with self._send_lock:
            with self._lock:
                body = self._body()
                self._last_beat = time.monotonic()
            try:
                reply = self._api.heartbeat(self._job_id, body)
            except DpsynthError as exc:
                if exc.code in FENCED_CODES:
                    log.warning("heartbeat refused: attempt is stale",
                                extra={"code": str(exc.code)})
                    self._flags.stale.set()
                else:
                    log.warning("heartbeat failed", extra={"code": str(exc.code)})
                return
        if reply.cancel_requested and not self._flags.cancel.is_set():
            log.info("cancel requested", extra={"job_state": str(reply.state)})
            self._flags.cancel.set()

    def _body(self) -> Heartbeat:
        s = self._state
        eta: float | None = None
        done = s.step - (s.first_step if s.first_step is not None else s.step)
        if done > 0 and s.total >= s.step:
            eta = (time.monotonic() - s.first_at) / done * (s.total - s.step)
        return Heartbeat(attempt=self._attempt, step=s.step, total=s.total,
                         epsilon_so_far=s.epsilon, eta_s=eta, message=s.phase)

    def _loop(self) -> None:
        while not self._stopping.wait(max(self._interval_s, 0.05)):
            if time.monotonic() - self._last_beat >= self._interval_s:
                self.beat()
