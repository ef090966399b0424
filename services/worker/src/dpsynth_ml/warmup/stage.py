"""The central-images stage of a finetune: release (or reuse) the images, then warm up.

Called by :func:`dpsynth_ml.training.finetune.setup.prepare` after the base model is loaded
and its trainable set selected, before DP-SGD's optimizer, engine and EMA are built, so
DP-SGD starts from the warmed-up weights.

* Fresh run: :func:`~dpsynth_ml.warmup.release.release_central_images` (charged through
  :meth:`TrainingHooks.charge_release` before its noise is drawn), the release written to
  ``out_dir/central_images.npz`` BEFORE the warm-up trains, then the warm-up. If that file
  already exists under the same settings (an attempt that failed before its first
  checkpoint, in the same ``out_dir``), it is reused: no charge, no new release, the
  warm-up runs again from the saved images.
* Resume from a checkpoint: every checkpoint carries ``central_images.npz``; it is read
  back (and copied to ``out_dir``) with NO charge and NO release, and the warm-up is NOT run
  again: the checkpoint's weights are already the warmed-up weights after DP steps.
* W ranks: rank 0 alone releases (its hooks charge) and warms up, then tells the other
  ranks whether it succeeded (they fail with it otherwise); the distributed DP engine,
  built next on every rank, broadcasts rank 0's parameters and buffers at construction
  (:class:`dpsynth_ml.dp.distributed.DistributedDpSgdEngine`), so every rank starts DP-SGD
  from rank 0's warmed-up weights. The other ranks never draw anything.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import torch
from dpsynth_shared.secure_noise import SecureNormal

from dpsynth_ml.data import ImageDataset
from dpsynth_ml.models.architectures import ConditionalDenoiser, ModelBundle
from dpsynth_ml.parallel.distributed import Placement, broadcast_flag
from dpsynth_ml.spec import CentralImages, FinetuneRecipe, InvalidSpecError, ModelInfo
from dpsynth_ml.training.hooks import TrainingHooks
from dpsynth_ml.warmup.moments import NormalDraws
from dpsynth_ml.warmup.release import CentralRelease, UniformSource, release_central_images
from dpsynth_ml.warmup.store import RELEASE_FILE, load_release, public_record, save_release
from dpsynth_ml.warmup.train import warm_up


def class_index(spec: FinetuneRecipe, num_private: int) -> list[int]:
    """The model class of each dataset class (as the finetune maps its labels)."""
    if not spec.class_conditional:
        return [spec.num_classes] * num_private  # the null class
    if spec.class_map is None:
        return list(range(num_private))
    return [int(spec.class_map[i]) for i in range(num_private)]


def _sources(test_generator: torch.Generator | None,
             ) -> tuple[NormalDraws, UniformSource | None]:
    """Production: the OS CSPRNG for noise and sampling. A test that injected this attempt's
    generator: a numpy generator seeded from it (the run is stamped ``rng: test``)."""
    if test_generator is None:
        return SecureNormal(), None
    seed = int(torch.randint(0, 2**62, (1,), generator=test_generator))
    numpy_rng = np.random.default_rng(seed)
    return numpy_rng, numpy_rng.random


def central_images_stage(spec: FinetuneRecipe, *, dataset: ImageDataset, bundle: ModelBundle,
                         info: ModelInfo, denoiser: ConditionalDenoiser, out_dir: Path,
                         resume_from: Path | None, hooks: TrainingHooks,
                         generator: torch.Generator, test_generator: torch.Generator | None,
                         train_embedder: bool, placement: Placement | None = None,
                         ) -> ModelInfo:
    """Release (or reuse) the central images and warm ``denoiser`` up; see the module.

    Returns:
        ``info`` with ``extra["central_images"]`` (public settings and ``n_released``).

    Raises:
        InvalidSpecError: a resume from a checkpoint without the release, or a saved release
            made under other settings.
    """
    settings = spec.central_images
    if settings is None:
        return info
    placement = placement if placement is not None else Placement()
    out_dir = Path(out_dir)
    if bundle.layout_channels:
        raise InvalidSpecError("central_images cannot warm up a layout-conditioned model "
                               "(the released class means carry no layout masks)")
    if resume_from is not None:
        saved = Path(resume_from) / RELEASE_FILE
        if not saved.is_file():
            raise InvalidSpecError("the checkpoint has no central_images.npz: a run with "
                                   "central_images resumes only from its own checkpoints")
        release = load_release(saved, settings)  # public: no charge, no release, no warm-up
        if placement.is_main and saved.resolve() != (out_dir / RELEASE_FILE).resolve():
            shutil.copyfile(saved, out_dir / RELEASE_FILE)
        return _stamp(info, settings, len(release.labels))
    if placement.is_main:
        try:
            release = _release_or_reuse(spec, dataset, info, out_dir, hooks, test_generator)
            warm_up(denoiser, bundle, info, release, torch.from_numpy(release.labels),
                    settings, train_embedder=train_embedder, label_dropout=spec.label_dropout,
                    device=placement.device, generator=generator,
                    timesteps=spec.timestep_distribution)
        except BaseException:
            broadcast_flag(placement, False)  # the other ranks stop too (collective)
            raise
        broadcast_flag(placement, True)
    elif not broadcast_flag(placement, False):  # rank 0's outcome
        raise RuntimeError("rank 0 failed to release the central images or to warm up")
    return _stamp(info, settings, settings.queries * len(dataset.class_names))


def _release_or_reuse(spec: FinetuneRecipe, dataset: ImageDataset, info: ModelInfo,
                      out_dir: Path, hooks: TrainingHooks,
                      test_generator: torch.Generator | None) -> CentralRelease:
    settings = spec.central_images
    assert settings is not None
    path = out_dir / RELEASE_FILE
    if path.is_file():  # released by an earlier attempt in this out_dir: public, reused
        return load_release(path, settings)
    normal_source, uniform_source = _sources(test_generator)
    release = release_central_images(
        dataset, settings, class_index=class_index(spec, len(dataset.class_names)),
        normal_source=normal_source, hooks=hooks, image_size=info.image_size,
        channels=info.channels, uniform_source=uniform_source)
    save_release(path, release, settings)  # before the warm-up trains
    return release


def _stamp(info: ModelInfo, settings: CentralImages, n_released: int) -> ModelInfo:
    """``info`` with ``extra["central_images"]``: the public settings and ``n_released``."""
    return dataclasses.replace(info, extra={**info.extra, "central_images": public_record(
        settings, n_released)})
