"""The ledger's heavy accounting, bounded, shared and rationed (issue 14, item 1).

One dry-run plan once kept the ledger busy for minutes and every tenant's request failed
behind it. Three rules keep the request path answering:

* **bounded before done**: a plan's steps and runs are checked against
  :class:`~dpsynth_shared.plan_limits.PlanLimits` (the ledger's settings) before any
  calibration (422 ``plan_too_large``);
* **computed once for all processes**: a calibrated σ is kept in ``ledger.calibrations``,
  keyed by the full shape (kind, target ε, q, steps, δ, relation, PLD interval, accountant
  version), so a shape costs its PLD bisection once, not once per ledger process;
* **rationed**: what still has to be computed on a request (a new shape's calibration, a dry
  run's largest admissible target and tight figure, an audit's recompute) takes one of
  ``heavy_concurrency`` slots; a request that cannot get one within ``heavy_wait_s``, or
  finds ``heavy_queue`` requests already waiting, is answered 503 ``ledger_busy`` with
  ``Retry-After``. Heavy work thus holds at most concurrency + queue of the server's
  ``threads``; the others keep serving budget views, admissions and leases, which need no
  slot: the filter's decision is RDP at one order, cheap.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from dpsynth_shared.dp_events import Neighbouring
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.plan_limits import PlanLimits
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session, sessionmaker

from dpsynth_ledger.accounting import (
    ACCOUNTANT_NAME,
    calibrate_gaussian_sigma,
    calibrate_noise_multiplier,
)
from dpsynth_ledger.models import CalibrationRow

RETRY_AFTER_S = 2
"""What a ``ledger_busy`` answer asks the client to wait (the ``Retry-After`` header)."""

INFLIGHT_WAIT_S = 120.0
"""How long a request waits for another's calibration of the same shape (then it tries
itself: the other one failed or is stuck)."""

_Shape = tuple[str, float, float, int, float, str]
"""(kind, target ε, q, steps, δ, relation): the key columns of a calibration row."""


def shape_key(kind: str, target_epsilon: float, sample_rate: float, steps: int, delta: float,
              relation: str, discretization: float) -> str:
    """The canonical key of a calibration: every input, floats by ``repr`` (exact round
    trip), and the accountant's version (a new accountant never reads an old σ)."""
    return "|".join([kind, repr(float(target_epsilon)), repr(float(sample_rate)), str(steps),
                     repr(float(delta)), relation, repr(float(discretization)),
                     ACCOUNTANT_NAME])


def _busy(what: str) -> DpsynthError:
    return DpsynthError(ErrorCode.LEDGER_BUSY, f"the ledger is busy with other heavy "
                        f"computations ({what} waits for one); retry later",
                        retry_after_s=RETRY_AFTER_S)


def _relation(relation: Neighbouring | str | None) -> str:
    return str(relation) if relation is not None else str(Neighbouring.ADD_REMOVE)


class HeavyWork:
    """Bounds, the shared calibration cache and the slots of heavy computations.

    Args:
        sessions: the ledger's session factory (the cache's reads and writes use their own
            short transactions, never the request's); None: no shared cache (in-process only).
        limits: the plan bounds.
        concurrency: heavy computations at once.
        wait_s: how long a heavy request waits for a slot before ``ledger_busy``.
        discretization: the ledger's PLD interval.
        max_composition: runs a dry run's tight figure may compose on the request path.
        max_waiting: requests that may wait for heavy work at once (beyond: ``ledger_busy``).
    """

    def __init__(self, sessions: sessionmaker[Session] | None, *, limits: PlanLimits,
                 concurrency: int, wait_s: float, discretization: float,
                 max_composition: int, max_waiting: int) -> None:
        self.sessions = sessions
        self.limits = limits
        self.max_composition = max_composition
        self.wait_s = wait_s
        self.discretization = discretization
        self._slots = threading.BoundedSemaphore(concurrency)
        self._guard = threading.Lock()
        self.max_waiting = max_waiting
        self._waiting = 0
        self._inflight: dict[str, threading.Event] = {}

    @contextmanager
    def slot(self, what: str) -> Iterator[None]:
        """Hold one heavy slot while the block runs.

        Raises:
            DpsynthError: 503 ``ledger_busy`` (``retry_after_s``) when none frees in time.
        """
        with self._queued(what):
            acquired = self._slots.acquire(timeout=self.wait_s)
        if not acquired:
            raise _busy(what)
        try:
            yield
        finally:
            self._slots.release()

    @contextmanager
    def _queued(self, what: str) -> Iterator[None]:
        """Count a request that waits for heavy work; beyond ``max_waiting`` it is refused at
        once, so waiting requests never hold more than that many of the server's threads."""
        with self._guard:
            if self._waiting >= self.max_waiting:
                raise _busy(what)
            self._waiting += 1
        try:
            yield
        finally:
            with self._guard:
                self._waiting -= 1

    def check_steps(self, steps: int) -> None:
        """One run's steps within ``max_steps`` (every calibration and extension checks it).

        Raises:
            DpsynthError: 422 ``plan_too_large``.
        """
        if steps > self.limits.max_steps:
            raise DpsynthError(ErrorCode.PLAN_TOO_LARGE,
                               f"the run needs {steps} steps; the ledger accounts at most "
                               f"{self.limits.max_steps} (max_steps): fewer epochs or a "
                               "larger batch", bound="max_steps", limit=self.limits.max_steps,
                               value=steps)

    def noise_multiplier(self, target_epsilon: float, sample_rate: float, steps: int,
                         delta: float, relation: Neighbouring | str | None) -> float:
        """:func:`~dpsynth_ledger.accounting.calibrate_noise_multiplier` through the bounds,
        the shared cache and a slot (the cached σ is the one calibration returned)."""
        self.check_steps(steps)
        key = shape_key("dp_sgd", target_epsilon, sample_rate, steps, delta,
                        _relation(relation), self.discretization)
        return self._once(key, lambda: calibrate_noise_multiplier(
            target_epsilon, sample_rate, steps, delta, self.discretization, relation),
            ("dp_sgd", target_epsilon, sample_rate, steps, delta, _relation(relation)))

    def gaussian_sigma(self, target_epsilon: float, delta: float) -> float:
        """:func:`~dpsynth_ledger.accounting.calibrate_gaussian_sigma` through the shared
        cache and a slot (the analytic Gaussian mechanism's σ, milliseconds; the cache keeps
        every process's σ for a shape identical)."""
        relation = str(Neighbouring.ADD_REMOVE)
        key = shape_key("gaussian", target_epsilon, 1.0, 1, delta, relation,
                        self.discretization)
        return self._once(key, lambda: calibrate_gaussian_sigma(
            target_epsilon, delta, self.discretization),
            ("gaussian", target_epsilon, 1.0, 1, delta, relation))

    def _once(self, key: str, compute: Callable[[], float], shape: _Shape) -> float:
        """The cached σ of ``key``, or ``compute()`` in a slot, kept for every process.

        Concurrent requests of one shape (fifty submissions of one job) wait for the first
        one's calibration, holding no slot, instead of each asking for one.
        """
        cached = self._cached(key)
        if cached is not None:
            return cached
        with self._guard:
            running = self._inflight.get(key)
            if running is None:
                self._inflight[key] = threading.Event()
        if running is not None:
            with self._queued("a noise calibration"):
                running.wait(INFLIGHT_WAIT_S)
            cached = self._cached(key)
            if cached is not None:
                return cached
        try:
            with self.slot("a noise calibration"):
                sigma = compute()
            self._store(key, *shape, sigma)
        finally:
            if running is None:
                with self._guard:
                    self._inflight.pop(key).set()
        return sigma

    def _cached(self, key: str) -> float | None:
        if self.sessions is None:
            return None
        with self.sessions() as session:
            row = session.get(CalibrationRow, key)
            return None if row is None else row.sigma

    def _store(self, key: str, kind: str, target_epsilon: float, sample_rate: float,
               steps: int, delta: float, relation: str, sigma: float) -> None:
        """Keep a calibrated σ (the first writer wins: every writer computed the same σ)."""
        if self.sessions is None or not math.isfinite(sigma):
            return
        with self.sessions() as session:
            session.execute(insert(CalibrationRow).values(
                shape=key, kind=kind, target_epsilon=target_epsilon, sample_rate=sample_rate,
                steps=steps, delta=delta, relation=relation,
                discretization=self.discretization, accountant=ACCOUNTANT_NAME, sigma=sigma,
                created_at=datetime.now(UTC)).on_conflict_do_nothing(index_elements=["shape"]))
            session.commit()
