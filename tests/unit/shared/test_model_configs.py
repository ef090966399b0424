"""The allow-list of model configs: what diffusers saves passes, everything else is refused
with a message naming the key; the parameter estimate matches diffusers exactly."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from dpsynth_shared.model_configs import (
    MAX_CONFIG_BYTES,
    ConfigLimits,
    ModelConfigError,
    check_config,
    component_of,
    estimate_parameters,
    parse_config,
)

diffusers = pytest.importorskip("diffusers")

TINY_UNET: dict[str, Any] = {
    "sample_size": 8, "in_channels": 4, "out_channels": 4, "layers_per_block": 1,
    "block_out_channels": [32, 64], "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"], "cross_attention_dim": 32,
    "attention_head_dim": 8, "norm_num_groups": 8}
TINY_VAE: dict[str, Any] = {
    "in_channels": 1, "out_channels": 1, "down_block_types": ["DownEncoderBlock2D"] * 2,
    "up_block_types": ["UpDecoderBlock2D"] * 2, "block_out_channels": [16, 32],
    "latent_channels": 4, "norm_num_groups": 8, "sample_size": 16,
    "mid_block_add_attention": False}


def saved_config(obj: Any, tmp_path: Path) -> dict[str, Any]:
    """The config file diffusers writes for ``obj``, read back through parse_config."""
    obj.save_config(tmp_path)
    name = "scheduler_config.json" if "Scheduler" in type(obj).__name__ else "config.json"
    return parse_config((tmp_path / name).read_bytes(), component="test")


def n_params(model: Any) -> int:
    return sum(v.numel() for v in model.state_dict().values())


def refused(component: str, config: dict[str, Any], match: str, **kw: Any) -> ModelConfigError:
    with pytest.raises(ModelConfigError, match=match) as info:
        check_config(component, config, **kw)
    return info.value


def test_every_allowed_class_as_diffusers_saves_it_passes(tmp_path: Path) -> None:
    d = diffusers
    ddpm = d.DDPMScheduler(clip_sample=False)
    objects = [("vae", d.AutoencoderKL(**TINY_VAE)),
               ("unet", d.UNet2DConditionModel(**TINY_UNET)),
               ("unet", d.UNet2DModel(sample_size=8, in_channels=8, out_channels=4,
                                      block_out_channels=(32, 64), norm_num_groups=8,
                                      down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                                      up_block_types=("AttnUpBlock2D", "UpBlock2D"),
                                      num_class_embeds=9)),
               ("scheduler", ddpm),
               # made from another scheduler's config: diffusers keeps its "hidden" keys
               ("scheduler", d.DDIMScheduler.from_config(ddpm.config)),
               ("scheduler", d.DPMSolverMultistepScheduler.from_config(ddpm.config))]
    for i, (component, obj) in enumerate(objects):
        config = saved_config(obj, tmp_path / str(i))
        check_config(component, config)
    # DPMSolverMultistepScheduler writes lambda_min_clipped = -Infinity: read, accepted
    assert config["lambda_min_clipped"] == float("-inf")


@pytest.mark.parametrize("component,config,match", [
    ("unet", {**TINY_UNET, "_class_name": "ControlNetModel"}, "'ControlNetModel' is not allowed"),
    ("vae", {**TINY_UNET, "_class_name": "UNet2DConditionModel"}, "not allowed for vae"),
    ("scheduler", {"_class_name": "EulerDiscreteScheduler"}, "not allowed for scheduler"),
    ("unet", dict(TINY_UNET), "has no _class_name"),
    ("unet", {**TINY_UNET, "_class_name": ["my_module", "MyUNet"]}, "custom code is refused"),
    ("transformer", {"_class_name": "UNet2DModel"}, "unknown model component"),
])
def test_classes_outside_the_allow_list_are_refused(component: str, config: dict[str, Any],
                                                     match: str) -> None:
    err = refused(component, config, match)
    assert err.component == component


@pytest.mark.parametrize("key", ["auto_map", "trust_remote_code", "custom_pipeline"])
def test_remote_code_hints_are_refused(key: str) -> None:
    config = {**TINY_UNET, "_class_name": "UNet2DConditionModel",
              key: {"AutoModel": "modeling.MyUNet"}}
    assert refused("unet", config, "custom or remote code").key == key


def test_unknown_keys_and_bad_values_name_the_key() -> None:
    base = {**TINY_UNET, "_class_name": "UNet2DConditionModel"}
    assert refused("unet", {**base, "my_flag": 1}, "unknown key").key == "my_flag"
    # a key of the other UNet class is unknown to this one
    assert refused("unet", {**base, "add_attention": True}, "unknown key").key == "add_attention"
    assert refused("unet", {**base, "down_block_types": ["CrossAttnDownBlock2D", "MyBlock"]},
                   "down_block_types").key == "down_block_types"
    assert refused("unet", {**base, "mid_block_type": "UNetMidBlock2DSimpleCrossAttn"},
                   "mid_block_type").key == "mid_block_type"
    assert refused("unet", {**base, "act_fn": "os.system"}, "act_fn").key == "act_fn"
    assert refused("unet", {**base, "layers_per_block": True}, "layers_per_block").key == \
        "layers_per_block"
    assert refused("unet", {**base, "attention_type": "gated"}, "attention_type").key == \
        "attention_type"


def test_size_limits() -> None:
    base = {**TINY_UNET, "_class_name": "UNet2DConditionModel"}
    assert refused("unet", {**base, "block_out_channels": [32, 4096]},
                   "block_out_channels").key == "block_out_channels"
    assert refused("unet", {**base, "layers_per_block": 9}, "layers_per_block")
    assert refused("unet", {**base, "sample_size": 1024}, "sample_size")
    assert refused("unet", {**base, "cross_attention_dim": 10_000}, "cross_attention_dim")
    assert refused("unet", {**base, "attention_head_dim": 7}, "attention heads").key == \
        "attention_head_dim"
    assert refused("unet", {**base, "norm_num_groups": 24}, "does not divide")
    assert refused("unet", {**base, "block_out_channels": [32, 64, 64]},
                   "must be equal")
    # every value within its own limit, but the whole is too large: the estimate bounds it
    big = {"_class_name": "UNet2DConditionModel", "block_out_channels": [2048] * 4,
           "layers_per_block": 4, "cross_attention_dim": 2048, "attention_head_dim": 16}
    assert refused("unet", big, "parameters, over the limit").key == "block_out_channels"
    check_config("unet", big, limits=ConfigLimits(max_unet_parameters=10**10))
    sched = {"_class_name": "DDPMScheduler"}
    assert refused("scheduler", {**sched, "num_train_timesteps": 10**6}, "num_train_timesteps")
    assert refused("scheduler", {**sched, "beta_start": 0.5, "beta_end": 0.1}, "beta_start")
    assert refused("scheduler", {**sched, "trained_betas": [0.1, 0.2]}, "trained_betas")


def test_parse_config_is_strict() -> None:
    ok = json.dumps({"_class_name": "DDPMScheduler"}).encode()
    assert parse_config(ok, component="scheduler") == {"_class_name": "DDPMScheduler"}
    padded = b'{"_class_name": "DDPMScheduler"' + b" " * MAX_CONFIG_BYTES + b"}"
    with pytest.raises(ModelConfigError, match="over the limit of 65536 bytes"):
        parse_config(padded, component="scheduler")
    with pytest.raises(ModelConfigError, match="repeats the key"):
        parse_config(b'{"a": 1, "a": 2}', component="unet")
    with pytest.raises(ModelConfigError, match="NaN"):
        parse_config(b'{"beta_start": NaN}', component="scheduler")
    with pytest.raises(ModelConfigError, match="JSON object"):
        parse_config(b"[1, 2]", component="unet")
    with pytest.raises(ModelConfigError, match="not valid UTF-8 JSON"):
        parse_config(b"\xff{", component="unet")
    # Infinity is read, then refused wherever the schema wants a finite number
    inf = parse_config(b'{"_class_name": "DDPMScheduler", "beta_end": Infinity}',
                       component="scheduler")
    refused("scheduler", inf, "beta_end")


def test_custom_architectures_name_their_class_outside_the_config() -> None:
    check_config("unet", TINY_UNET, class_name="UNet2DConditionModel")
    check_config("vae", TINY_VAE, class_name="AutoencoderKL")
    refused("unet", {**TINY_UNET, "_class_name": "UNet2DModel"}, "expected",
            class_name="UNet2DConditionModel")
    refused("unet", TINY_UNET, "not allowed", class_name="MyUNet")


def test_class_embedder_config() -> None:
    check_config("class_embedder", {"num_embeddings": 11, "embedding_dim": 32, "null_class": 10})
    refused("class_embedder", {"num_embeddings": 11, "embedding_dim": 32, "null_class": 3},
            "null_class")
    refused("class_embedder", {"num_embeddings": 11, "embedding_dim": 32}, "has no null_class")
    refused("class_embedder", {"num_embeddings": 11, "embedding_dim": 32, "null_class": 10,
                               "_class_name": "Embedding"}, "must not name a class")


def test_component_of_paths() -> None:
    assert component_of("vae/config.json") == "vae"
    assert component_of("unet/config.json") == "unet"
    assert component_of("denoisers/3/unet/config.json") == "unet"
    assert component_of("scheduler/scheduler_config.json") == "scheduler"
    assert component_of("class_embedder/config.json") == "class_embedder"
    assert component_of("scheduler/config.json") is None
    assert component_of("unet/diffusion_pytorch_model.safetensors") is None
    assert component_of("text_encoder/config.json") is None
    assert component_of("denoisers/../unet/config.json") is None


def test_the_parameter_estimate_is_exact_for_diffusers_models() -> None:
    d = diffusers
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        models = [
            d.AutoencoderKL(**TINY_VAE),
            d.AutoencoderKL(down_block_types=("DownEncoderBlock2D", "AttnDownEncoderBlock2D"),
                            up_block_types=("AttnUpDecoderBlock2D", "UpDecoderBlock2D"),
                            block_out_channels=(32, 64), layers_per_block=2,
                            norm_num_groups=16),
            d.UNet2DConditionModel(**TINY_UNET),
            d.UNet2DConditionModel(
                sample_size=8, layers_per_block=2, block_out_channels=(32, 64, 64),
                down_block_types=("CrossAttnDownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
                up_block_types=("UpBlock2D", "AttnUpBlock2D", "CrossAttnUpBlock2D"),
                cross_attention_dim=48, attention_head_dim=(4, 8, 8),
                transformer_layers_per_block=(1, 2, 1), norm_num_groups=8,
                use_linear_projection=True, num_class_embeds=11, mid_block_type="UNetMidBlock2D"),
            d.UNet2DConditionModel(
                **{**TINY_UNET, "attention_head_dim": 4}, class_embed_type="timestep",
                resnet_time_scale_shift="scale_shift", time_embedding_type="fourier",
                only_cross_attention=True, encoder_hid_dim=20, time_cond_proj_dim=7,
                class_embeddings_concat=True),
            d.UNet2DModel(sample_size=16, in_channels=8, out_channels=4,
                          block_out_channels=(32, 64), layers_per_block=2, norm_num_groups=8,
                          down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                          up_block_types=("AttnUpBlock2D", "UpBlock2D"), attention_head_dim=16,
                          num_class_embeds=9),
            d.UNet2DModel(sample_size=16, block_out_channels=(32, 64, 64), layers_per_block=1,
                          down_block_types=("DownBlock2D", "AttnDownBlock2D", "AttnDownBlock2D"),
                          up_block_types=("AttnUpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
                          norm_num_groups=8, attention_head_dim=None, downsample_type="resnet",
                          upsample_type="resnet", time_embedding_type="fourier",
                          class_embed_type="timestep", resnet_time_scale_shift="scale_shift"),
            d.UNet2DModel(sample_size=16, block_out_channels=(32, 64), norm_num_groups=8,
                          down_block_types=("DownBlock2D", "DownBlock2D"),
                          up_block_types=("UpBlock2D", "UpBlock2D"),
                          time_embedding_type="learned", num_train_timesteps=100,
                          mid_block_type=None),
        ]
    for model in models:
        config = dict(model.config)
        assert estimate_parameters(type(model).__name__, config) == n_params(model), config
