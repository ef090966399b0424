"""The DP release of an evaluate job with ``dp`` (issue 13, item 6; docs/privacy.md "DP
evaluations: selection inside the guarantee").

Order of events, each after the one before:

1. the ML core has trained each classifier on the SYNTHETIC corpus alone;
2. each classifier's correct answers are counted over EVERY held-out record (private, never
   logged or stored);
3. the ledger calibrates σ for sensitivity √m and commits the charge to the budget's
   held-out partition (a refusal fails the job: nothing is released);
4. only then is the noise drawn, from OS entropy (``secrets``; no spec, API or setting
   reaches the generator), and (count + N(0, σ²)) / N̂_h released, N̂_h the PUBLIC held-out
   size of the api's plan (never the true count).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.job_specs import EvaluateSpec
from dpsynth_shared.release_contract import DpEvaluationRequest
from dpsynth_shared.secure_noise import NormalSource, SecureNormal

from dpsynth_worker.runners.context import JobContext

if TYPE_CHECKING:
    from dpsynth_ml import EvaluationResult, ImageDataset

STATEMENT = (
    "released with differential privacy: each number is (correct held-out count + Gaussian "
    "noise) / N̂_h, N̂_h a public size; charged to the dataset's held-out partition (parallel "
    "to training); selecting a corpus by these numbers stays inside the guarantee")


def os_generator() -> SecureNormal:
    """The OS CSPRNG's Gaussians (sum-of-four mitigation), drawn after the ledger's charge."""
    return SecureNormal()


def release_dp(ctx: JobContext, spec: EvaluateSpec, result: EvaluationResult,
               holdout: ImageDataset,
               rng: NormalSource | None = None) -> dict[str, object]:
    """Count, charge, noise and return the DP block (report and job result).

    ``rng`` is for tests only (runners pass None: OS entropy).

    Raises:
        EvaluationInputError: a claim without the api's DP plan or evaluation id; the
            ledger's refusal (``privacy_budget_exhausted``, with its numbers: they are the
            budget's, not the data's).
    """
    from dpsynth_worker.runners.evaluate import EvaluationInputError  # (no import cycle)

    assert spec.dp is not None
    plan = ctx.claim.dp_evaluation
    kinds = list(spec.classifiers)
    metrics = [f"tstr_accuracy/{k}" for k in kinds]
    if plan is None or ctx.claim.evaluation_id is None:
        raise EvaluationInputError(ErrorCode.INVALID_SPEC, "a DP evaluation needs the api's "
                                   "DP plan and the ledger's evaluation authorisation in its "
                                   "claim")
    if list(plan.get("metrics") or []) != metrics:
        raise EvaluationInputError(ErrorCode.INVALID_SPEC, "the claim's DP plan is not the "
                                   "spec's")
    counts = ctx.ml.holdout_correct_counts({k: result.classifiers[k] for k in kinds},
                                           holdout.images, holdout.labels)
    ctx.heartbeat.phase("releasing DP evaluation")
    try:
        release = ctx.ledger.dp_evaluation_release(ctx.claim.evaluation_id, DpEvaluationRequest(
            job_id=ctx.job_id, attempt=ctx.attempt, target_epsilon=spec.dp.target_epsilon,
            metrics=metrics, holdout_size=int(plan["holdout_size"])))
    except DpsynthError as exc:  # the budget's numbers, nothing about the data
        raise EvaluationInputError(exc.code, exc.detail, **exc.extensions) from exc
    values = ctx.ml.release_accuracies([counts[k] for k in kinds], sigma=release.event.sigma,
                                       holdout_size=release.holdout_size,
                                       rng=rng if rng is not None else os_generator())
    del counts
    return {
        "label": "DP", "metrics": dict(zip(metrics, values, strict=True)),
        "epsilon": release.epsilon, "target_epsilon": release.target_epsilon,
        "delta": release.delta, "sigma": release.event.sigma,
        "sensitivity": release.event.sensitivity, "holdout_size": release.holdout_size,
        "partition": release.partition, "budget_id": release.dataset_id,
        "release_id": release.release_id, "rdp_charge": release.rdp_charge,
        "admission_order": release.admission_order, "accountant": release.accountant,
        "statement": STATEMENT,
    }
