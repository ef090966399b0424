"""dpsynth_ml: the ML core of dpsynth (DP fine-tuning of latent diffusion models).

The core takes local paths, a typed spec and hooks, and returns a typed result; it knows
nothing of Celery, HTTP, SQL or object stores. opacus is imported only in ``dpsynth_ml.dp``.

Public API::

    DpSpec(noise_multiplier, sample_rate, expected_batch_size, max_grad_norm, steps,
           epsilon=None, delta=None)
        epsilon, delta: the job's; they size the fixed rows every step processes
                (dpsynth_ml.dp.padding), never the mechanism.
    TrainingSpec(kind, preset="tiny", architecture=None, image_size=32, channels=1,
                 class_conditional=True, layout_conditioning=False, num_classes=10,
                 trainable="attention", blocks=None, lora_rank=4, lora_alpha=None,
                 train_embedder=None, noise_multiplicity=1, ema_decay=None, warmup_steps=0,
                 learning_rate=3e-4, epochs=1, batch_size=64, label_dropout=0.1,
                 max_physical_batch_size=64, class_map=None, checkpoint_every=10, seed=0,
                 dp=None, per_label_dp=None, target="images", nonprivate=False)
        nonprivate: BENCHMARKS ONLY: a finetune with dp = per_label_dp = None that trains
                the same trainable set on uniformly shuffled minibatches of batch_size for
                epochs epochs, no per-example gradients, clipping or noise, seeded by seed;
                info.extra.nonprivate = True. The worker and the api never set it.
        target: images | masks (a layout generator: the dataset's masks in place of its
                images, same labels and DP machinery; info.extra.target = "masks")
        preset: tiny | small (CPU) | base (GPU, ~31M-parameter UNet2DConditionModel on
                32x32 or 64x64 latents) | custom (architecture=Architecture(unet_class=
                "UNet2DConditionModel" | "UNet2DModel", unet={...}, vae={...}), kwargs
                checked against dpsynth_shared.model_configs; sizes set by the platform)
        trainable: full | attention (every diffusers Attention: self + cross) |
                output_attention (Attention under up_blocks) | blocks (UNet module-name
                prefixes in `blocks`) | lora (peft adapters on to_q/to_k/to_v/to_out.0,
                rank lora_rank, alpha lora_alpha or rank; merged into the released UNet)
        train_embedder: None = train the class table iff class_map is None
        layout_conditioning: masks encoded by the frozen VAE, concatenated to the latent
    dpsynth_ml.trainable.trainable_parameter_names(unet, *, trainable, blocks=None,
          train_embedder=False) -> list[str]   # pure: what a mode trains
    dpsynth_ml.models.encode_layouts(bundle, info, masks) -> Tensor  # layout= of the denoiser
    dpsynth_ml.models.ConditionalDenoiser(unet, class_embedder)(latents, timesteps, labels,
          layout=None)   # one signature for UNet2DConditionModel and UNet2DModel
    ModelInfo.extra: unet_class, layout_channels (0 = none), trainable_parameters, and for
          finetunes trainable, train_embedder, blocks / lora {rank, alpha, merged}
    TrainingHooks (Protocol): acquire_steps, should_stop, on_progress, on_checkpoint,
                              on_private_stats;  NullHooks grants everything
    train(spec, *, dataset_path, out_dir, hooks=NullHooks(), base_model_dir=None,
          resume_from=None, _test_generator=None) -> TrainingResult
        pretrain: VAE then UNet on public data, seeded by spec.seed, -> out_dir/model
        finetune: DP-SGD (Poisson q = dp.sample_rate over the whole dataset once per
                  logical step, no cap on the realised size, split into micro-batches of
                  max_physical_batch_size; per-example clipping to C of the example's
                  gradient averaged over noise_multiplicity = K (timestep, noise) draws
                  (DPDM; label dropout drawn once per example per step; per-sample-gradient
                  memory independent of K); one N(0, sigma^2 C^2) draw per logical step,
                  / expected_batch_size; AdamW with linear warm-up over warmup_steps logical
                  steps; with ema_decay an EMA of the trained weights (diffusers EMAModel,
                  decay min(ema_decay, (1+n)/(10+n))) is what model and checkpoints
                  release) -> out_dir/model, out_dir/checkpoints/step-NNNNNNN/ (model +
                  trainer_state.json, optimizer/trainable/ema.safetensors: resume restores
                  raw weights, optimizer, EMA, LR schedule and steps done; never randomness),
                  out_dir/trainer_state.json
        per-label finetune (spec.per_label_dp = {class name: DpSpec}, DP-DocLDM): one
                  unconditional denoiser per class of the dataset's domain, in domain order,
                  each from a fresh copy of base_model_dir on its class's records only,
                  leases acquire_steps(start, count, partition=class name) numbered from 0
                  per class, progress over all classes' steps; checkpoints record the
                  classes done and the current class's step (dpsynth_ml.per_label) ->
                  out_dir/model = a per-label bundle; TrainingResult.steps_by_partition
    Per-label bundles (dpsynth_ml.model_io): vae/ scheduler/ shared, denoisers/<index>/unet/
          (+ class_embedder/) per class, root unet/ = a copy of the first class's denoiser;
          info.extra per_label=True, denoisers={class name: "denoisers/<index>"},
          steps_by_partition. Per-label denoisers are unconditional: sample them with
          labels = info.null_class (guidance has no effect).
        save_per_label_model(class_model_dirs: {class name: model dir}, model_dir) -> Path
        per_label_denoiser_dirs(info) -> {class name: relative dir}   ({} if not per-label)
        load_model_denoiser(model_dir, class_name) -> (ModelBundle, ModelInfo)  # one class
        load_per_label_denoisers(model_dir, bundle=None, info=None)
              -> {class name: ConditionalDenoiser}
        export_denoiser(model_dir, class_name, dest) -> Path   # a plain single-class model
    sample(model_dir, *, samples_per_class, sampler, steps, guidance_scale, seed, out_dir,
           classes=None, progress=None) -> SampleResult   # out_dir/<class_name>/<i>.png
    dpsynth_ml.generate.sample_layouts(model_dir, *, counts={class name: n}, seed,
           sampler="ddim", steps=50, guidance_scale=1.0, batch_size=64, per_class=True)
           -> LayoutSet   # masks from a layout generator, binarised to uint8 {0, 255}
    load_dataset(path) -> ImageDataset     # canonical npz: images, labels, class_names
    model_hash(model_dir) -> str           # sha256 over the sorted files
    read_model_info(model_dir) -> ModelInfo
    PoissonSampler(n, sample_rate, generator).sample() -> LongTensor (from dpsynth_ml.dp)
    dpsynth_ml.evaluation (docs/evaluation.md): metrics of evaluate jobs
        train_feature_net(images, labels, *, class_names, image_size, channels, epochs,
              batch_size, learning_rate, seed, out_dir, val_images=None, val_labels=None,
              validation_fraction=0.2, progress=None) -> FeatureNetInfo  # PUBLIC data only
        load_feature_net(dir) -> (FeatureNet, FeatureNetInfo)   # verifies the sha256
        check_feature_net(net, info, images, labels, *, min_accuracy) -> accuracy
              # FeatureNetworkRejected (code feature_network_rejected) below max(min, 2/K)
        extract_features(net, info, images) -> float64 [N, 128]
        frechet_distance(a, b) / prdc(real, fake, k=5) / memorisation(synthetic, train,
              holdout, space="pixel"|"features") -> MemorisationResult
        CLASSIFIER_SETTINGS, train_classifier(kind, images, labels, *, num_classes, seed),
              classifier_accuracy(model, images, labels), per_class_recall(...)
        evaluate_corpus(synthetic, real_train, real_holdout, *, classifiers, ...)
              -> EvaluationResult(document = EvaluationReport's metric keys, arrays)
        dpsynth_ml.evaluation.inception: FIDInceptionV3, load_inception(path) (pinned
              sha256; InceptionWeightsUnavailable), inception_features(model, images)

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
from dpsynth_ml.training import check_training, train

__all__ = [
    "DpSpec", "ImageDataset", "InvalidSpecError", "MlError", "ModelInfo", "NullHooks",
    "SampleResult", "TrainingHooks", "TrainingResult", "TrainingSpec", "check_training",
    "load_dataset",
    "model_hash", "read_model_info", "sample", "train",
]
