"""Presets and custom architectures: the ~30M ``base`` preset builds (never trained here), a
custom ``UNet2DModel`` (class embedding added to the timestep embedding) pretrains, DP
finetunes and round-trips, and custom configs outside the allow-list are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffusers import UNet2DConditionModel, UNet2DModel
from dpsynth_ml import InvalidSpecError, PretrainTraining, TrainingResult, read_model_info, train
from dpsynth_ml.models.architectures import ConditionalDenoiser, build_bundle, plan_model
from dpsynth_ml.models.model_io import load_model, save_model
from dpsynth_ml.models.trainable import trainable_parameter_names
from dpsynth_ml.spec import Architecture

from .support import IMAGE_SIZE, finetune_spec, seeded, write_digits

UNET2D = {"block_out_channels": [32, 64], "down_block_types": ["DownBlock2D", "AttnDownBlock2D"],
          "up_block_types": ["AttnUpBlock2D", "UpBlock2D"], "layers_per_block": 1,
          "norm_num_groups": 8, "attention_head_dim": 8}
VAE = {"block_out_channels": [16, 32], "down_block_types": ["DownEncoderBlock2D"] * 2,
       "up_block_types": ["UpDecoderBlock2D"] * 2, "latent_channels": 4, "norm_num_groups": 8,
       "mid_block_add_attention": False}


def _pretrain_spec(**overrides: object) -> PretrainTraining:
    fields: dict[str, object] = dict(preset="custom", image_size=IMAGE_SIZE,
                                     epochs=1, batch_size=20, learning_rate=1e-3,
                                     architecture=Architecture(unet_class="UNet2DModel",
                                                               unet=UNET2D, vae=VAE))
    fields.update(overrides)
    return PretrainTraining(**fields)  # type: ignore[arg-type]


def test_base_preset_is_a_30m_denoiser_for_32_or_64_latents() -> None:
    spec = PretrainTraining(preset="base", image_size=128, channels=3,
                        num_classes=16)
    plan = plan_model(spec)
    assert plan.unet_config["sample_size"] == 32
    large = plan_model(PretrainTraining(preset="base", image_size=256,
                                    channels=3, num_classes=16))
    assert large.unet_config["sample_size"] == 64
    bundle = build_bundle(plan, num_classes=16)
    assert isinstance(bundle.unet, UNet2DConditionModel)
    count = sum(p.numel() for p in bundle.unet.parameters())
    assert abs(count - 30_000_000) <= 0.15 * 30_000_000, count


@pytest.fixture(scope="module")
def small_digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_digits(tmp_path_factory.mktemp("arch") / "digits40.npz", n=40)


@pytest.fixture(scope="module")
def unet2d_model(tmp_path_factory: pytest.TempPathFactory, small_digits: Path) -> TrainingResult:
    return train(_pretrain_spec(), dataset_path=small_digits,
                 out_dir=tmp_path_factory.mktemp("unet2d"))


def test_custom_unet2dmodel_takes_the_class_through_the_timestep_embedding(
        unet2d_model: TrainingResult) -> None:
    bundle, info = load_model(unet2d_model.model_dir)
    assert isinstance(bundle.unet, UNet2DModel)
    assert info.extra["unet_class"] == "UNet2DModel" and info.extra["layout_channels"] == 0
    assert bundle.class_embedder is bundle.unet.class_embedding
    assert bundle.unet.config["num_class_embeds"] == info.num_classes + 1  # null = last row
    assert not (unet2d_model.model_dir / "class_embedder").exists()
    denoiser = ConditionalDenoiser(bundle.unet, bundle.class_embedder).eval()
    assert "unet.class_embedding.weight" in dict(denoiser.named_parameters())
    x, t = torch.randn(1, 4, 8, 8), torch.tensor([500])
    with torch.no_grad():
        a, b = denoiser(x, t, torch.tensor([0])), denoiser(x, t, torch.tensor([info.null_class]))
    assert not torch.allclose(a, b)  # the label is used


def test_custom_unet2dmodel_finetunes_and_round_trips(
        unet2d_model: TrainingResult, small_digits: Path, tmp_path: Path) -> None:
    spec = finetune_spec(trainable="attention", class_map=None, dp_steps=2,
                         dp_sample_rate=0.2, checkpoint_every=10)
    result = train(spec, dataset_path=small_digits, out_dir=tmp_path / "ft",
                   base_model_dir=unet2d_model.model_dir, _test_generator=seeded())
    base, _ = load_model(unet2d_model.model_dir)
    bundle, info = load_model(result.model_dir)
    assert isinstance(bundle.unet, UNet2DModel) and info.extra["unet_class"] == "UNet2DModel"
    selected = trainable_parameter_names(base.unet, trainable="attention", train_embedder=True)
    assert "unet.class_embedding.weight" in selected
    before, after = base.unet.state_dict(), bundle.unet.state_dict()
    changed = {f"unet.{k}" for k in before if not torch.equal(before[k], after[k])}
    assert changed == set(selected)
    assert all(".attentions." in n for n in selected if n != "unet.class_embedding.weight")
    assert result.trainable_parameters == sum(after[n[5:]].numel() for n in selected)
    # Round trip: save what was loaded, load again, same weights and class.
    again, again_info = load_model(save_model(bundle, info, tmp_path / "copy"))
    assert isinstance(again.unet, UNet2DModel) and again_info == read_model_info(tmp_path / "copy")
    for key, value in again.unet.state_dict().items():
        assert torch.equal(value, after[key])


def test_custom_architectures_outside_the_allow_list_are_refused() -> None:
    def refused(unet_class: str = "UNet2DModel", unet: dict[str, object] | None = None,
                vae: dict[str, object] | None = None) -> str:
        arch = Architecture(unet_class=unet_class, unet=UNET2D if unet is None else unet,  # type: ignore[arg-type]
                            vae=VAE if vae is None else vae)
        with pytest.raises(InvalidSpecError) as err:
            plan_model(_pretrain_spec(architecture=arch))
        return str(err.value)

    assert "in_channels" in refused(unet={**UNET2D, "in_channels": 8})
    assert "class_embed_type" in refused(unet={**UNET2D, "class_embed_type": "identity"})
    assert "scaling_factor" in refused(vae={**VAE, "scaling_factor": 0.5})
    assert "mystery" in refused(unet={**UNET2D, "mystery": 1})
    assert "block_out_channels" in refused(unet={**UNET2D, "block_out_channels": [32, 99999]})
    assert "Transformer2DModel" in refused(unet_class="Transformer2DModel")
    assert "down_block_types" in refused(unet={**UNET2D, "down_block_types": [
        "DownBlock2D", "CrossAttnDownBlock2D"]})


def test_custom_unet2dconditionmodel_is_accepted() -> None:
    arch = Architecture(unet_class="UNet2DConditionModel", vae=VAE, unet={
        "block_out_channels": [32, 64], "layers_per_block": 1, "norm_num_groups": 8,
        "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
        "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"], "cross_attention_dim": 16,
        "attention_head_dim": 4})
    plan = plan_model(_pretrain_spec(architecture=arch, layout_conditioning=True))
    bundle = build_bundle(plan, num_classes=10)
    assert bundle.unet.config["in_channels"] == 8 and bundle.unet.config["out_channels"] == 4
    assert bundle.layout_channels == 4 and bundle.class_embedder.weight.shape == (11, 16)
