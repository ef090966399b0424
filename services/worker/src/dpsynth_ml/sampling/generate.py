"""Sampling from a model directory: DDPM, DDIM or DPM-Solver++ with classifier-free guidance.

Generation is post-processing of the DP model, so its seed may be recorded and reused.

Reproducibility: every image has its own random generator, seeded from (seed, class index,
image index) through :class:`numpy.random.SeedSequence`, which draws its initial latent and
(for DDPM) its per-step noise. An image therefore depends on the seed, its class and its
index, never on ``batch_size`` or on which other classes are generated (up to the float
round-off of batched kernels). ``device`` (default "cpu") holds the model and these
generators: a GPU corpus has the same reproducibility on GPUs, but is not the CPU corpus (a
CUDA generator's stream differs), and :attr:`SampleResult.device` says which it was.

Samplers (``diffusers`` schedulers built from the model's own scheduler config):

* ``ddpm``: ancestral sampling (Ho et al. 2020), ``set_timesteps(steps)``.
* ``ddim``: deterministic DDIM (Song et al. 2021, eta = 0).
* ``dpm_solver++``: multistep DPM-Solver++ (Lu et al. 2022, second order, lower order at
  the final steps), good at 10-25 steps; its timesteps start at t = T ("linspace").

Per-label bundles (DP-DocLDM's best setting): each class has its own denoiser, DP-trained
on that class's records only, and is drawn from it. These denoisers are unconditional (they
were trained with every label set to the null class, ``dpsynth_ml.training.per_label``), so a
class is always sampled through the null-label path, and classifier-free guidance does not
apply: for such models ``guidance_scale`` is ignored (the corpus manifest says
``guidance_applied: false``). By default every class the bundle has a denoiser for is drawn.

Layouts (DP-DocLDM layout conditioning): a layout-conditioned model needs one mask per
image. Masks come from a :class:`LayoutSet` (a PUBLIC source: the caller is responsible for
that), are drawn with the generation seed, encoded by the model's own VAE (a pixel-space
model takes them as pixels) and passed to the denoiser as ``layout=``. The indices used are
returned in :attr:`SampleResult.layouts`.

The denoising itself (model loading, random streams, samplers, the guided loop) is in
:mod:`dpsynth_ml.sampling.denoise`.

Layout generators: a model trained with ``target: masks`` (``extra.target``) draws masks
instead of images. :func:`sample_layouts` samples them per class (with the generation seed,
on a random stream of its own, so a mask's noise is independent of the image it conditions)
and binarises them at 127.5 into a :class:`LayoutSet`. When the generator was DP-trained on
a private dataset's masks, its masks are post-processing of a DP release: free.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from dpsynth_ml.data import load_dataset
from dpsynth_ml.models.architectures import ConditionalDenoiser, ModelBundle, encode_layouts

# the denoising core lives in its own module; its names are re-exported for existing callers
from dpsynth_ml.sampling.denoise import _LAYOUT_STREAM, _SEED_MASK, _check_sampler, _is_per_label
from dpsynth_ml.sampling.denoise import _generate as _generate
from dpsynth_ml.sampling.denoise import _image_generator as _image_generator
from dpsynth_ml.sampling.denoise import _layout_model_generator as _layout_model_generator
from dpsynth_ml.sampling.denoise import _load as _load
from dpsynth_ml.sampling.denoise import make_scheduler as make_scheduler
from dpsynth_ml.spec import InvalidSpecError, ModelInfo, SampleResult, SamplerKind

#: Default number of images denoised together.
DEFAULT_BATCH_SIZE = 64

#: Binarisation threshold of generated masks (uint8 gray levels; above = text line, 255).
MASK_THRESHOLD = 127.5


@dataclass(frozen=True)
class LayoutSet:
    """Public layout masks to condition a layout-conditioned model on.

    Attributes:
        masks: uint8 [M, H, W, 1] (0 background, 255 text line).
        labels: optional int [M], indices into ``class_names``.
        class_names: the label domain of ``labels`` (matched to the model's by name).
        per_class: draw each class's masks from the masks of the class of the same name
            when there are any; otherwise (or when False) from all masks.
    """

    masks: np.ndarray
    labels: np.ndarray | None = None
    class_names: tuple[str, ...] | None = None
    per_class: bool = True

    def __post_init__(self) -> None:
        masks = self.masks
        if masks.dtype != np.uint8 or masks.ndim != 4 or masks.shape[-1] != 1:
            raise InvalidSpecError("layout masks must be uint8 [M, H, W, 1]")
        if masks.shape[0] < 1:
            raise InvalidSpecError("a layout set needs at least one mask")
        if (self.labels is None) != (self.class_names is None):
            raise InvalidSpecError("layout labels and class_names are given together")
        if self.labels is not None:
            labels = self.labels
            if labels.shape != (masks.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
                raise InvalidSpecError("layout labels must be integers [M], one per mask")
            if labels.min() < 0 or labels.max() >= len(self.class_names or ()):
                raise InvalidSpecError("layout labels must index class_names")

    def __len__(self) -> int:
        return int(self.masks.shape[0])

    def pool(self, class_name: str) -> np.ndarray:
        """Indices of the masks a class draws from (its own, or all of them)."""
        if self.per_class and self.labels is not None and self.class_names is not None \
                and class_name in self.class_names:
            own = np.flatnonzero(self.labels == self.class_names.index(class_name))
            if own.size:
                return own
        return np.arange(len(self), dtype=np.int64)


def load_layouts(path: Path, *, per_class: bool = True) -> LayoutSet:
    """The layout masks of a canonical dataset file (its images are not kept).

    Raises:
        InvalidSpecError: if the dataset carries no masks.
    """
    dataset = load_dataset(path)
    if dataset.masks is None:
        raise InvalidSpecError("the layout dataset carries no layout masks")
    return LayoutSet(masks=dataset.masks, labels=dataset.labels,
                     class_names=dataset.class_names, per_class=per_class)


def sample(model_dir: Path, *, samples_per_class: int, sampler: SamplerKind, steps: int,
           guidance_scale: float, seed: int, out_dir: Path,
           classes: Sequence[int] | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
           layouts: LayoutSet | None = None,
           progress: Callable[[int, int], None] | None = None,
           device: str | torch.device = "cpu") -> SampleResult:
    """Generate images per class and write ``out_dir/<class_name>/<i>.png``.

    Args:
        model_dir: a dpsynth model directory (a single model or a per-label bundle).
        samples_per_class: images per class.
        sampler: "ddpm" (ancestral), "ddim" (deterministic, eta=0) or "dpm_solver++".
        steps: number of denoising steps (``set_timesteps(steps)``).
        guidance_scale: w in eps = eps_uncond + w (eps_cond - eps_uncond); 1 = conditional
            only. Ignored for per-label bundles (see the module docstring).
        seed: seed of the generation noise and of the layout draws.
        out_dir: output root.
        classes: model class indices to generate (default: all; for a per-label bundle,
            all classes it has a denoiser for).
        batch_size: images denoised together (changes speed and memory, not the images).
        layouts: public layout masks; required by a layout-conditioned model and refused
            by any other.
        progress: called with (images done, images total) after each batch.
        device: where the model, the latents and the diffusion noise live ("cpu" by
            default, whose images are the same as ever; on "cuda:0" each image's generator
            is a CUDA one, so the images are reproducible on GPUs, not equal to the CPU's).

    Returns:
        Counts per class name, the device, images per second of sampling (layout encoding, denoising
        and decoding; not model loading or PNG writing) and, with layouts, the mask indices
        used per class (image i of a class was conditioned on mask ``layouts[name][i]``).

    Raises:
        InvalidSpecError: on bad counts, classes or sampler, or layouts missing for a
            layout-conditioned model or given to a model without layout conditioning.
    """
    if samples_per_class < 0 or steps < 1 or batch_size < 1:
        raise InvalidSpecError("samples_per_class must be >= 0, steps and batch_size >= 1")
    _check_sampler(sampler)
    place = torch.device(device)
    bundle, info, denoisers = _load(model_dir, place)
    wanted = sorted(denoisers) if classes is None else list(classes)
    if any(c not in denoisers for c in wanted):
        raise InvalidSpecError("classes must be model class indices (of a per-label bundle: "
                               "classes it has a denoiser for)")
    conditioned = _layout_channels(info) > 0
    if conditioned and layouts is None:
        raise InvalidSpecError("this model is layout-conditioned: sampling needs layouts")
    if not conditioned and layouts is not None:
        raise InvalidSpecError("this model has no layout conditioning: layouts are refused")
    run = _Run(bundle=bundle, info=info, sampler=sampler, steps=steps, seed=seed,
               guidance_scale=guidance_scale, batch_size=batch_size, layouts=layouts,
               total=samples_per_class * len(wanted), progress=progress, device=place)
    dirs = _class_dirs(info)
    counts: dict[str, int] = {}
    used: dict[str, tuple[int, ...]] = {}
    for cls in wanted:
        name = info.class_names[cls]
        picks = run.draw_class(denoisers[cls], cls, samples_per_class, Path(out_dir) / dirs[cls])
        counts[name] = samples_per_class
        if picks is not None:
            used[name] = tuple(int(i) for i in picks)
    rate = run.done / run.elapsed if run.done and run.elapsed > 0 else 0.0
    return SampleResult(out_dir=Path(out_dir), counts=counts, seed=seed,
                        images_per_second=rate, layouts=used, device=str(place))


def is_layout_generator(info: ModelInfo) -> bool:
    """Whether a model was trained on layout masks (``target: masks``)."""
    return info.extra.get("target") == "masks"


def sample_layouts(model_dir: Path, *, counts: Mapping[str, int], seed: int,
                   sampler: SamplerKind = "ddim", steps: int = 50, guidance_scale: float = 1.0,
                   batch_size: int = DEFAULT_BATCH_SIZE, per_class: bool = True,
                   progress: Callable[[int, int], None] | None = None,
                   device: str | torch.device = "cpu") -> LayoutSet:
    """Draw layout masks per class from a layout-generator model and binarise them.

    Args:
        model_dir: a model trained with ``target: masks``.
        counts: masks to draw per class name of the layout model.
        seed: the generation seed; mask j of class c depends on (seed, c, j) only, through
            a stream apart from the images' (a mask's noise never equals its image's).
        sampler: as for :func:`sample`.
        steps: denoising steps.
        guidance_scale: classifier-free guidance on the layout model's class.
        batch_size: masks denoised together (speed and memory only).
        per_class: the returned set's ``per_class`` (see :class:`LayoutSet`).
        progress: called with (masks done, masks total) after each batch.
        device: as for :func:`sample`.

    Returns:
        uint8 masks [M, H, W, 1] with values in {0, 255} (grayscale above
        :data:`MASK_THRESHOLD` = 255; a 3-channel generator's channels are averaged), their
        labels and the layout model's class names, in the order of ``counts``.

    Raises:
        InvalidSpecError: the model is not a layout generator, a class name is unknown, a
            count is negative or no mask is asked for.
    """
    if steps < 1 or batch_size < 1 or any(n < 0 for n in counts.values()):
        raise InvalidSpecError("counts must be >= 0, steps and batch_size >= 1")
    _check_sampler(sampler)
    place = torch.device(device)
    bundle, info, denoisers = _load(model_dir, place)
    if not is_layout_generator(info):
        raise InvalidSpecError("this model was not trained on layout masks (target 'masks')")
    unknown = sorted(n for n in counts if n not in info.class_names
                     or info.class_names.index(n) not in denoisers)
    if unknown:
        raise InvalidSpecError(f"classes the layout model cannot draw: {unknown}")
    total = sum(counts.values())
    if total < 1:
        raise InvalidSpecError("sample_layouts needs at least one mask")
    per_label = _is_per_label(info)
    masks: list[np.ndarray] = []
    labels: list[int] = []
    done = 0
    for name, n in counts.items():
        cls = info.class_names.index(name)
        for start in range(0, n, batch_size):
            size = min(batch_size, n - start)
            generators = [_layout_model_generator(seed, cls, start + i, place)
                          for i in range(size)]
            pixels = _generate(bundle, info, denoisers[cls],
                               info.null_class if per_label else cls, size, sampler=sampler,
                               steps=steps, generators=generators, layout=None,
                               guidance_scale=1.0 if per_label else guidance_scale)
            gray = pixels.astype(np.float32).mean(axis=-1, keepdims=True)
            masks.append(np.where(gray > MASK_THRESHOLD, 255, 0).astype(np.uint8))
            labels.extend([cls] * size)
            done += size
            if progress is not None:
                progress(done, total)
    return LayoutSet(masks=np.concatenate(masks), labels=np.asarray(labels, dtype=np.int64),
                     class_names=info.class_names, per_class=per_class)


@dataclass
class _Run:
    """One call of :func:`sample`: its settings and what it has done so far."""

    bundle: ModelBundle
    info: ModelInfo
    sampler: SamplerKind
    steps: int
    seed: int
    guidance_scale: float
    batch_size: int
    layouts: LayoutSet | None
    total: int
    progress: Callable[[int, int], None] | None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    done: int = 0
    elapsed: float = 0.0

    def draw_class(self, denoiser: ConditionalDenoiser, cls: int, n: int,
                   target: Path) -> np.ndarray | None:
        """Write ``n`` images of class ``cls`` to ``target``; return the layouts used."""
        info, layouts = self.info, self.layouts
        target.mkdir(parents=True, exist_ok=True)
        picks = (None if layouts is None
                 else _draw_layouts(layouts, info.class_names[cls], cls, n, self.seed))
        # A per-label denoiser is unconditional (trained with every label = the null
        # class): sampled with the null label and no guidance.
        per_label = _is_per_label(info)
        label = info.null_class if per_label else cls
        for start in range(0, n, self.batch_size):
            size = min(self.batch_size, n - start)
            generators = [_image_generator(self.seed, cls, start + i, self.device)
                          for i in range(size)]
            began = time.perf_counter()
            # Masks are encoded by the model's own VAE, as the denoiser was trained on them.
            layout = (None if layouts is None or picks is None else encode_layouts(
                self.bundle, info, layouts.masks[picks[start:start + size]]))
            images = _generate(self.bundle, info, denoiser, label, size, sampler=self.sampler,
                               steps=self.steps, generators=generators, layout=layout,
                               guidance_scale=1.0 if per_label else self.guidance_scale)
            self.elapsed += time.perf_counter() - began
            for i, image in enumerate(images):
                _save_png(image, target / f"{start + i}.png")
            self.done += size
            if self.progress is not None:
                self.progress(self.done, self.total)
        return picks


def _layout_channels(info: ModelInfo) -> int:
    value = info.extra.get("layout_channels", 0)
    return value if isinstance(value, int) else 0


def _draw_layouts(layouts: LayoutSet, class_name: str, cls: int, n: int,
                  seed: int) -> np.ndarray:
    """Indices of ``n`` masks for a class, drawn with the generation seed.

    Without replacement while the class's pool lasts (so masks are spread), with
    replacement beyond it.
    """
    pool = layouts.pool(class_name)
    sequence = np.random.SeedSequence(seed & _SEED_MASK, spawn_key=(_LAYOUT_STREAM, cls))
    rng = np.random.default_rng(sequence)
    return rng.choice(pool, size=n, replace=n > pool.size).astype(np.int64)


def _class_dirs(info: ModelInfo) -> list[str]:
    """File-system-safe, unique directory names for the class names."""
    names: list[str] = []
    for idx, name in enumerate(info.class_names):
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or f"class_{idx}"
        names.append(safe if safe not in names else f"{safe}_{idx}")
    return names


def _save_png(image: np.ndarray, path: Path) -> None:
    Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).save(path)
