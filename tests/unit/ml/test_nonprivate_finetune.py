"""The non-private finetune mode (benchmarks only): what it trains, what it never uses, and
that the platform's finetune runner can never reach it."""

from __future__ import annotations

import math
import uuid
from pathlib import Path
from typing import Any

import dpsynth_ml
import pytest
import torch
from dpsynth_ml import DpSpec, InvalidSpecError, TrainingResult, TrainingSpec, read_model_info
from dpsynth_ml import finetune as finetune_module
from dpsynth_ml.checkpoint import read_trainer_state
from dpsynth_ml.model_io import load_model
from dpsynth_ml.trainable import lora_target_names, plain_unet, trainable_parameter_names
from dpsynth_shared.job_specs import FinetuneSpec
from dpsynth_shared.worker_contract import DatasetInfo
from dpsynth_worker.runners.training_specs import finetune_training_spec
from pydantic import ValidationError

from tests.unit.worker.fakes import FakeLedger, FakeReservation

from .support import IMAGE_SIZE, NUM_RECORDS, RecordingHooks

IDENTITY = {i: i for i in range(10)}


def nonprivate_spec(**overrides: Any) -> TrainingSpec:
    fields: dict[str, Any] = dict(kind="finetune", preset="tiny", image_size=IMAGE_SIZE,
                                  nonprivate=True, batch_size=32, epochs=1,
                                  max_physical_batch_size=8, learning_rate=1e-3,
                                  class_map=IDENTITY, checkpoint_every=10)
    fields.update(overrides)
    return TrainingSpec(**fields)


def _state(model_dir: Path) -> dict[str, torch.Tensor]:
    bundle, _ = load_model(model_dir)
    state: dict[str, torch.Tensor] = {}
    for prefix, module in (("unet", plain_unet(bundle.unet, merge=False)),
                           ("class_embedder", bundle.class_embedder), ("vae", bundle.vae)):
        state.update({f"{prefix}.{k}": v for k, v in module.state_dict().items()})
    return state


def _changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> set[str]:
    assert before.keys() == after.keys()
    return {k for k in before if not torch.equal(before[k], after[k])}


def _moves(names: set[str]) -> set[str]:
    """The names a noiseless update moves: the class token is the cross-attention's only
    key, so its softmax is 1 whatever Q and K are and attn2's to_q / to_k (and norm2, which
    feeds only the query) get a zero gradient up to rounding (DP-SGD's noise always moves
    them; a plain step may not)."""
    return {n for n in names if not any(f".{p}." in n for p in ("attn2.to_q", "attn2.to_k",
                                                                 "transformer_blocks.0.norm2"))}


@pytest.fixture()
def no_dp_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any use of the DP engine (per-sample gradients, clipping, noise) fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the non-private mode must not build the DP engine")

    monkeypatch.setattr(finetune_module, "DpSgdEngine", refuse)


# --- the spec ------------------------------------------------------------------------------

def test_nonprivate_is_a_finetune_without_any_dp_spec() -> None:
    dp = DpSpec(noise_multiplier=1.0, sample_rate=0.1, expected_batch_size=8,
                max_grad_norm=1.0, steps=2)
    assert nonprivate_spec().nonprivate is True
    with pytest.raises(InvalidSpecError, match="nonprivate"):
        nonprivate_spec(dp=dp)
    with pytest.raises(InvalidSpecError, match="nonprivate"):
        nonprivate_spec(class_map=None, per_label_dp={"digit 0": dp})
    with pytest.raises(InvalidSpecError, match="nonprivate"):
        TrainingSpec(kind="pretrain", nonprivate=True)
    with pytest.raises(InvalidSpecError, match="nonprivate"):
        nonprivate_spec(privacy_unit="subject")
    # the default stays private: a finetune without a DpSpec is still refused
    with pytest.raises(InvalidSpecError, match="exactly one of dp"):
        nonprivate_spec(nonprivate=False)


# --- what it trains ------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["attention", "full"])
def test_it_trains_exactly_the_trainable_set_without_the_dp_engine(
        mode: str, pretrained: TrainingResult, digits_path: Path, tmp_path: Path,
        no_dp_engine: None) -> None:
    hooks = RecordingHooks()
    spec = nonprivate_spec(trainable=mode, epochs=2, checkpoint_every=3)
    result = dpsynth_ml.train(spec, dataset_path=digits_path, out_dir=tmp_path, hooks=hooks,
                              base_model_dir=pretrained.model_dir)
    steps = 2 * math.ceil(NUM_RECORDS / 32)
    assert (result.steps_completed, result.stopped_early) == (steps, False)
    # leases are still asked for (NullHooks/RecordingHooks grant them); no checkpoint
    assert [(a[0], a[1]) for a in hooks.acquired] == [(0, 3), (3, 3), (6, 2)]
    assert hooks.checkpoints == [] and not (tmp_path / "checkpoints").exists()
    # uniformly shuffled minibatches: full batches of 32, each epoch's last one the rest
    assert [s["batch_size"] for s in hooks.private_stats] == [32, 32, 32, 4] * 2
    assert all(math.isfinite(s["loss"]) for s in hooks.private_stats)
    base, _ = load_model(pretrained.model_dir)
    selected = set(trainable_parameter_names(base.unet, trainable=mode))  # type: ignore[arg-type]
    before, after = _state(pretrained.model_dir), _state(result.model_dir)
    assert _moves(selected) <= _changed(before, after) <= selected  # frozen: bit-identical
    assert result.trainable_parameters == sum(after[k].numel() for k in selected)
    info = read_model_info(result.model_dir)
    assert info.extra["nonprivate"] is True and info.training_kind == "finetune"
    assert info.extra["trainable"] == mode and info.steps == steps
    state = read_trainer_state(tmp_path)
    assert state["nonprivate"] is True and "dp" not in state


def test_lora_trains_only_the_adapters_and_releases_them_merged(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path,
        no_dp_engine: None) -> None:
    spec = nonprivate_spec(trainable="lora", lora_rank=2)
    result = dpsynth_ml.train(spec, dataset_path=digits_path, out_dir=tmp_path,
                              base_model_dir=pretrained.model_dir)
    base, _ = load_model(pretrained.model_dir)
    targets = {f"unet.{t}.weight" for t in lora_target_names(base.unet)}
    changed = _changed(_state(pretrained.model_dir), _state(result.model_dir))
    assert _moves(targets) <= changed <= targets
    info = read_model_info(result.model_dir)
    assert info.extra["nonprivate"] is True and info.extra["lora"]["merged"] is True
    assert result.trainable_parameters == sum(
        p.numel() for n, p in _lora_unet(pretrained.model_dir).named_parameters()
        if ".lora_" in n)


def _lora_unet(model_dir: Path) -> torch.nn.Module:
    from dpsynth_ml.trainable import add_lora

    bundle, _ = load_model(model_dir)
    add_lora(bundle.unet, rank=2, alpha=2.0)
    return bundle.unet


def test_same_seed_same_model_and_a_stop_is_honoured(
        pretrained: TrainingResult, digits_path: Path, tmp_path: Path) -> None:
    spec = nonprivate_spec(checkpoint_every=2)
    a = dpsynth_ml.train(spec, dataset_path=digits_path, out_dir=tmp_path / "a",
                         base_model_dir=pretrained.model_dir)
    b = dpsynth_ml.train(spec, dataset_path=digits_path, out_dir=tmp_path / "b",
                         base_model_dir=pretrained.model_dir)
    assert not _changed(_state(a.model_dir), _state(b.model_dir))
    stopped = dpsynth_ml.train(spec, dataset_path=digits_path, out_dir=tmp_path / "c",
                               hooks=RecordingHooks(budget=2),
                               base_model_dir=pretrained.model_dir)
    assert (stopped.steps_completed, stopped.stopped_early) == (2, True)
    with pytest.raises(InvalidSpecError, match="resume"):
        dpsynth_ml.train(spec, dataset_path=digits_path, out_dir=tmp_path / "d",
                         base_model_dir=pretrained.model_dir, resume_from=tmp_path / "a")


# --- the platform cannot reach it ----------------------------------------------------------

TRAININGS: list[dict[str, Any]] = [
    {},
    {"trainable": "full"},
    {"trainable": "lora", "lora_rank": 2},
    {"trainable": "blocks", "blocks": ["conv_out"], "noise_multiplicity": 2},
    {"class_map": {f"digit {i}": f"digit {i}" for i in range(10)}, "ema_decay": 0.9},
    {"class_conditional": False, "warmup_steps": 3},
]


@pytest.mark.parametrize("training", TRAININGS)
def test_the_worker_builds_a_dp_spec_from_every_finetune_job(
        training: dict[str, Any], pretrained: TrainingResult) -> None:
    """``dpsynth_worker.runners.training_specs.finetune_training_spec`` is the only place the
    worker turns a finetune job into a TrainingSpec: it never passes ``nonprivate`` (so the
    default False holds) and always passes the reservation's DpSpec (or per-label DpSpecs)."""
    ledger = FakeLedger()
    reservation = ledger.add(FakeReservation(
        reservation_id=f"res_{uuid.uuid4().hex}", job_id="job_x", dataset_id="ds_x",
        noise_multiplier=1.1, sample_rate=0.16, expected_batch_size=8, planned_steps=12,
        steps_reserved=12))
    spec = FinetuneSpec.model_validate({
        "type": "finetune", "dataset_id": "ds_x", "base_model_id": "mdl_x",
        "privacy": {"target_epsilon": 1.0, "max_grad_norm": 1.0},
        "training": {"expected_batch_size": 8, **training}})
    names = [f"digit {i}" for i in range(10)]
    built = finetune_training_spec(
        spec, reservation=ledger.get_reservation(reservation.reservation_id),
        dataset=DatasetInfo(dataset_id="ds_x", visibility="private", object_key="k",
                            class_names=names, declared_size=NUM_RECORDS, delta=1e-5),
        base=dpsynth_ml.read_model_info(pretrained.model_dir))
    assert isinstance(built, TrainingSpec)
    assert built.nonprivate is False
    # (epsilon, delta): the job's, for the fixed per-step work (dpsynth_ml.dp.padding)
    assert built.dp == DpSpec(noise_multiplier=1.1, sample_rate=0.16, expected_batch_size=8,
                              max_grad_norm=1.0, steps=12, epsilon=1.0, delta=1e-5)


def test_a_finetune_job_cannot_ask_for_the_nonprivate_mode() -> None:
    """A finetune job always carries a privacy block, and its training block has no field
    (and accepts no unknown key) that could turn the mode on."""
    base = {"type": "finetune", "dataset_id": "ds_x", "base_model_id": "mdl_x"}
    with pytest.raises(ValidationError):
        FinetuneSpec.model_validate(base)
    with pytest.raises(ValidationError):
        FinetuneSpec.model_validate({**base, "privacy": {"target_epsilon": 1.0},
                                     "training": {"nonprivate": True}})
    assert "nonprivate" not in FinetuneSpec.model_json_schema(mode="validation").__repr__()


def test_no_service_code_mentions_the_nonprivate_mode() -> None:
    """Only the ML core and the benchmarks know the mode: the worker (which builds every
    TrainingSpec the platform runs) and the api never name it."""
    import dpsynth_api
    import dpsynth_worker

    for package in (dpsynth_worker, dpsynth_api):
        root = Path(package.__file__).parent
        sources = sorted(root.rglob("*.py"))
        assert sources
        assert [p for p in sources if "nonprivate" in p.read_text()] == []
