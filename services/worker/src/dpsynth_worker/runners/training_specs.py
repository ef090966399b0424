"""The one mapping from a job's typed spec (``dpsynth_shared.job_specs``) to the ML core's
training spec: a ``PretrainTraining`` from its public dataset, a ``FinetuneTraining`` from
its base model's shape and its reservation's DP parameters, handed over verbatim (never
recomputed here, so what runs is exactly what the ledger accounted). A finetune's privacy is
always one of the core's DP variants: nothing here can turn DP off."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpsynth_shared.dp_events import DpSgdEvent
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.job_specs import FinetuneSpec, PretrainSpec
from dpsynth_shared.ledger_contract import Reservation
from dpsynth_shared.release_contract import CentralImagesRelease
from dpsynth_shared.worker_contract import DatasetInfo

if TYPE_CHECKING:
    from dpsynth_ml import (
        CentralImages,
        DpSpec,
        FinetuneTraining,
        ModelInfo,
        PretrainTraining,
        RecordLevel,
        SubjectLevel,
    )


def pretrain_training_spec(spec: PretrainSpec, dataset: DatasetInfo | None) -> PretrainTraining:
    """A pretrain's spec: the job's shape over the public dataset's classes (an
    ``initialise_only`` job: over its own ``class_names``, no dataset), in the job's space
    (``latent``: autoencoder + latent UNet; ``pixel``: a UNet on the pixels, no
    autoencoder). Finetunes and generation read the space from the base model's info."""
    from dpsynth_ml import Architecture, PretrainTraining

    names = dataset.class_names if dataset is not None else (spec.class_names or [])

    arch = spec.architecture
    return PretrainTraining(preset=spec.preset, space=spec.space, image_size=spec.image_size,
                            architecture=Architecture(unet_class=arch.unet_class,
                                                      unet=dict(arch.unet), vae=dict(arch.vae))
                            if arch is not None else None,
                            layout_conditioning=spec.layout_conditioning, target=spec.target,
                            channels=spec.channels, class_conditional=spec.class_conditional,
                            num_classes=len(names),
                            learning_rate=spec.learning_rate, epochs=spec.epochs,
                            batch_size=spec.batch_size, label_dropout=spec.label_dropout,
                            timestep_distribution=spec.timestep_distribution, seed=spec.seed)


def finetune_training_spec(spec: FinetuneSpec, *, reservation: Reservation,
                           dataset: DatasetInfo, base: ModelInfo,
                           central: CentralImagesRelease | None = None) -> FinetuneTraining:
    """A finetune's spec: shape from the base model, DP parameters from the reservation,
    and the central-image release (``training.central_images``) as the ledger calibrated it
    (``central``: its dry run; noise and bound verbatim).

    Raises:
        DpsynthError: ``invalid_spec`` when the reservation does not match the job (a
            per-label reservation for a whole-dataset job or the reverse), the class map
            does not cover the dataset's classes, or a central-image release was asked for
            without the ledger's calibration.
    """
    from dpsynth_ml import DpSpec, FinetuneTraining, PerLabel

    t, event = spec.training, reservation.event
    class_map, num_classes = None, len(dataset.class_names)
    if t.class_map is not None:
        class_map = map_classes(dataset.class_names, list(base.class_names), t.class_map)
        num_classes = base.num_classes
    privacy: RecordLevel | SubjectLevel | PerLabel
    if t.per_label:
        privacy = PerLabel({name: unit_privacy(spec, dataset, dp) for name, dp in
                            per_label_dp(spec, reservation=reservation,
                                         dataset=dataset).items()})
    elif not isinstance(event, DpSgdEvent) or reservation.expected_batch_size is None:
        raise DpsynthError(ErrorCode.INVALID_SPEC, "a per-label reservation needs "
                           "training.per_label")
    else:
        privacy = unit_privacy(spec, dataset, DpSpec(
            noise_multiplier=event.noise_multiplier, sample_rate=event.sample_rate,
            expected_batch_size=reservation.expected_batch_size,
            max_grad_norm=spec.privacy.max_grad_norm, steps=planned_steps(reservation),
            **padding_terms(spec, reservation=reservation, dataset=dataset)))
    return FinetuneTraining(image_size=base.image_size, channels=base.channels,
                            class_conditional=t.class_conditional, num_classes=num_classes,
                            trainable=t.trainable,
                            blocks=tuple(t.blocks) if t.blocks else None,
                            lora_rank=t.lora_rank, lora_alpha=t.lora_alpha,
                            train_embedder=t.train_embedder,
                            noise_multiplicity=t.noise_multiplicity, ema_decay=t.ema_decay,
                            warmup_steps=t.warmup_steps,
                            learning_rate=t.learning_rate, label_dropout=t.label_dropout,
                            timestep_distribution=t.timestep_distribution,
                            max_physical_batch_size=t.max_physical_batch_size,
                            class_map=class_map, checkpoint_every=t.checkpoint_every,
                            target=t.target, privacy=privacy,
                            central_images=central_images_of(spec, central, dataset))


def central_images_of(spec: FinetuneSpec, central: CentralImagesRelease | None,
                      dataset: DatasetInfo) -> CentralImages | None:
    """The ML core's central-image release, or None when the job asks for none."""
    from dpsynth_worker.runners.central_images import ml_central_images

    asked = spec.training.central_images
    if asked is None:
        return None
    if central is None:
        raise DpsynthError(ErrorCode.INVALID_SPEC, "training.central_images needs the ledger's "
                           "calibration of the release")
    return ml_central_images(asked, central, dataset)


def unit_privacy(spec: FinetuneSpec, dataset: DatasetInfo,
                 dp: DpSpec) -> RecordLevel | SubjectLevel:
    """DP-SGD over the dataset's unit (from its row, via the claim): ``SubjectLevel``
    (user-level; q and the batch size then count subjects) or ``RecordLevel`` (images)."""
    from dpsynth_ml import RecordLevel, SubjectLevel

    if dataset.privacy_unit == "subject":
        return SubjectLevel(dp, max_images_per_subject=spec.training.max_images_per_subject)
    return RecordLevel(dp)


def planned_steps(reservation: Reservation) -> int:
    """The job's training length as planned at admission (stable across extensions)."""
    if reservation.steps_planned is not None:
        return reservation.steps_planned
    event = reservation.plan.event if reservation.plan else reservation.event
    if not isinstance(event, DpSgdEvent):
        raise DpsynthError(ErrorCode.INVALID_SPEC, "a per-label reservation has no single "
                           "training length; see its per-class runs")
    return event.steps


def per_label_dp(spec: FinetuneSpec, *, reservation: Reservation,
                 dataset: DatasetInfo) -> dict[str, DpSpec]:
    """Each class's DpSpec, verbatim from the reservation's per-class runs.

    σ_c, q_c = batch_c / N̂_c and the expected batch size are the ledger's (never recomputed
    here); the length is the class's steps as planned at admission (stable across
    extensions, like :func:`planned_steps`).

    Raises:
        DpsynthError: ``invalid_spec`` when the reservation is not per-label or does not run
            exactly the dataset's classes.
    """
    from dpsynth_ml import DpSpec

    parts = reservation.per_label
    if parts is None:
        raise DpsynthError(ErrorCode.INVALID_SPEC, "a per-label finetune needs a per-label "
                           "reservation")
    if set(parts) != set(dataset.class_names):
        raise DpsynthError(ErrorCode.INVALID_SPEC, "the per-label reservation does not run "
                           "exactly the dataset's classes")
    padding = padding_terms(spec, reservation=reservation, dataset=dataset)
    return {name: DpSpec(noise_multiplier=part.event.noise_multiplier,
                         sample_rate=part.event.sample_rate,
                         expected_batch_size=part.expected_batch_size,
                         max_grad_norm=spec.privacy.max_grad_norm,
                         steps=part.steps_planned, **padding)
            for name, part in sorted(parts.items())}


def padding_terms(spec: FinetuneSpec, *, reservation: Reservation,
                  dataset: DatasetInfo) -> dict[str, float | None]:
    """The (epsilon, delta) that size the fixed per-step work making every step cost the
    same (dpsynth_ml.dp.padding; docs/privacy.md, item 5). Both are public. epsilon is the
    larger of the job's target and the dataset's limit: the filter keeps every figure of the
    dataset at or below its limit, so the timing channel's (1 + e^ε)·η stays ≤ 1e-3·δ at the
    dataset's figure too, not only at the job's own."""
    plan = reservation.plan
    delta = dataset.delta if dataset.delta is not None else (
        plan.delta if plan is not None else None)
    epsilon = spec.privacy.target_epsilon
    limit = dataset.epsilon_limit
    if epsilon is not None and limit is not None:
        epsilon = max(epsilon, limit)
    return {"epsilon": epsilon, "delta": delta}


def map_classes(private_names: list[str], base_names: list[str],
                class_map: dict[str, str]) -> dict[int, int]:
    """Private class index -> base-model class index, from a name -> name map.

    Raises:
        DpsynthError: ``invalid_spec`` when a private class is unmapped or a target unknown.
    """
    unmapped = [n for n in private_names if n not in class_map]
    unknown = sorted({t for t in class_map.values() if t not in base_names})
    if unmapped or unknown:
        raise DpsynthError(ErrorCode.INVALID_SPEC, "class_map must map every dataset class to "
                           "a base-model class", unmapped=unmapped, unknown_targets=unknown)
    return {i: base_names.index(class_map[n]) for i, n in enumerate(private_names)}
