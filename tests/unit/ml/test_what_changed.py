"""After a DP finetune, exactly the DP-updated parameters changed, each via per-sample grads."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
import torch
from dpsynth_ml import TrainingResult, train
from dpsynth_ml.dp import DpSgdEngine
from dpsynth_ml.models.model_io import load_model
from dpsynth_ml.training.finetune import setup as ft_setup

from .support import finetune_spec, seeded


class RecordingEngine(DpSgdEngine):
    """The real engine, recording which parameters had per-sample grads and were updated."""

    instances: ClassVar[list[RecordingEngine]] = []

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.names = {id(p): n.removeprefix("_module.")
                      for n, p in self.module.named_parameters()}
        self.with_grad_sample: set[str] = set()
        self.updated = {self.names[id(p)] for p in self.params}
        RecordingEngine.instances.append(self)

    def per_sample_norms(self) -> torch.Tensor:
        for p in self.params:
            if getattr(p, "grad_sample", None) is not None:
                self.with_grad_sample.add(self.names[id(p)])
        return super().per_sample_norms()


def _state(model_dir: Path) -> dict[str, torch.Tensor]:
    bundle, _ = load_model(model_dir)
    state: dict[str, torch.Tensor] = {}
    for prefix, module in (("unet", bundle.unet), ("class_embedder", bundle.class_embedder),
                           ("vae", bundle.vae)):
        # state_dict holds parameters AND buffers.
        state.update({f"{prefix}.{k}": v for k, v in module.state_dict().items()})
    return state


def _changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> set[str]:
    assert before.keys() == after.keys()
    return {k for k in before if not torch.equal(before[k], after[k])}


@pytest.fixture()
def recording(monkeypatch: pytest.MonkeyPatch) -> type[RecordingEngine]:
    RecordingEngine.instances = []
    monkeypatch.setattr(ft_setup, "DpSgdEngine", RecordingEngine)
    # these tests read opacus' per-sample gradients: keep the hooks engine for every set
    monkeypatch.setattr(ft_setup, "choose_engine", lambda *args, **kwargs: "hooks")
    return RecordingEngine


def test_attention_finetune_changes_exactly_the_dp_updated_attention_params(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path,
        recording: type[RecordingEngine]) -> None:
    spec = finetune_spec(trainable="attention", class_map={i: i for i in range(10)},
                         dp_steps=4, dp_sample_rate=0.2)
    result = train(spec, dataset_path=digits_path, out_dir=tmp_path,
                   base_model_dir=pretrained.model_dir, _test_generator=seeded())
    (engine,) = recording.instances
    changed = _changed(_state(pretrained.model_dir), _state(result.model_dir))
    assert changed == engine.updated
    assert changed <= engine.with_grad_sample
    assert all(".attn1." in k or ".attn2." in k for k in changed)
    assert not any(k.startswith(("vae.", "class_embedder.")) for k in changed)
    assert any(".to_q." in k for k in changed) and any(".attn2.to_k." in k for k in changed)
    after = _state(result.model_dir)
    assert result.trainable_parameters == sum(after[k].numel() for k in changed)
    assert 0 < result.trainable_parameters < result.total_parameters


def test_full_finetune_with_new_labels_trains_unet_and_embedder_not_vae(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path,
        recording: type[RecordingEngine]) -> None:
    spec = finetune_spec(trainable="full", class_map=None, dp_steps=2, dp_sample_rate=0.1)
    result = train(spec, dataset_path=digits_path, out_dir=tmp_path,
                   base_model_dir=pretrained.model_dir, _test_generator=seeded())
    (engine,) = recording.instances
    before, after = _state(pretrained.model_dir), _state(result.model_dir)
    changed = _changed(before, after)
    unet_keys = {k for k in before if k.startswith("unet.")}
    assert changed == engine.updated == unet_keys | {"class_embedder.weight"}
    assert changed <= engine.with_grad_sample
