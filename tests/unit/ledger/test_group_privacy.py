"""Group privacy (one neighbouring relation per dataset) and per-label composition when the
labels are not disjoint in the privacy unit (issue 4, items 2 and 3).

An add/remove event entering a replace-one dataset is charged, at the dataset's order α*,
3·RDP_add/remove(2α*) (Mironov 2017, "Rényi Differential Privacy", Prop. 2, distance 2 = 2^1).
For a Gaussian the exact RDP at distance 2 is known in closed form: a replaced record moves
the output by 2Δ, so it is α·(2Δ)²/(2σ²) = 4α/(2σ²) for Δ = 1; the Mironov bound is
3·(2α)/(2σ²) = 6α/(2σ²) and must never fall below it. For DP-SGD the charge is checked
against 3 × dp_accounting's and opacus' RDP at 2α.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from dp_accounting import dp_event as dpe
from dp_accounting.rdp import rdp_privacy_accountant as dp_rdp
from dpsynth_ledger.accounting import (
    GROUP_FACTOR,
    WHOLE_DATASET,
    by_group,
    calibrate_noise_multiplier,
    charge_step,
    check_neighbouring,
    dp_sgd_epsilon,
    gaussian_epsilon,
    group_rdp,
    max_admissible_target,
    min_noise_multiplier_for_room,
    pld_epsilon,
    rdp_at_order,
    rdp_step,
    rdp_to_epsilon,
)
from dpsynth_ledger.book import charge, touched
from dpsynth_ledger.models import Accumulator, Budget
from dpsynth_ledger.service.plans import RunPlan, composition_notes, new_charges
from dpsynth_shared.dp_events import DpSgdEvent, GaussianEvent, Neighbouring, ParallelEvent
from dpsynth_shared.errors import DpsynthError
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus.accountants.analysis.rdp import compute_rdp

RO, AR = Neighbouring.REPLACE_ONE, Neighbouring.ADD_REMOVE


def exact_distance2_gaussian(order: int, sigma: float, steps: int = 1) -> Fraction:
    """steps · α·(2Δ)²/(2σ²) with Δ = 1: the exact RDP of a Gaussian at distance 2."""
    return steps * Fraction(order) * 4 / (2 * Fraction(sigma) ** 2)


# --- closed forms ----------------------------------------------------------------------------

@pytest.mark.parametrize("sigma", [0.5, 0.8, 1.0, 2.5, 7.3])
@pytest.mark.parametrize("order", [2, 3, 8, 32, 100, 256])
def test_gaussian_group_bound_is_six_alpha_over_two_sigma2(sigma: float, order: int) -> None:
    """The group charge of a unit Gaussian is ⌈6α/(2σ²)⌉ and ≥ the exact 4α/(2σ²)."""
    charged = rdp_at_order(GaussianEvent(sigma=sigma, sensitivity=1.0), order, RO)
    mironov = Fraction(6 * order) / (2 * Fraction(sigma) ** 2)
    assert Fraction(charged) >= mironov  # rounded up, never below
    assert charged == pytest.approx(float(mironov), rel=1e-15)
    assert Fraction(charged) >= exact_distance2_gaussian(order, sigma)
    # DP-SGD without subsampling is the same Gaussian (steps × step, one more ulp up)
    sgd = rdp_at_order(DpSgdEvent(noise_multiplier=sigma, sample_rate=1.0, steps=1), order, RO)
    assert charged <= sgd <= math.nextafter(charged, math.inf)


@pytest.mark.parametrize(("sigma", "q"), [(0.8, 0.01), (1.0, 0.05), (1.5, 0.2), (3.0, 0.001),
                                         (0.6, 0.5)])
@pytest.mark.parametrize("order", [2, 5, 16, 40, 64])
def test_dp_sgd_group_charge_is_three_times_rdp_at_twice_the_order(sigma: float, q: float,
                                                                     order: int) -> None:
    """3 × dp_accounting's and opacus' RDP at 2α (both evaluate Mironov-Talwar-Zhang)."""
    charged = charge_step(sigma, q, order, RO)
    assert charged == group_rdp(rdp_step(sigma, q, 2 * order))
    assert Fraction(charged) >= GROUP_FACTOR * Fraction(rdp_step(sigma, q, 2 * order))
    acc = dp_rdp.RdpAccountant(orders=[float(2 * order)])
    acc.compose(dpe.PoissonSampledDpEvent(q, dpe.GaussianDpEvent(sigma)))
    reference = 3 * float(acc._rdp[0])
    assert charged == pytest.approx(reference, rel=1e-9)
    assert charged >= reference * (1 - 1e-9)
    opacus = 3 * float(compute_rdp(q=q, noise_multiplier=sigma, steps=1,
                                   orders=[float(2 * order)])[0])
    assert charged == pytest.approx(opacus, rel=1e-6)
    # an add/remove dataset is charged the plain step
    assert charge_step(sigma, q, order, AR) == charge_step(sigma, q, order) == \
        rdp_step(sigma, q, order)
    # and steps compose additively, rounded up
    run = DpSgdEvent(noise_multiplier=sigma, sample_rate=q, steps=37)
    assert rdp_at_order(run, order, RO) >= 37 * charged


@settings(max_examples=80, deadline=None)
@given(sigma=st.floats(0.4, 30.0), order=st.integers(2, 128), steps=st.integers(1, 5000))
def test_group_charge_never_below_the_exact_distance2_gaussian(sigma: float, order: int,
                                                               steps: int) -> None:
    """Property: the charged RDP ≥ the exact distance-2 Gaussian RDP, to the last bit."""
    for event in (DpSgdEvent(noise_multiplier=sigma, sample_rate=1.0, steps=steps),
                  GaussianEvent(sigma=sigma, sensitivity=1.0)):
        n = steps if isinstance(event, DpSgdEvent) else 1
        charged = rdp_at_order(event, order, RO)
        assert Fraction(charged) >= exact_distance2_gaussian(order, sigma, n)
        assert Fraction(charged) >= Fraction(3, 2) * exact_distance2_gaussian(order, sigma, n)


@settings(max_examples=40, deadline=None)
@given(sigma=st.floats(0.5, 10.0), q=st.floats(1e-3, 0.9), order=st.integers(2, 48))
def test_subsampled_group_charge_dominates(sigma: float, q: float, order: int) -> None:
    """Property: on a replace-one dataset a step costs ≥ 3× its add/remove RDP at the SAME
    order (RDP grows with the order) and exactly ⌈3·RDP(2α)⌉."""
    charged = charge_step(sigma, q, order, RO)
    assert Fraction(charged) >= 3 * Fraction(rdp_step(sigma, q, 2 * order))
    assert charged >= 3 * rdp_step(sigma, q, order)


# --- relations -------------------------------------------------------------------------------

def test_replace_one_never_enters_add_remove() -> None:
    replace = DpSgdEvent(noise_multiplier=1.0, sample_rate=0.1, steps=3, neighbouring=RO)
    with pytest.raises(DpsynthError) as info:
        check_neighbouring(replace, AR)
    assert info.value.code == "unsupported_neighbouring"
    assert "not add/remove private at all" in info.value.detail
    check_neighbouring(ParallelEvent(partitions={"a": DpSgdEvent(
        noise_multiplier=1.0, sample_rate=0.1, steps=1)}), RO)
    with pytest.raises(ValueError):
        rdp_at_order(replace, 8, AR)
    with pytest.raises(ValueError):
        by_group(AR, RO)
    assert by_group(RO, AR) and not by_group(RO, RO) and not by_group(None, AR)
    # a DP-SGD event labelled replace-one is still charged through group privacy (its
    # replace-one RDP is not the add/remove formula): never lower than the add/remove one
    assert rdp_at_order(replace, 8, RO) == rdp_at_order(replace, 8) == \
        rdp_at_order(DpSgdEvent(noise_multiplier=1.0, sample_rate=0.1, steps=3), 8, RO)


def test_replace_one_histogram_is_exact_not_grouped() -> None:
    """A Gaussian recorded under the dataset's own relation (sensitivity √2 for replace-one
    histograms) is charged exactly α·s²/(2σ²), not through group privacy."""
    ev = GaussianEvent(sigma=3.0 * math.sqrt(2), sensitivity=math.sqrt(2), neighbouring=RO)
    assert rdp_at_order(ev, 10, RO) == rdp_at_order(ev, 10) == pytest.approx(10 / 18)


# --- the tight figure and calibration on a replace-one dataset ---------------------------------

@pytest.mark.parametrize(("sigma", "q", "steps"), [(1.0, 0.01, 500), (1.5, 0.05, 200),
                                                   (2.0, 1.0, 4)])
def test_replace_one_pld_between_add_remove_and_the_group_bound(sigma: float, q: float,
                                                                steps: int) -> None:
    """ε_AR (PLD) ≤ ε_RO (PLD, tight) ≤ the group RDP bound converted at its best order."""
    delta = 1e-6
    ar = dp_sgd_epsilon(sigma, q, steps, delta)
    ro = dp_sgd_epsilon(sigma, q, steps, delta, dataset=RO)
    group = min(rdp_to_epsilon(rdp_at_order(DpSgdEvent(noise_multiplier=sigma, sample_rate=q,
                                                       steps=steps), a, RO), a, delta)
                for a in range(2, 65))
    assert ar <= ro <= group
    if q == 1.0:  # without subsampling: the Gaussian of sensitivity 2, i.e. multiplier σ/2
        assert ro == pytest.approx(gaussian_epsilon(sigma / 2 / math.sqrt(steps), delta),
                                   rel=2e-2)


def test_calibration_meets_the_replace_one_target() -> None:
    delta, q, steps, target = 1e-6, 0.02, 300, 2.0
    sigma_ar = calibrate_noise_multiplier(target, q, steps, delta)
    sigma_ro = calibrate_noise_multiplier(target, q, steps, delta, dataset=RO)
    assert sigma_ro > sigma_ar
    eps = dp_sgd_epsilon(sigma_ro, q, steps, delta, dataset=RO)
    assert eps <= target and eps >= target * 0.99
    # the largest admissible target uses the group charge, at the filter's order
    order = 20
    room = 3 * steps * charge_step(sigma_ro, q, order, RO)
    sigma_min = min_noise_multiplier_for_room(room, q, steps, order, RO)
    assert sigma_min is not None
    assert steps * charge_step(sigma_min, q, order, RO) <= room * (1 + 1e-12)
    best = max_admissible_target(room, q, steps, order, delta, dataset=RO)
    assert best is not None and best > eps


def test_pld_epsilon_on_non_disjoint_labels_composes_the_classes() -> None:
    a = DpSgdEvent(noise_multiplier=1.0, sample_rate=0.05, steps=100)
    b = DpSgdEvent(noise_multiplier=1.5, sample_rate=0.05, steps=100)
    par = ParallelEvent(partitions={"cat": a, "dog": b})
    assert pld_epsilon([par], 1e-6) == pytest.approx(pld_epsilon([a], 1e-6))
    assert pld_epsilon([par], 1e-6, disjoint=False) == pytest.approx(pld_epsilon([a, b], 1e-6))
    assert pld_epsilon([par], 1e-6, disjoint=False) > pld_epsilon([par], 1e-6)


# --- routing of charges when labels are not disjoint ------------------------------------------

def _accs() -> dict[str, Accumulator]:
    return {p: Accumulator(dataset_id="d", partition=p, committed=0.0, reserved=0.0)
            for p in [WHOLE_DATASET, "cat", "dog"]}


def test_non_disjoint_class_runs_touch_every_partition_and_sum() -> None:
    accs = _accs()
    assert touched("cat", accs) == ["cat"]
    assert touched("cat", accs, disjoint=False) == [WHOLE_DATASET, "cat", "dog"]
    runs = [RunPlan(partition=c, sigma=1.0, q=0.1, steps=10, batch=5, size=50,
                    rdp_per_step=r / 10, rdp_total=r, job_epsilon=1.0)
            for c, r in (("cat", 0.25), ("dog", 0.5))]
    assert new_charges(runs, accs) == {"cat": 0.25, "dog": 0.5}
    summed = new_charges(runs, accs, disjoint=False)
    assert set(summed) == {WHOLE_DATASET, "cat", "dog"}
    assert all(v >= 0.75 for v in summed.values())
    charge(accs, "cat", 0.25, disjoint=False)
    charge(accs, "dog", 0.5, disjoint=False)
    assert all(a.committed >= 0.75 for a in accs.values())


def test_plan_composition_and_notes() -> None:
    def row(**kw: object) -> Budget:
        base = {"neighbouring": "add_remove", "privacy_unit": "image",
                "partitions_disjoint": True}
        return Budget(**{**base, **kw})

    assert composition_notes(row(), per_label=False) == ("single", [])
    comp, notes = composition_notes(row(), per_label=True)
    assert comp == "parallel" and "parallel" in notes[0]
    comp, notes = composition_notes(row(privacy_unit="subject", partitions_disjoint=False),
                                    per_label=True)
    assert comp == "sequential"
    assert any("q and N̂ count subjects" in n for n in notes)
    assert any("summed across classes" in n for n in notes)
    comp, notes = composition_notes(row(neighbouring="replace_one"), per_label=False)
    assert comp == "single"
    assert "charged through group privacy at distance 2 (Mironov 2017, Prop. 2)" in notes[0]
