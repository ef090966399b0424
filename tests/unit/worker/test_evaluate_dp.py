"""Selection with evaluations (issue 13, item 6): the evaluate runner's selection caveat and
its DP release, with fake ports and a real local store.

* a non-DP report on private data states the selection caveat (JSON and page);
* an evaluate job with ``dp`` counts each synthetic-trained classifier's correct answers on
  EVERY held-out record, asks the ledger to charge the held-out partition, and only then
  noises the counts and normalises them by the PUBLIC held-out size of the api's plan; the
  released numbers go into the job result (readers) labelled DP; a refusal releases nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from dpsynth_ml import holdout_correct_counts, release_accuracies
from dpsynth_ml.evaluation.classifiers import Classifier
from dpsynth_ml.evaluation.corpus import EvaluationResult
from dpsynth_shared.dp_events import GaussianEvent
from dpsynth_shared.errors import BudgetExhausted
from dpsynth_shared.evaluation import SELECTION_CAVEAT
from dpsynth_shared.job_specs import EvaluateSpec, public_holdout_size
from dpsynth_shared.release_contract import DpEvaluationRelease, DpEvaluationRequest
from dpsynth_worker.runners import Outcome

from tests.unit.worker.conftest import CLASS_NAMES, World
from tests.unit.worker.fakes import MetricsCore
from tests.unit.worker.test_evaluate_runner import (
    EvalLedger,
    FakeMetrics,
    _digits,
    _evaluate_claim,
    _report,
)

HOLDOUT_PUBLIC = 12  # the api's N̂_h; the test's held-out part has 10 records
CONSTANT_CLASS = 3


@dataclass
class DpLedger(EvalLedger):
    """Evaluation grants plus DP releases (σ tiny so the released value is checkable)."""

    sigma: float = 1e-9
    refuse: bool = False
    releases: list[DpEvaluationRequest] = field(default_factory=list)

    def dp_evaluation_release(self, evaluation_id: str,
                              request: DpEvaluationRequest) -> DpEvaluationRelease:
        self.calls.append(("dp_evaluation_release", {"evaluation_id": evaluation_id}))
        self.releases.append(request)
        if self.refuse:
            raise BudgetExhausted("the held-out partition is spent", epsilon_limit=1.0)
        return DpEvaluationRelease(
            release_id="rel_1", evaluation_id=evaluation_id, dataset_id="ds_budget",
            job_id=request.job_id, event=GaussianEvent(sigma=self.sigma, sensitivity=1.0),
            metrics=request.metrics, holdout_size=request.holdout_size,
            target_epsilon=request.target_epsilon, epsilon=request.target_epsilon, delta=1e-5,
            admission_order=8, rdp_charge=0.1, partition="*holdout",
            dataset_epsilon_spent_before=0.0, dataset_epsilon_spent_after=1.0,
            admissible=True, charged=True, accountant="pld")


@pytest.fixture()
def ledger() -> DpLedger:
    return DpLedger()


def constant_classifier(label: int) -> Classifier:
    """A logistic regression on 8x8 grey images that always answers ``label``."""
    model = Classifier("logreg", image_size=8, channels=1, num_classes=len(CLASS_NAMES))
    linear = model.net[1]
    with torch.no_grad():
        linear.weight.zero_()
        linear.bias.zero_()
        linear.bias[label] = 1.0
    return model.eval()


@dataclass
class DpMetrics(FakeMetrics):
    """The fake metrics plus a synthetic-trained classifier the DP release counts with."""

    def __call__(self, *args: Any, **kwargs: Any) -> EvaluationResult:
        result = super().__call__(*args, **kwargs)
        result.classifiers = {"logreg": constant_classifier(CONSTANT_CLASS)}
        return result


def _dp_claim(world: World, **extra: Any) -> Any:
    plan = {"target_epsilon": 1.0, "metrics": ["tstr_accuracy/logreg"],
            "holdout_size": HOLDOUT_PUBLIC, "budget_id": "ds_budget"}
    extra.setdefault("dp_evaluation", plan)
    return _evaluate_claim(world, spec_extra={"classifiers": ["logreg"],
                                              "dp": {"target_epsilon": 1.0}}, **extra)


def test_a_private_report_states_the_selection_caveat(world: World) -> None:
    claim = _evaluate_claim(world)
    assert world.run(claim, ml=MetricsCore(metrics=FakeMetrics())) == Outcome.SUCCEEDED
    doc = json.loads(_report(world, "json"))
    assert doc["selection_caveat"] == SELECTION_CAVEAT
    assert "does not cover that choice" in doc["selection_caveat"]
    html = _report(world, "html").decode()
    assert "NON-DP SELECTION" in html and "does not cover that choice" in html


def test_a_public_report_has_no_caveat(world: World) -> None:
    claim = _evaluate_claim(world, visibility="public")
    assert world.run(claim, ml=MetricsCore(metrics=FakeMetrics())) == Outcome.SUCCEEDED
    assert json.loads(_report(world, "json")).get("selection_caveat") is None


def test_a_dp_evaluation_is_charged_then_noised_and_shown_to_readers(
        world: World, ledger: DpLedger) -> None:
    claim = _dp_claim(world)
    assert world.run(claim, ml=MetricsCore(metrics=DpMetrics())) == Outcome.SUCCEEDED
    # the read grant, then the charge (the noise is drawn after it returns)
    assert ledger.names() == ["evaluation_grant", "dp_evaluation_release"]
    (request,) = ledger.releases
    assert request.metrics == ["tstr_accuracy/logreg"] and request.target_epsilon == 1.0
    assert request.holdout_size == HOLDOUT_PUBLIC  # the public N̂_h, not the true 10
    assert request.job_id == world.job_id and request.attempt == 1
    # the count is over EVERY held-out record: the constant classifier is right on its class
    _, labels = _digits(world)
    correct = int((labels[40:] == CONSTANT_CLASS).sum())
    final = world.api.final
    dp = final.result["dp_evaluation"]
    assert dp["label"] == "DP" and dp["partition"] == "*holdout"
    assert dp["holdout_size"] == HOLDOUT_PUBLIC and dp["sigma"] == ledger.sigma
    assert dp["epsilon"] == 1.0 and dp["release_id"] == "rel_1"
    released = dp["metrics"]["tstr_accuracy/logreg"]
    assert released["accuracy"] == pytest.approx(correct / HOLDOUT_PUBLIC, abs=1e-6)
    # the non-DP report stays owner-only; the DP block is in it too, labelled
    assert all(a.owner_only and a.non_dp for a in world.api.of_kind("report"))
    doc = json.loads(_report(world, "json"))
    assert doc["dp_evaluation"] == dp and doc["non_dp"] is True
    html = _report(world, "html").decode()
    assert "DP evaluation (inside the guarantee)" in html and "N̂_h" in html


def test_a_refused_dp_evaluation_releases_nothing(world: World, ledger: DpLedger) -> None:
    ledger.refuse = True
    claim = _dp_claim(world)
    assert world.run(claim, ml=MetricsCore(metrics=DpMetrics())) == Outcome.FAILED
    final = world.api.final
    assert final.error_code == "privacy_budget_exhausted"
    assert not final.result or "dp_evaluation" not in final.result
    assert world.api.of_kind("report") == []


def test_a_dp_claim_without_the_apis_plan_is_refused(world: World) -> None:
    claim = _dp_claim(world, dp_evaluation=None)
    assert world.run(claim, ml=MetricsCore(metrics=DpMetrics())) == Outcome.FAILED
    assert world.api.final.error_code == "invalid_spec"


def test_counts_cover_every_held_out_record_and_noise_is_gaussian() -> None:
    images = np.zeros((1300, 8, 8, 1), dtype=np.uint8)  # more than one batch of 512
    labels = np.arange(1300) % len(CLASS_NAMES)
    counts = holdout_correct_counts({"logreg": constant_classifier(2)}, images, labels)
    assert counts == {"logreg": int((labels == 2).sum())}
    rng = np.random.default_rng(0)
    draws = [release_accuracies([50], sigma=4.0, holdout_size=100, rng=rng)[0]["accuracy"]
             for _ in range(4000)]
    # (50 + N(0, 16)) / 100: mean 0.5, std 0.04
    assert np.mean(draws) == pytest.approx(0.5, abs=0.004)
    assert np.std(draws) == pytest.approx(0.04, rel=0.05)
    clipped = release_accuracies([0], sigma=50.0, holdout_size=10, rng=rng)[0]
    assert 0.0 <= clipped["accuracy_clipped"] <= 1.0


def test_the_spec_and_the_public_held_out_size() -> None:
    spec = EvaluateSpec.model_validate({"corpus_artifact_id": "a", "dataset_id": "d",
                                        "dp": {"target_epsilon": 0.5}})
    assert spec.dp is not None and spec.dp.target_epsilon == 0.5
    with pytest.raises(ValueError):
        EvaluateSpec.model_validate({"corpus_artifact_id": "a", "dataset_id": "d",
                                     "dp": {"target_epsilon": 0}})
    # N̂ counts the training part: N̂_h = N̂ · f / (1 − f), from public values only
    assert public_holdout_size(declared_size=800, holdout_fraction=0.2) == 200
    assert public_holdout_size(declared_size=1, holdout_fraction=0.01) == 1
