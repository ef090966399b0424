"""What each ``trainable`` mode trains: the pure name selection, and after a DP finetune,
exactly the selected parameters changed while every frozen one is bit-identical."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
import torch
from dpsynth_ml import InvalidSpecError, TrainingResult, read_model_info, train
from dpsynth_ml.dp import DpSgdEngine
from dpsynth_ml.models.architectures import build_unet, is_attention_parameter, preset_config
from dpsynth_ml.models.model_io import load_model
from dpsynth_ml.models.trainable import (
    LORA_TARGETS,
    add_lora,
    has_lora,
    lora_target_names,
    trainable_parameter_names,
    trains_embedder,
)
from dpsynth_ml.training.checkpoint import read_trainer_state
from dpsynth_ml.training.finetune import setup as ft_setup
from torch import nn

from .support import (
    RecordingHooks,
    changed_parameters,
    finetune_spec,
    model_state,
    seeded,
)

IDENTITY = {i: i for i in range(10)}


def _unet() -> nn.Module:
    return build_unet(preset_config("tiny"), latent_size=4)


# --- the pure selection ------------------------------------------------------------------

def test_attention_is_every_self_and_cross_attention_parameter() -> None:
    unet = _unet()
    names = trainable_parameter_names(unet, trainable="attention")
    expected = [f"unet.{n}" for n, _ in unet.named_parameters() if is_attention_parameter(n)]
    assert names == expected
    assert any(".attn1." in n for n in names) and any(".attn2." in n for n in names)
    assert {n.split(".")[1] for n in names} == {"down_blocks", "mid_block", "up_blocks"}


def test_output_attention_is_the_attention_of_the_up_blocks_only() -> None:
    unet = _unet()
    everything = trainable_parameter_names(unet, trainable="attention")
    output = trainable_parameter_names(unet, trainable="output_attention")
    assert output == [n for n in everything if n.startswith("unet.up_blocks.")]
    assert 0 < len(output) < len(everything)


def test_blocks_select_module_prefixes_and_refuse_unknown_ones() -> None:
    unet = _unet()
    names = trainable_parameter_names(unet, trainable="blocks",
                                      blocks=("up_blocks.1.resnets.0", "conv_out"))
    assert "unet.conv_out.weight" in names and "unet.conv_out.bias" in names
    assert all(n.startswith(("unet.up_blocks.1.resnets.0.", "unet.conv_out.")) for n in names)
    with pytest.raises(InvalidSpecError) as err:
        trainable_parameter_names(unet, trainable="blocks", blocks=("conv", "up_blocks.1"))
    message = str(err.value)
    assert "'conv'" in message and "up_blocks.1.attentions" in message and "conv_out" in message


def test_full_is_the_whole_unet_and_the_embedder_follows_train_embedder() -> None:
    unet = _unet()
    full = trainable_parameter_names(unet, trainable="full")
    assert full == [f"unet.{n}" for n, _ in unet.named_parameters()]
    with_embedder = trainable_parameter_names(unet, trainable="attention", train_embedder=True)
    assert with_embedder[-1] == "class_embedder.weight"
    assert trains_embedder(finetune_spec(class_map=None)) is True
    assert trains_embedder(finetune_spec(class_map=IDENTITY)) is False
    assert trains_embedder(finetune_spec(class_map=IDENTITY, train_embedder=True)) is True
    assert trains_embedder(finetune_spec(class_map=None, train_embedder=False)) is False


def test_lora_names_are_the_adapters_of_the_attention_projections() -> None:
    unet = _unet()
    predicted = trainable_parameter_names(unet, trainable="lora")
    targets = lora_target_names(unet)
    assert len(targets) == 8 * len(LORA_TARGETS)  # 8 Attention modules in the tiny UNet
    add_lora(unet, rank=3, alpha=3.0)
    assert trainable_parameter_names(unet, trainable="lora") == predicted
    params = dict(unet.named_parameters())
    assert all(".lora_A." in n or ".lora_B." in n for n in predicted)
    modules = dict(_unet().named_modules())
    expected = sum(3 * (modules[t].in_features + modules[t].out_features) for t in targets)
    assert sum(params[n.removeprefix("unet.")].numel() for n in predicted) == expected


# --- what a DP finetune changes ----------------------------------------------------------

class RecordingEngine(DpSgdEngine):
    """The real engine, recording which parameters got opacus per-sample gradients."""

    instances: ClassVar[list[RecordingEngine]] = []

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.names = {id(p): n.removeprefix("_module.") for n, p in self.module.named_parameters()}
        self.with_grad_sample: set[str] = set()
        RecordingEngine.instances.append(self)

    def per_sample_norms(self) -> torch.Tensor:
        for p in self.params:
            if getattr(p, "grad_sample", None) is not None:
                self.with_grad_sample.add(self.names[id(p)])
        return super().per_sample_norms()


@pytest.fixture()
def recording(monkeypatch: pytest.MonkeyPatch) -> type[RecordingEngine]:
    RecordingEngine.instances = []
    monkeypatch.setattr(ft_setup, "DpSgdEngine", RecordingEngine)
    # these tests read opacus' per-sample gradients: keep the hooks engine for every set
    monkeypatch.setattr(ft_setup, "choose_engine", lambda *args, **kwargs: "hooks")
    return RecordingEngine


@pytest.mark.parametrize(("mode", "blocks"), [
    ("attention", None),
    ("output_attention", None),
    ("blocks", ("up_blocks.1.resnets.0", "mid_block.attentions.0", "conv_out")),
])
def test_exactly_the_selected_parameters_change(
        mode: str, blocks: tuple[str, ...] | None, pretrained: TrainingResult,
        digits_path: Path, tmp_path: Path, recording: type[RecordingEngine]) -> None:
    spec = finetune_spec(trainable=mode, blocks=blocks, class_map=IDENTITY, dp_steps=2,
                         dp_sample_rate=0.1, checkpoint_every=10)
    result = train(spec, dataset_path=digits_path, out_dir=tmp_path,
                   base_model_dir=pretrained.model_dir, _test_generator=seeded())
    base, _ = load_model(pretrained.model_dir)
    selected = set(trainable_parameter_names(base.unet, trainable=mode,  # type: ignore[arg-type]
                                             blocks=blocks))
    before, after = model_state(pretrained.model_dir), model_state(result.model_dir)
    # frozen: bit-identical; selected: all moved
    assert changed_parameters(before, after) == selected
    (engine,) = recording.instances
    assert selected <= engine.with_grad_sample
    assert result.trainable_parameters == sum(after[k].numel() for k in selected)
    assert read_model_info(result.model_dir).extra["trainable_parameters"] == \
        result.trainable_parameters
    assert read_trainer_state(tmp_path)["trainable_parameter_names"] == sorted(
        selected, key=list(after).index)


def test_lora_trains_only_the_adapters_and_releases_them_merged(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path,
        recording: type[RecordingEngine]) -> None:
    spec = finetune_spec(trainable="lora", lora_rank=2, lora_alpha=4.0, class_map=IDENTITY,
                         dp_steps=2, dp_sample_rate=0.1, checkpoint_every=10)
    result = train(spec, dataset_path=digits_path, out_dir=tmp_path,
                   base_model_dir=pretrained.model_dir, _test_generator=seeded())
    base, _ = load_model(pretrained.model_dir)
    lora_names = trainable_parameter_names(base.unet, trainable="lora")
    (engine,) = recording.instances
    assert set(lora_names) <= engine.with_grad_sample  # opacus hooks see peft's lora layers
    assert read_trainer_state(tmp_path)["trainable_parameter_names"] == lora_names

    # The checkpoint keeps the adapters apart: every original parameter is bit-identical.
    ckpt, _ = load_model(tmp_path / "checkpoints" / "step-0000002")
    assert has_lora(ckpt.unet)
    assert not changed_parameters(model_state(pretrained.model_dir),
                        model_state(tmp_path / "checkpoints" / "step-0000002"))
    adapters = dict(ckpt.unet.named_parameters())
    assert result.trainable_parameters == sum(adapters[n[5:]].numel() for n in lora_names)
    assert all(adapters[n[5:]].abs().sum() > 0 for n in lora_names if ".lora_B." in n)

    # The released model is a plain UNet: W + (alpha / r) B A on the projections only.
    released, info = load_model(result.model_dir)
    assert not has_lora(released.unet) and not (result.model_dir / "unet_lora").exists()
    assert info.extra["lora"] == {"rank": 2, "alpha": 4.0, "merged": True}
    before, after = model_state(pretrained.model_dir), model_state(result.model_dir)
    targets = {f"unet.{t}.weight" for t in lora_target_names(base.unet)}
    assert changed_parameters(before, after) == targets
    for key in targets:
        module = key[5:-len(".weight")]
        a = adapters[f"{module}.lora_A.default.weight"].detach()
        b = adapters[f"{module}.lora_B.default.weight"].detach()
        torch.testing.assert_close(after[key], before[key] + 2.0 * (b @ a), rtol=0, atol=1e-6)


def test_a_lora_checkpoint_resumes_from_its_adapters(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path) -> None:
    spec = finetune_spec(trainable="lora", class_map=IDENTITY, dp_steps=3, dp_sample_rate=0.1,
                         checkpoint_every=2)
    first = train(spec, dataset_path=digits_path, out_dir=tmp_path / "a",
                  hooks=RecordingHooks(budget=2), base_model_dir=pretrained.model_dir,
                  _test_generator=seeded(1))
    assert (first.steps_completed, first.stopped_early) == (2, True)
    ckpt = tmp_path / "a" / "checkpoints" / "step-0000002"
    saved, _ = load_model(ckpt)
    second = train(spec, dataset_path=digits_path, out_dir=tmp_path / "b", resume_from=ckpt,
                   _test_generator=seeded(2))
    assert (second.steps_completed, second.stopped_early) == (3, False)
    resumed, _ = load_model(tmp_path / "b" / "checkpoints" / "step-0000003")
    before = dict(saved.unet.named_parameters())
    after = dict(resumed.unet.named_parameters())
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all(".lora_A." in n or ".lora_B." in n for n in changed)
    with pytest.raises(InvalidSpecError, match="rank"):
        train(finetune_spec(trainable="lora", lora_rank=8, class_map=IDENTITY, dp_steps=3,
                            dp_sample_rate=0.1, checkpoint_every=2),
              dataset_path=digits_path, out_dir=tmp_path / "c", resume_from=ckpt,
              _test_generator=seeded(3))


def test_a_fresh_class_table_keeps_the_pretrained_null_token() -> None:
    """New labels get new rows, but the unconditional (null) token — learnt on public data,
    and the only label a per-label model sees — is the base model's."""
    from dpsynth_ml.models.architectures import (
        ModelBundle,
        build_class_embedder,
        build_scheduler,
        build_unet,
        build_vae,
        preset_config,
        reset_class_embedder,
    )

    cfg = preset_config("tiny")
    old = build_class_embedder(10, cfg.cross_attention_dim)
    bundle = ModelBundle(vae=build_vae(cfg, channels=1, image_size=16),
                         unet=build_unet(cfg, latent_size=8), class_embedder=old,
                         scheduler=build_scheduler())
    null = old.weight[-1].detach().clone()
    new = reset_class_embedder(bundle, 3)
    assert new.weight.shape[0] == 4 and bundle.class_embedder is new
    assert torch.equal(new.weight[3], null)
    assert not torch.equal(new.weight[0], old.weight[0])
