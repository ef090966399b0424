"""The pretraining cache of the benchmarks (benchmarks/pretrain_cache.py): a second run with
the same inputs reuses the model, any change of what the weights depend on trains again, a
corrupted entry is detected, ``off`` never touches the cache, concurrent writers leave one
valid entry, and only a public pretraining goes through it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dpsynth_ml import Architecture, PretrainTraining, TrainingResult
from dpsynth_ml.models.model_io import load_model, model_hash

from benchmarks import pretrain_cache as pc
from tests.unit.ml.support import IMAGE_SIZE, finetune_spec, write_digits

SPEC = PretrainTraining(preset="tiny", image_size=IMAGE_SIZE, epochs=1, batch_size=20,
                        learning_rate=1e-3, seed=0)


@pytest.fixture(autouse=True)
def _no_user_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test sees the user's cache: no $DPSYNTH_PRETRAIN_CACHE, HOME in tmp_path."""
    monkeypatch.delenv(pc.ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture()
def public(tmp_path: Path) -> Path:
    """Twenty public sklearn digits (two of each class)."""
    return write_digits(tmp_path / "public.npz", n=20)


@pytest.fixture()
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


class Counting:
    """Wraps the trainer (the real one, or ``fake``) and counts its calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, inner: Callable[..., Any] | None = None,
                 ) -> None:
        self.calls = 0
        self.inner = inner or pc._run_train
        monkeypatch.setattr(pc, "_run_train", self)

    def __call__(self, spec: PretrainTraining, dataset_path: Path,
                 out_dir: Path) -> tuple[TrainingResult, float]:
        self.calls += 1
        result: tuple[TrainingResult, float] = self.inner(spec, dataset_path, out_dir)
        return result


def fake_train(spec: PretrainTraining, dataset_path: Path,
               out_dir: Path) -> tuple[TrainingResult, float]:
    """A stand-in trainer: a small model directory whose bytes depend on spec and data."""
    model = Path(out_dir) / "model"
    (model / "unet").mkdir(parents=True)
    seed = hashlib.sha256(repr(spec).encode() + Path(dataset_path).read_bytes()).digest()
    (model / "unet" / "diffusion_pytorch_model.safetensors").write_bytes(seed * 8)
    (model / "dpsynth_model.json").write_text("{}")
    return TrainingResult(steps_completed=2, stopped_early=False, model_dir=model,
                          trainable_parameters=5, total_parameters=5, rng="os"), 0.25


def _entries(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


# --- hit and miss ---------------------------------------------------------------------------


def test_second_call_with_the_same_inputs_is_a_hit_and_does_not_train(
        monkeypatch: pytest.MonkeyPatch, public: Path, cache: Path) -> None:
    trainer = Counting(monkeypatch)  # the real ML core, tiny preset
    first = pc.cached_pretrain(SPEC, public, label="t", cache_dir=cache)
    second = pc.cached_pretrain(SPEC, public, label="t", cache_dir=cache)
    assert trainer.calls == 1
    assert (first.cache, second.cache) == ("miss", "hit")
    assert first.key == second.key and _entries(cache) == [first.key]
    assert first.model_dir == second.model_dir == cache / first.key / "model"
    assert second.result.steps_completed == first.result.steps_completed > 0
    assert second.result.total_parameters == first.result.total_parameters
    load_model(second.model_dir)  # a usable model directory
    entry = json.loads((cache / first.key / "entry.json").read_text())
    assert entry["model_hash"] == model_hash(second.model_dir)
    assert entry["inputs"]["dataset_sha256"] == hashlib.sha256(public.read_bytes()).hexdigest()
    assert pc.cache_key(entry["inputs"]) == first.key
    record = second.record()
    assert record["cache"] == "hit" and record["key"] == first.key
    assert record["pretrain_s"] == first.record()["pretrain_s"] and "reuse_s" in record
    # a flipped byte in one of the real model's weights files is caught (retrained by a
    # stand-in trainer: a second real pretraining would only cost time)
    _flip_a_byte(sorted(second.model_dir.rglob("*.safetensors"))[0])
    trainer.inner = fake_train
    assert pc.cached_pretrain(SPEC, public, label="t", cache_dir=cache).cache == "miss"
    assert trainer.calls == 2


def test_every_spec_field_is_in_the_key(public: Path) -> None:
    keyed = pc.key_inputs(SPEC, public)["spec"]
    assert {f.name for f in dataclasses.fields(PretrainTraining)} <= set(keyed)
    alternatives: dict[str, Any] = dict(
        image_size=32, channels=3, class_conditional=False, target="masks", num_classes=3,
        learning_rate=2e-3, label_dropout=0.2, preset="small", layout_conditioning=True,
        epochs=2, batch_size=10, seed=1, space="pixel")
    base = pc.cache_key(pc.key_inputs(SPEC, public))
    keys = {base}
    for name, value in alternatives.items():
        keys.add(pc.cache_key(pc.key_inputs(dataclasses.replace(SPEC, **{name: value}),
                                             public)))
    for unet in ({"layers_per_block": 1}, {"layers_per_block": 2}):
        custom = dataclasses.replace(SPEC, preset="custom",
                                     architecture=Architecture(unet=unet))
        keys.add(pc.cache_key(pc.key_inputs(custom, public)))
    assert len(keys) == 1 + len(alternatives) + 2


@pytest.mark.parametrize("change", ["spec", "dataset", "source"])
def test_a_change_of_spec_data_or_ml_core_is_a_miss(
        change: str, monkeypatch: pytest.MonkeyPatch, public: Path, cache: Path,
        tmp_path: Path) -> None:
    trainer = Counting(monkeypatch, fake_train)
    original = pc.ml_core_digest()
    first = pc.cached_pretrain(SPEC, public, label="t", cache_dir=cache)
    spec, data = SPEC, public
    if change == "spec":
        spec = dataclasses.replace(SPEC, seed=1)
    elif change == "dataset":
        data = write_digits(tmp_path / "other.npz", n=21)
    else:
        monkeypatch.setattr(pc, "ml_core_digest", lambda: "0" * 64)
    changed = pc.cached_pretrain(spec, data, label="t", cache_dir=cache)
    assert changed.cache == "miss" and changed.key != first.key and trainer.calls == 2
    assert pc.cached_pretrain(spec, data, label="t", cache_dir=cache).cache == "hit"
    monkeypatch.setattr(pc, "ml_core_digest", lambda: original)
    assert pc.cached_pretrain(SPEC, public, label="t", cache_dir=cache).cache == "hit"
    assert trainer.calls == 2 and len(_entries(cache)) == 2


def test_the_ml_core_digest_covers_every_source_file_by_path_and_bytes(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import dpsynth_ml

    real = pc.ml_core_digest()
    assert len(real) == 64 and real == pc.ml_core_digest()
    package = tmp_path / "pkg"
    (package / "training").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "training" / "pretrain.py").write_text("EPOCHS = 1\n")
    (package / "README.md").write_text("not source")
    monkeypatch.setattr(dpsynth_ml, "__file__", str(package / "__init__.py"))
    digests = [pc.ml_core_digest()]
    (package / "README.md").write_text("still not source")
    assert pc.ml_core_digest() == digests[0]
    (package / "training" / "pretrain.py").write_text("EPOCHS = 2\n")
    digests.append(pc.ml_core_digest())
    (package / "training" / "pretrain.py").rename(package / "training" / "train.py")
    digests.append(pc.ml_core_digest())
    (package / "extra.py").write_text("")
    digests.append(pc.ml_core_digest())
    assert len(set(digests)) == 4 and real not in digests


# --- corruption -----------------------------------------------------------------------------


def test_a_corrupted_weights_file_is_detected_and_retrained(
        monkeypatch: pytest.MonkeyPatch, public: Path, cache: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    trainer = Counting(monkeypatch, fake_train)
    first = pc.cached_pretrain(SPEC, public, label="t", cache_dir=cache)
    _flip_a_byte(sorted(first.model_dir.rglob("*.safetensors"))[0])
    again = pc.cached_pretrain(SPEC, public, label="t", cache_dir=cache)
    assert again.cache == "miss" and trainer.calls == 2
    assert "discarding cached entry" in capsys.readouterr().out
    assert _entries(cache) == [first.key]
    assert pc.cached_pretrain(SPEC, public, label="t", cache_dir=cache).cache == "hit"
    assert trainer.calls == 2


@pytest.mark.parametrize("damage", ["garbage", "missing", "missing_weights", "other_key"])
def test_a_missing_or_corrupt_entry_is_discarded_and_retrained(
        damage: str, monkeypatch: pytest.MonkeyPatch, public: Path, cache: Path) -> None:
    trainer = Counting(monkeypatch, fake_train)
    first = pc.cached_pretrain(SPEC, public, label="t", cache_dir=cache)
    entry = cache / first.key / "entry.json"
    if damage == "garbage":
        entry.write_text("{not json")
    elif damage == "missing":
        entry.unlink()
    elif damage == "missing_weights":
        (cache / first.key / "model" / "unet" / "diffusion_pytorch_model.safetensors").unlink()
    else:
        entry.write_text(json.dumps({**json.loads(entry.read_text()), "key": "f" * 64}))
    again = pc.cached_pretrain(SPEC, public, label="t", cache_dir=cache)
    assert again.cache == "miss" and trainer.calls == 2
    assert pc.cached_pretrain(SPEC, public, label="t", cache_dir=cache).cache == "hit"


# --- off, concurrency, refusal --------------------------------------------------------------


def test_off_always_trains_and_writes_nothing_to_the_cache(
        monkeypatch: pytest.MonkeyPatch, public: Path, cache: Path, tmp_path: Path) -> None:
    trainer = Counting(monkeypatch, fake_train)
    pc.cached_pretrain(SPEC, public, label="t", cache_dir=cache)  # a valid entry exists
    before = _entries(cache)
    monkeypatch.setenv(pc.ENV, "off")
    for i in range(2):
        for cache_dir in (cache, None):
            scratch = tmp_path / f"scratch-{i}-{cache_dir is None}"
            out = pc.cached_pretrain(SPEC, public, label="t", cache_dir=cache_dir,
                                     scratch_dir=scratch)
            assert out.cache == "off" and out.record()["cache"] == "off"
            assert scratch in out.model_dir.parents
    assert trainer.calls == 1 + 4
    assert _entries(cache) == before
    assert not (tmp_path / "home" / ".cache").exists()


def test_the_cache_directory_comes_from_the_argument_the_environment_or_home(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert pc.resolve_cache_dir() == tmp_path / "home" / ".cache" / "dpsynth" / "pretrain"
    assert pc.resolve_cache_dir(tmp_path / "x") == tmp_path / "x"
    assert pc.resolve_cache_dir("off") is None
    monkeypatch.setenv(pc.ENV, str(tmp_path / "env"))
    assert pc.resolve_cache_dir() == tmp_path / "env"
    assert pc.resolve_cache_dir(tmp_path / "x") == tmp_path / "x"
    monkeypatch.setenv(pc.ENV, "OFF")
    assert pc.resolve_cache_dir() is None and pc.resolve_cache_dir(tmp_path / "x") is None


def test_concurrent_writers_with_the_same_key_end_with_one_valid_entry(
        monkeypatch: pytest.MonkeyPatch, public: Path, cache: Path) -> None:
    both_training = threading.Barrier(2, timeout=30)

    def slow(spec: PretrainTraining, dataset_path: Path,
             out_dir: Path) -> tuple[TrainingResult, float]:
        both_training.wait()  # both looked the key up and missed before either stores
        time.sleep(0.05)
        return fake_train(spec, dataset_path, out_dir)

    trainer = Counting(monkeypatch, slow)
    results: list[pc.Pretrained] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(pc.cached_pretrain(SPEC, public, label="t", cache_dir=cache))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(results) == 2 and trainer.calls == 2
    key = results[0].key
    assert _entries(cache) == [key]  # no temporary or discarded directory is left
    assert {r.model_dir for r in results} == {cache / key / "model"}
    assert {r.cache for r in results} == {"miss"}
    entry = json.loads((cache / key / "entry.json").read_text())
    assert entry["model_hash"] == model_hash(cache / key / "model")
    assert pc.cached_pretrain(SPEC, public, label="t", cache_dir=cache).cache == "hit"
    assert trainer.calls == 2


def test_only_a_public_pretraining_goes_through_the_cache(
        monkeypatch: pytest.MonkeyPatch, public: Path, cache: Path) -> None:
    trainer = Counting(monkeypatch, fake_train)
    with pytest.raises(TypeError, match="only public pretrainings"):
        pc.cached_pretrain(finetune_spec(), public, label="t",  # type: ignore[arg-type]
                           cache_dir=cache)
    assert trainer.calls == 0 and not cache.exists()


# --- the benchmarks' results ----------------------------------------------------------------


def test_the_fmnist_table_says_when_a_pretraining_was_reused() -> None:
    from benchmarks.common import read_results
    from benchmarks.fmnist_privacy_utility import table_markdown

    doc = read_results("fmnist_privacy_utility")
    if doc is None:
        pytest.skip("no benchmarks/results/fmnist_privacy_utility.json")
    results = doc["results"]
    assert "pretraining cache" not in table_markdown(results)  # results before the cache
    source = next(iter(results["sources"].values()))
    source["pretrain_cache"] = {"cache": "hit", "key": "ab" * 32, "pretrain_s": 534.2,
                                "reuse_s": 0.02}
    text = table_markdown(results)
    assert "reused from the pretraining cache" in text and "trained once in 534 s" in text
