"""Properties of the ledger's RDP filter on random event sequences (hypothesis; issue 4).

The accumulators are built exactly as the ledger builds them: one charge per lease
(``mul_up(steps, rdp_step(σ, q, α*))``, the amount ``chain.verify_chain`` recomputes) or per
Gaussian release (``rdp_at_order``), added with :func:`dpsynth_ledger.book.charge` onto
transient :class:`~dpsynth_ledger.models.Accumulator` rows, and read through
:func:`dpsynth_ledger.book.figures` (the figures the API returns). The independent RDP
computation is opacus' ``compute_rdp`` and ``get_privacy_spent`` (a second implementation of
Mironov, Talwar & Zhang 2019 and of the same RDP→DP conversion); the tight figure is the
ledger's PLD (dp-accounting).

The PLD properties keep step counts and examples small (PLD composition grows with ε/interval).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache

import mpmath as mp
import numpy as np
from dpsynth_ledger.accounting import (
    WHOLE_DATASET,
    admission_order,
    epsilon_to_rdp_budget,
    mul_up,
    pld_epsilon,
    rdp_at_order,
    rdp_step,
    rdp_to_epsilon,
)
from dpsynth_ledger.book import charge, figures
from dpsynth_ledger.models import Accumulator, Budget
from dpsynth_shared.dp_events import DpEvent, DpSgdEvent, GaussianEvent, ParallelEvent
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from opacus.accountants.analysis import rdp as opacus_rdp

ORDERS = list(range(2, 257))
LABELS = ["cat", "dog", "cow"]
# The reference for the accumulator is a 80-digit mpmath evaluation of A_α (Mironov, Talwar &
# Zhang 2019, Sec. 3.3, integer α). The ledger evaluates the same sum with mpmath at 60 digits
# and rounds up, so its charges are never below the reference: no tolerance downwards.
# (dp-accounting's float evaluation, which the ledger used before, fell ~3e-11 relative BELOW
# it at q = 1e-4, σ = 3, α = 100.) opacus is off by up to ~1.5e-7 there, so the ε comparisons
# with opacus allow 1e-6 relative (ε is the RDP plus a positive constant).
EXACT_RTOL = 0.0
LIBRARY_RTOL = 1e-6

sigmas = st.floats(0.5, 20.0)
# q in (0, 1]: below 1e-4 the subsampled Gaussian's RDP is ~q², far under every float margin
rates = st.one_of(st.just(1.0), st.floats(1e-4, 1.0))


def dp_sgd(max_steps: int) -> st.SearchStrategy[DpSgdEvent]:
    return st.builds(lambda s, q, n: DpSgdEvent(noise_multiplier=s, sample_rate=q, steps=n),
                     sigmas, rates, st.integers(1, max_steps))


gaussians = st.builds(lambda s: GaussianEvent(sigma=s, sensitivity=1.0), sigmas)


def events(max_steps: int, max_size: int) -> st.SearchStrategy[list[DpSgdEvent | GaussianEvent]]:
    return st.lists(st.one_of(dp_sgd(max_steps), gaussians), min_size=1, max_size=max_size)


limits = st.sampled_from([(1.0, 1e-5), (4.0, 1e-6), (8.0, 1e-5), (10.0, 1e-5), (20.0, 1e-7)])


def budget(limit: float, delta: float, partitions: Sequence[str] = ()) -> tuple[Budget, dict]:
    """A transient budget row and its accumulators (``"*"`` and one per label), all zero."""
    order = admission_order(limit, delta)
    row = Budget(dataset_id="ds_prop", tenant_id="ten", epsilon_limit=limit, delta=delta,
                 declared_size=1000, neighbouring="add_remove", admission_order=order,
                 rdp_budget=epsilon_to_rdp_budget(limit, order, delta))
    accs = {p: Accumulator(dataset_id="ds_prop", partition=p, committed=0.0, reserved=0.0)
            for p in [WHOLE_DATASET, *partitions]}
    return row, accs


def charge_event(accs: dict, event: DpEvent, order: int, lease: int = 97) -> None:
    """Charge ``event`` the way the ledger does: DP-SGD lease by lease, Gaussians at once."""
    if isinstance(event, ParallelEvent):
        for label, sub in event.partitions.items():
            assert not isinstance(sub, ParallelEvent)
            _charge_run(accs, label, sub, order, lease)
    else:
        _charge_run(accs, WHOLE_DATASET, event, order, lease)


def _charge_run(accs: dict, partition: str, event: DpEvent, order: int, lease: int) -> None:
    if isinstance(event, DpSgdEvent):
        per_step = rdp_step(event.noise_multiplier, event.sample_rate, order)
        for start in range(0, event.steps, lease):
            charge(accs, partition, mul_up(min(lease, event.steps - start), per_step))
    else:
        charge(accs, partition, rdp_at_order(event, order))


def opacus_rdp_curve(evs: Sequence[DpSgdEvent | GaussianEvent]) -> np.ndarray:
    """Σ of the events' RDP at ORDERS, by opacus alone."""
    total = np.zeros(len(ORDERS))
    for ev in evs:
        if isinstance(ev, DpSgdEvent):
            total += opacus_rdp.compute_rdp(q=ev.sample_rate, noise_multiplier=ev.noise_multiplier,
                                            steps=ev.steps, orders=ORDERS)
        else:
            total += opacus_rdp.compute_rdp(q=1.0, noise_multiplier=ev.sigma / ev.sensitivity,
                                            steps=1, orders=ORDERS)
    return total


def opacus_best_epsilon(curve: np.ndarray, delta: float) -> float:
    """min over ORDERS of opacus' RDP→DP conversion (the same formula as the ledger's)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "optimal order is the largest alpha"
        eps, _ = opacus_rdp.get_privacy_spent(orders=ORDERS, rdp=curve, delta=delta)
    return float(eps)


@lru_cache(maxsize=4096)
def exact_step(q: float, sigma: float, order: int) -> mp.mpf:
    """RDP at integer ``order`` of one Poisson-subsampled Gaussian step, to 80 digits."""
    with mp.workdps(80):
        qq, s2 = mp.mpf(q), 2 * mp.mpf(sigma) ** 2
        a = mp.fsum(mp.binomial(order, k) * (1 - qq) ** (order - k) * qq**k
                    * mp.exp((k * k - k) / s2) for k in range(order + 1))
        return mp.log(a) / (order - 1)


def exact_total(evs: Sequence[DpSgdEvent | GaussianEvent], order: int) -> mp.mpf:
    with mp.workdps(80):
        return mp.fsum(ev.steps * exact_step(ev.sample_rate, ev.noise_multiplier, order)
                       if isinstance(ev, DpSgdEvent)
                       else mp.mpf(order) / (2 * (mp.mpf(ev.sigma) / ev.sensitivity) ** 2)
                       for ev in evs)


@settings(max_examples=60, deadline=None)
@given(evs=events(2000, 5), limit=limits)
def test_filter_figure_is_above_an_independent_rdp_computation(
        evs: list[DpSgdEvent | GaussianEvent], limit: tuple[float, float]) -> None:
    row, accs = budget(*limit)
    for ev in evs:
        charge_event(accs, ev, row.admission_order)
    figs = figures(row, accs)
    spent = figs["dataset_epsilon_spent"]
    assert spent == rdp_to_epsilon(accs[WHOLE_DATASET].committed, row.admission_order, row.delta)
    # at the filter's own order the accumulator is at least the exact sum (to EXACT_RTOL) ...
    exact = exact_total(evs, row.admission_order)
    assert figs["rdp_committed"] >= exact * (1 - EXACT_RTOL)
    assert figs["rdp_committed"] <= exact * (1 + 1e-6)
    # ... and the fixed-order figure is at least opacus' best-order RDP figure (min over α)
    best = opacus_best_epsilon(opacus_rdp_curve(evs), row.delta)
    assert math.isfinite(best)
    assert spent >= best * (1 - LIBRARY_RTOL)


@settings(max_examples=12, deadline=None)
@given(evs=events(150, 3), limit=limits)
def test_filter_figure_is_above_the_pld_figure(evs: list[DpSgdEvent | GaussianEvent],
                                               limit: tuple[float, float]) -> None:
    row, accs = budget(*limit)
    for ev in evs:
        charge_event(accs, ev, row.admission_order)
    spent = figures(row, accs)["dataset_epsilon_spent"]
    assume(spent <= 60.0)  # keeps the PLD's support (and its time) bounded
    tight = pld_epsilon(evs, row.delta)
    assert tight <= spent
    assert tight <= opacus_best_epsilon(opacus_rdp_curve(evs), row.delta)


@settings(max_examples=150, deadline=None)
@given(parts=st.lists(st.tuples(sigmas, st.integers(1, 50), st.booleans()), min_size=1,
                      max_size=30),
       order=st.integers(2, 256))
def test_unsubsampled_gaussians_accumulate_to_the_exact_sum(
        parts: list[tuple[float, int, bool]], order: int) -> None:
    """Σ α/(2σᵢ²) exactly (rationals of the float σᵢ), the accumulator never below it."""
    evs: list[DpSgdEvent | GaussianEvent] = [
        DpSgdEvent(noise_multiplier=s, sample_rate=1.0, steps=n) if sgd
        else GaussianEvent(sigma=s, sensitivity=1.0) for s, n, sgd in parts]
    exact = sum((Fraction(order) * (n if sgd else 1) / (2 * Fraction(s) ** 2)
                 for s, n, sgd in parts), Fraction(0))
    _, accs = budget(8.0, 1e-5)
    for ev in evs:
        _charge_run(accs, WHOLE_DATASET, ev, order, lease=7)
    stored = accs[WHOLE_DATASET].committed
    assert Fraction(stored) >= exact
    assert (Fraction(stored) - exact) / exact <= Fraction(1, 10**12)
    # each single charge is the smallest float at or above its exact value
    for s, _, _ in parts:
        one = Fraction(order) / (2 * Fraction(s) ** 2)
        for amount in (rdp_at_order(GaussianEvent(sigma=s, sensitivity=1.0), order),
                       rdp_step(s, 1.0, order)):
            assert Fraction(amount) >= one
            assert Fraction(math.nextafter(amount, -math.inf)) < one


@settings(max_examples=10, deadline=None)
@given(evs=events(120, 4), limit=limits)
def test_adding_an_event_never_lowers_any_figure(evs: list[DpSgdEvent | GaussianEvent],
                                                 limit: tuple[float, float]) -> None:
    row, accs = budget(*limit)
    before = {"rdp": 0.0, "filter": 0.0, "best": 0.0, "pld": 0.0}
    for k, ev in enumerate(evs, start=1):
        charge_event(accs, ev, row.admission_order)
        figs = figures(row, accs)
        now = {"rdp": figs["rdp_committed"], "filter": figs["dataset_epsilon_spent"],
               "best": opacus_best_epsilon(opacus_rdp_curve(evs[:k]), row.delta)}
        if now["filter"] <= 60.0:
            now["pld"] = pld_epsilon(evs[:k], row.delta)
        else:
            now["pld"] = before["pld"]  # beyond the PLD's bounded range: not evaluated
        for name, value in now.items():
            assert value >= before[name], (name, k, before, now)
        assert figs["dataset_epsilon_remaining"] <= row.epsilon_limit
        before = now


@st.composite
def labelled_events(draw: st.DrawFn) -> list[DpEvent]:
    """Whole-dataset events and per-label (parallel) events over a subset of LABELS."""
    out: list[DpEvent] = []
    for _ in range(draw(st.integers(1, 8))):
        if draw(st.booleans()):
            out.append(draw(st.one_of(dp_sgd(2000), gaussians)))
        else:
            names = draw(st.lists(st.sampled_from(LABELS), min_size=1, max_size=3, unique=True))
            out.append(ParallelEvent(partitions={n: draw(st.one_of(dp_sgd(2000), gaussians))
                                                 for n in names}))
    return out


@settings(max_examples=80, deadline=None)
@given(evs=labelled_events(), limit=limits)
def test_partition_accumulators_give_the_max_over_partitions(evs: list[DpEvent],
                                                             limit: tuple[float, float]) -> None:
    row, accs = budget(*limit, partitions=LABELS)
    order = row.admission_order
    for ev in evs:
        charge_event(accs, ev, order)
    # independent sums, exact in rationals of the per-step amounts: a record of label c is
    # touched by every whole-dataset event and by the parallel events that name c, only
    sums: dict[str, Fraction] = {}
    for p in [WHOLE_DATASET, *LABELS]:
        runs = [ev.partitions[p] if isinstance(ev, ParallelEvent) else ev for ev in evs
                if not isinstance(ev, ParallelEvent) or p in ev.partitions]
        sums[p] = sum((exact_rdp(run, order) for run in runs), Fraction(0))
        stored = Fraction(accs[p].committed)
        assert sums[p] <= stored <= sums[p] * (1 + Fraction(1, 10**12))
    figs = figures(row, accs)
    top = max(sums.values())
    assert figs["rdp_committed"] == max(a.committed for a in accs.values())
    assert top <= Fraction(figs["rdp_committed"]) <= top * (1 + Fraction(1, 10**12))
    assert figs["dataset_epsilon_spent"] == rdp_to_epsilon(figs["rdp_committed"], order,
                                                           row.delta)


def exact_rdp(run: DpEvent, order: int) -> Fraction:
    """steps × the per-step amount (DP-SGD) or the amount (Gaussian), as an exact rational."""
    if isinstance(run, DpSgdEvent):
        return run.steps * Fraction(rdp_step(run.noise_multiplier, run.sample_rate, order))
    return Fraction(rdp_at_order(run, order))
