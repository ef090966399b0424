"""dpsynth_ml: the ML core of dpsynth (DP fine-tuning of latent diffusion models).

The core takes local paths, a typed spec and hooks, and returns a typed result; it knows
nothing of Celery, HTTP, SQL or object stores. opacus is imported only in ``dpsynth_ml.dp``.

Public API::

    DpSpec(noise_multiplier, sample_rate, expected_batch_size, max_grad_norm, steps)
    TrainingSpec(kind, preset="tiny", image_size=32, channels=1, class_conditional=True,
                 num_classes=10, trainable="attention", learning_rate=3e-4, epochs=1,
                 batch_size=64, label_dropout=0.1, max_physical_batch_size=64,
                 class_map=None, checkpoint_every=10, seed=0, dp=None)
    TrainingHooks (Protocol): acquire_steps, should_stop, on_progress, on_checkpoint,
                              on_private_stats;  NullHooks grants everything
    train(spec, *, dataset_path, out_dir, hooks=NullHooks(), base_model_dir=None,
          resume_from=None, _test_generator=None) -> TrainingResult
        pretrain: VAE then UNet on public data, seeded by spec.seed, -> out_dir/model
        finetune: DP-SGD (Poisson q = dp.sample_rate, per-example clipping to C, one
                  N(0, sigma^2 C^2) draw per logical step, / expected_batch_size) ->
                  out_dir/model, out_dir/checkpoints/step-NNNNNNN/, out_dir/trainer_state.json
    sample(model_dir, *, samples_per_class, sampler, steps, guidance_scale, seed, out_dir,
           classes=None, progress=None) -> SampleResult   # out_dir/<class_name>/<i>.png
    load_dataset(path) -> ImageDataset     # canonical npz: images, labels, class_names
    model_hash(model_dir) -> str           # sha256 over the sorted files
    read_model_info(model_dir) -> ModelInfo
    PoissonSampler(n, sample_rate, generator).sample() -> LongTensor (from dpsynth_ml.dp)

Errors raised for bad inputs are :class:`InvalidSpecError` (``code = "invalid_spec"``).
Statistics on private data (loss, fraction clipped, realised batch size) go only to
``hooks.on_private_stats`` and are never logged.
"""

from dpsynth_ml.data import ImageDataset, load_dataset
from dpsynth_ml.generate import sample
from dpsynth_ml.hooks import NullHooks, TrainingHooks
from dpsynth_ml.model_io import model_hash, read_model_info
from dpsynth_ml.spec import (
                             DpSpec,
                             InvalidSpecError,
                             MlError,
                             ModelInfo,
                             SampleResult,
                             TrainingResult,
                             TrainingSpec,
)
from dpsynth_ml.training import train

__all__ = [
    "DpSpec", "ImageDataset", "InvalidSpecError", "MlError", "ModelInfo", "NullHooks",
    "SampleResult", "TrainingHooks", "TrainingResult", "TrainingSpec", "load_dataset",
    "model_hash", "read_model_info", "sample", "train",
]
