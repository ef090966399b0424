"""The worker's device threading (issue 18): DPSYNTH_WORKER_DEVICES' first device reaches
every single-device ML call (generation, layouts, feature networks, evaluation), a pretrain
on a device setting goes through ``train_placed``, and the helper imports no torch."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dpsynth_ml
import pytest
import torch
from dpsynth_ml import LayoutSet, SampleResult, TrainingHooks, TrainingResult, TrainingSpec
from dpsynth_shared.worker_contract import Claim, DatasetInfo, ModelRef
from dpsynth_worker.devices import first_device
from dpsynth_worker.ml_adapter import MlAdapter
from dpsynth_worker.ml_port import Progress, Sampler
from dpsynth_worker.runners import Outcome
from dpsynth_worker.runners.artifacts import model_key

from tests.unit.worker.conftest import CLASS_NAMES, World


@pytest.mark.parametrize(("setting", "device"), [
    ("cpu", "cpu"), ("cuda", "cuda:0"), ("cuda:all", "cuda:0"), (" CUDA:1 , cuda:2", "cuda:1"),
    ("cpu,cpu", "cpu"), ("", "cpu")])
def test_first_device_of_a_setting(setting: str, device: str) -> None:
    assert first_device(setting) == device


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only resolution")
def test_auto_is_the_cpu_without_a_gpu() -> None:
    assert first_device("auto") == "cpu"


def test_the_helper_imports_no_torch() -> None:
    code = "import sys, dpsynth_worker.devices; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


@dataclass(frozen=True, kw_only=True)
class DeviceCore(MlAdapter):
    """The real core, recording the device each call was given (and running on the CPU,
    since this machine has no ``cuda:1``)."""

    seen: list[tuple[str, Any]] = field(default_factory=list)

    def sample(self, model_dir: Path, *, samples_per_class: int, sampler: Sampler, steps: int,
               guidance_scale: float, seed: int, out_dir: Path, batch_size: int,
               layouts: LayoutSet | None, progress: Progress | None,
               device: str = "cpu") -> SampleResult:
        self.seen.append(("sample", device))
        return super().sample(model_dir, samples_per_class=samples_per_class,
                              sampler=sampler, steps=steps, guidance_scale=guidance_scale,
                              seed=seed, out_dir=out_dir, batch_size=batch_size,
                              layouts=layouts, progress=progress, device="cpu")

    def train_placed(self, setting: str, spec: TrainingSpec, *, dataset_path: Path,
                     out_dir: Path, hooks: TrainingHooks, base_model_dir: Path | None = None,
                     resume_from: Path | None = None) -> TrainingResult:
        self.seen.append(("train_placed", setting))
        return super().train(spec, dataset_path=dataset_path, out_dir=out_dir, hooks=hooks,
                             base_model_dir=base_model_dir, resume_from=resume_from)


def test_generate_samples_on_the_first_device(world: World) -> None:
    model_id = world.upload_model()
    ref = ModelRef(model_id=model_id, object_key=model_key(model_id))
    spec = {"type": "generate", "model_id": model_id, "samples_per_class": 1,
            "sampler": "ddim", "steps": 1, "guidance_scale": 1.0, "seed": 7}
    claim = Claim(job_id=world.job_id, tenant_id="ten_x", attempt=1, type="generate",
                  spec=spec, base_model=ref, lease_ttl_s=60, heartbeat_s=10)
    core = DeviceCore(devices="cuda:1,cuda:2")
    assert world.run(claim, ml=core) == Outcome.SUCCEEDED
    assert core.seen == [("sample", "cuda:1")]


def test_a_pretrain_on_a_device_setting_is_placed(world: World) -> None:
    spec = {"type": "pretrain", "dataset_id": "ds_pub", "preset": "tiny", "image_size": 16,
            "epochs": 1, "batch_size": 50}
    key = "public/datasets/ds_pub/data.npz"
    world.store.put_file(key, world.digits_npz)
    claim = Claim(job_id=world.job_id, tenant_id="ten_x", attempt=1, type="pretrain",
                  spec=spec, dataset=DatasetInfo(dataset_id="ds_pub", visibility="public",
                                                 object_key=key, class_names=CLASS_NAMES),
                  lease_ttl_s=60, heartbeat_s=10)
    core = DeviceCore(devices="cuda:0")
    assert world.run(claim, ml=core) == Outcome.SUCCEEDED
    assert core.seen == [("train_placed", "cuda:0")]


def test_the_adapter_forwards_every_device(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: dict[str, Any] = {}
    for name in ("sample", "sample_layouts", "train_feature_net", "evaluate_corpus"):
        monkeypatch.setattr(dpsynth_ml, name,
                            lambda *a, _n=name, **kw: calls.__setitem__(_n, kw["device"]))
    core, path = MlAdapter(), Path("x")
    core.sample(path, samples_per_class=1, sampler="ddim", steps=1, guidance_scale=1.0,
                seed=0, out_dir=path, batch_size=1, layouts=None, progress=None,
                device="cuda:3")
    core.sample_layouts(path, counts={}, seed=0, sampler="ddim", steps=1, guidance_scale=1.0,
                        batch_size=1, per_class=True, progress=None, device="cuda:3")
    core.train_feature_net(None, None, class_names=[], image_size=8, channels=1,  # type: ignore[arg-type]
                           epochs=1, batch_size=1, learning_rate=0.1, seed=0, out_dir=path,
                           val_images=None, val_labels=None, validation_fraction=0.1,
                           progress=None, device="cuda:3")
    core.evaluate_corpus(None, None, None, classifiers=[], feature_net_dir=None,  # type: ignore[arg-type]
                         feature_check=None, min_feature_accuracy=0.5, prdc_k=5,
                         max_images=10, seed=0, inception_weights=None, progress=None,
                         device="cuda:3")
    assert calls == dict.fromkeys(("sample", "sample_layouts", "train_feature_net",
                                   "evaluate_corpus"), "cuda:3")
    monkeypatch.setattr(dpsynth_ml, "sample", lambda *a, **kw: calls.__setitem__("d", kw))
    core.sample(path, samples_per_class=1, sampler="ddim", steps=1, guidance_scale=1.0,
                seed=0, out_dir=path, batch_size=1, layouts=None, progress=None)
    assert calls["d"]["device"] == "cpu"  # the default keeps today's behaviour
