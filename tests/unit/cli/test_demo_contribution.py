"""The private data's contribution in ``make demo`` (issue 18, item 7): the standard error of
the difference of two held-out accuracies and the two-standard-error decision."""

from __future__ import annotations

import math

import pytest
from dpsynth_cli.contribution import (
    MIN_STANDARD_ERRORS,
    contribution_from_reports,
    contribution_shown,
    difference_standard_error,
    private_contribution,
)


def test_standard_error_is_the_binomial_formula() -> None:
    se = difference_standard_error(0.5, 0.8, 278)
    assert se == pytest.approx(math.sqrt(0.5 * 0.5 / 278 + 0.8 * 0.2 / 278))
    assert difference_standard_error(0.0, 1.0, 10) == 0.0
    assert difference_standard_error(0.3, 0.6, 100) == difference_standard_error(0.6, 0.3, 100)


@pytest.mark.parametrize(("p1", "p2", "n"), [(-0.1, 0.5, 10), (0.5, 1.2, 10), (0.5, 0.5, 0)])
def test_standard_error_refuses_impossible_inputs(p1: float, p2: float, n: int) -> None:
    with pytest.raises(ValueError):
        difference_standard_error(p1, p2, n)


def test_private_contribution_has_the_summary_keys() -> None:
    c = private_contribution(0.4, 0.7, n_test=278, epsilon=4.99)
    assert set(c) == {"public_only_accuracy", "dp_finetuned_accuracy", "epsilon", "n_test",
                      "standard_error", "difference"}
    assert c["difference"] == pytest.approx(0.3)
    assert c["standard_error"] == pytest.approx(difference_standard_error(0.4, 0.7, 278))
    assert c["n_test"] == 278 and c["epsilon"] == 4.99


def test_the_decision_needs_two_standard_errors_above_public_only() -> None:
    assert MIN_STANDARD_ERRORS == 2.0
    se = difference_standard_error(0.5, 0.6, 278)  # about 0.041: 0.1 is about 2.4 SE
    assert contribution_shown(private_contribution(0.5, 0.6, n_test=278, epsilon=4.0))
    # 1.5 SE above: not shown; below or equal: never shown
    assert not contribution_shown(private_contribution(0.5, 0.5 + 1.5 * se, n_test=278,
                                                       epsilon=4.0))
    assert not contribution_shown(private_contribution(0.6, 0.5, n_test=278, epsilon=4.0))
    assert not contribution_shown(private_contribution(0.5, 0.5, n_test=278, epsilon=4.0))
    # exactly at the bar counts; a zero SE needs a strictly positive difference
    exact = {"difference": 0.2, "standard_error": 0.1}
    assert contribution_shown(exact)
    assert contribution_shown({"difference": 1.0, "standard_error": 0.0})
    assert not contribution_shown({"difference": 0.0, "standard_error": 0.0})
    assert not contribution_shown(exact, k=3.0)


def _report(cnn: float, n: int) -> dict:
    return {"sizes": {"real_holdout": n, "synthetic": 600},
            "headline": {"tstr_accuracy": {"cnn": cnn, "logreg": 0.1}}}


def test_contribution_from_two_reports_on_the_same_held_out_records() -> None:
    c = contribution_from_reports(_report(0.45, 278), _report(0.7, 278), classifier="cnn",
                                  epsilon=4.0)
    assert c == private_contribution(0.45, 0.7, n_test=278, epsilon=4.0)
    with pytest.raises(ValueError, match="different held-out sets"):
        contribution_from_reports(_report(0.45, 200), _report(0.7, 278), classifier="cnn",
                                  epsilon=4.0)
    with pytest.raises(ValueError, match="no 'mlp' classifier"):
        contribution_from_reports(_report(0.45, 278), _report(0.7, 278), classifier="mlp",
                                  epsilon=4.0)


def _demo_module():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "scripts" / "demo.py"
    spec = importlib.util.spec_from_file_location("dpsynth_demo_script", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_validation_mode_never_uploads_the_test_digits() -> None:
    """``scripts/demo.py --validation`` (how the demo's settings were chosen) uploads only
    the private TRAINING part: none of the records the platform holds out as test data."""
    import numpy as np
    from dpsynth_cli.samples import split_digits
    from dpsynth_shared.record_splits import in_first_part, record_hashes

    demo = _demo_module()
    images, labels = split_digits()["private"]
    kept_images, kept_labels = demo.private_training_part(images, labels)
    held = in_first_part(demo.HOLDOUT_KEY.encode(), record_hashes(images), demo.PRIVATE_HOLDOUT)
    assert len(kept_labels) == len(labels) - int(held.sum()) and held.sum() > 0
    test_hashes = set(np.asarray(record_hashes(images))[held])
    assert not test_hashes & set(record_hashes(kept_images))
    assert demo.VALIDATION_KEY != demo.HOLDOUT_KEY


def test_make_demo_requires_the_private_contribution_by_default() -> None:
    """Issue 18, item 7: ``make demo`` (no arguments) exits 1 below two standard errors; the
    validated design is its default (release at epsilon 4, 1,500 warm-up steps, DP-SGD at 2);
    ``--quick`` (never validated for the check) and the explicit opt-out only report it."""
    demo = _demo_module()
    args = demo.parse_args([])
    assert args.require_private_contribution is True
    assert (args.central_epsilon, args.central_warmup_steps, args.target_epsilon) == (4.0, 1500,
                                                                                     2.0)
    assert demo.parse_args(["--quick"]).require_private_contribution is False
    assert demo.parse_args(["--quick", "--require-private-contribution"]) \
        .require_private_contribution is True
    assert demo.parse_args(["--no-require-private-contribution"]) \
        .require_private_contribution is False


def test_the_demo_fails_below_two_standard_errors_only_when_required() -> None:
    """``make demo``'s exit status: a summary whose private contribution is under two
    standard errors fails it when the check is required (the default) and passes otherwise;
    the ledger and twice-chance checks fail it either way."""
    demo = _demo_module()
    summary = {"ledger_verified": True, "classifier_accuracy": 0.6,
               "private_contribution": private_contribution(0.439, 0.554, n_test=278,
                                                            epsilon=5.59)}
    assert demo.failure_of(summary, require_private_contribution=True) is None  # +2.7 SE
    summary["private_contribution"] = private_contribution(0.439, 0.500, n_test=278,
                                                           epsilon=5.59)  # +1.5 SE
    failure = demo.failure_of(summary, require_private_contribution=True)
    assert failure and "not above the public-only one" in failure
    assert demo.failure_of(summary, require_private_contribution=False) is None
    for broken in ({"ledger_verified": False}, {"classifier_accuracy": 0.19}):
        assert demo.failure_of({**summary, **broken}, require_private_contribution=False)
