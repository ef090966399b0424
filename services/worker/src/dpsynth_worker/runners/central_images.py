"""A finetune's DP central-image release (DP-FETA warm-up) between the worker and the ledger.

Before training, the worker asks the ledger to CALIBRATE the release (a dry run: the noise
std for the release's target epsilon at the dataset's δ, and the public bound from the base
model's image shape; nothing is charged) and hands both to the ML core verbatim. The ML core
calls :meth:`~dpsynth_worker.runners.hooks.LeasedHooks.charge_release` right before it draws
the noise; only then is the release charged (:func:`charge`), and the charged answer must be
the calibrated one exactly, or nothing is released. A release restored from a checkpoint is
public already and is never charged again. The model's epsilon composes every release the
ledger charged under the job's reservation (docs/privacy.md, "Central images").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpsynth_shared.central_images import CentralImagesSpec
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.release_contract import CentralImagesRelease, CentralImagesRequest
from dpsynth_shared.worker_contract import DatasetInfo

if TYPE_CHECKING:
    from dpsynth_ml import CentralImages, ModelInfo

    from dpsynth_worker.runners.context import JobContext


def release_request(ctx: JobContext, central: CentralImagesSpec, info: ModelInfo, *,
                    dry_run: bool) -> CentralImagesRequest:
    """The ledger request for ``central`` on a base model of ``info``'s image shape."""
    return CentralImagesRequest(
        job_id=ctx.job_id, attempt=ctx.attempt, target_epsilon=central.target_epsilon,
        image_size=info.image_size, channels=info.channels, downsample=central.downsample,
        sample_rate=central.sample_rate, queries=central.queries,
        second_moments=central.second_moments, dry_run=dry_run)


def calibrate(ctx: JobContext, reservation_id: str, central: CentralImagesSpec,
              info: ModelInfo) -> CentralImagesRelease:
    """The ledger's calibration of the release (a dry run: nothing charged).

    Raises:
        DpsynthError: the ledger's refusal (``privacy_budget_exhausted`` when even now the
            release would not fit: the job fails before any private data is read).
    """
    plan = ctx.ledger.central_images_release(
        reservation_id, release_request(ctx, central, info, dry_run=True))
    if not plan.admissible:
        raise DpsynthError(ErrorCode.PRIVACY_BUDGET_EXHAUSTED,
                           "the central-image release would not fit the dataset's remaining "
                           "budget on top of this job's DP-SGD reservation",
                           epsilon=plan.epsilon,
                           dataset_epsilon_spent_after=plan.dataset_epsilon_spent_after)
    return plan


def charge(ctx: JobContext, reservation_id: str, request: CentralImagesRequest,
           planned: CentralImagesRelease) -> CentralImagesRelease:
    """Charge the release; it must be exactly the calibrated one (same noise, same bound).

    Raises:
        DpsynthError: the ledger's refusal, or ``invalid_spec`` (not retried) when the
            charged release differs from the planned one (nothing is released then; the
            charge stands).
    """
    charged = ctx.ledger.central_images_release(
        reservation_id, request.model_copy(update={"dry_run": False}))
    if (not charged.charged or charged.noise_std != planned.noise_std
            or charged.bound != planned.bound
            or charged.second_moments != planned.second_moments):
        raise DpsynthError(ErrorCode.INVALID_SPEC,
                           "the ledger charged a central-image release other than the one "
                           "calibrated for this job; nothing was released")
    return charged


def ml_central_images(central: CentralImagesSpec, plan: CentralImagesRelease,
                      dataset: DatasetInfo) -> CentralImages:
    """The ML core's release spec: the ledger's noise and bound verbatim, the dataset's
    public class sizes N̂_c.

    Raises:
        DpsynthError: ``invalid_spec`` when the dataset declares no size for a class.
    """
    from dpsynth_ml import CentralImages

    sizes = dataset.class_sizes or {}
    missing = [name for name in dataset.class_names if int(sizes.get(name, 0)) < 1]
    if missing:
        raise DpsynthError(ErrorCode.INVALID_SPEC, "training.central_images needs a public "
                           "class size for every class of the dataset", classes=missing)
    return CentralImages(
        noise_std=plan.noise_std, bound=plan.bound,
        class_sizes={name: int(sizes[name]) for name in dataset.class_names},
        downsample=central.downsample, sample_rate=central.sample_rate,
        queries=central.queries, warmup_steps=central.warmup_steps,
        warmup_batch_size=central.warmup_batch_size,
        warmup_learning_rate=central.warmup_learning_rate,
        warmup_ema_decay=central.warmup_ema_decay, augment=central.augment,
        second_moments=plan.second_moments, components=central.components)
