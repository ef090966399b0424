"""The pretraining cache of the benchmarks (benchmarks/pretrain_cache.py): a second run with
the same inputs reuses the model, any change of what the weights depend on trains again, a
corrupted entry is detected, ``off`` never touches the cache, concurrent writers leave one
valid entry, only a public pretraining goes through it, and a size cap evicts the least
recently used entries (never the one just stored)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
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


# --- eviction (least recently used, under a size cap) ---------------------------------------


def _size(entry_dir: Path) -> int:
    return sum(p.stat().st_size for p in entry_dir.rglob("*") if p.is_file())


def _age(cache: Path, key: str, seconds_ago: float) -> None:
    """Pretend the entry was last used ``seconds_ago`` (mtime resolution plays no part)."""
    when = time.time() - seconds_ago
    os.utime(cache / key / "entry.json", (when, when))


def _seeded(seed: int) -> PretrainTraining:
    return dataclasses.replace(SPEC, seed=seed)


def test_the_least_recently_used_entry_is_evicted_and_a_hit_refreshes_recency(
        monkeypatch: pytest.MonkeyPatch, public: Path, cache: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    trainer = Counting(monkeypatch, fake_train)
    a, b = (pc.cached_pretrain(_seeded(s), public, label=f"t{s}", cache_dir=cache)
            for s in (0, 1))
    _age(cache, a.key, 300)  # a is the older by its store...
    _age(cache, b.key, 200)
    entry_a = (cache / a.key / "entry.json").read_bytes()
    assert pc.cached_pretrain(_seeded(0), public, label="t0", cache_dir=cache).cache == "hit"
    assert (cache / a.key / "entry.json").read_bytes() == entry_a  # touched, not rewritten
    assert (cache / a.key / "entry.json").stat().st_mtime > time.time() - 60
    # ...but hit since: storing c over a cap of two entries evicts b, the least recently used
    c_key = pc.cache_key(pc.key_inputs(_seeded(2), public))
    cap = _size(cache / a.key) + _size(cache / b.key) + _size(cache / a.key) // 2
    capsys.readouterr()
    c = pc.cached_pretrain(_seeded(2), public, label="t2", cache_dir=cache, max_bytes=cap)
    assert c.key == c_key and c.cache == "miss" and trainer.calls == 3
    assert _entries(cache) == sorted([a.key, c.key])
    log = capsys.readouterr().out
    assert log.count("evicted") == 1 and f"evicted {b.key[:12]} (t1," in log
    assert c.model_dir.is_dir() and a.model_dir.is_dir()
    assert pc.cached_pretrain(_seeded(0), public, label="t0", cache_dir=cache,
                              max_bytes=cap).cache == "hit"
    assert pc.cached_pretrain(_seeded(1), public, label="t1", cache_dir=cache,
                              max_bytes=cap).cache == "miss"  # b was evicted: trained again
    assert trainer.calls == 4
    assert _entries(cache) == sorted([a.key, b.key])  # c was now the least recently used


def test_the_entry_just_stored_stays_even_when_larger_than_the_cap(
        monkeypatch: pytest.MonkeyPatch, public: Path, cache: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    Counting(monkeypatch, fake_train)
    old = [pc.cached_pretrain(_seeded(s), public, label="t", cache_dir=cache).key
           for s in (0, 1)]
    for i, key in enumerate(old):
        _age(cache, key, 100 - i)
    capsys.readouterr()
    new = pc.cached_pretrain(_seeded(2), public, label="t", cache_dir=cache, max_bytes=1)
    assert _entries(cache) == [new.key]
    log = capsys.readouterr().out
    assert log.index(f"evicted {old[0][:12]}") < log.index(f"evicted {old[1][:12]}")
    assert f"entry {new.key[:12]} alone" in log and "kept" in log
    again = pc.cached_pretrain(_seeded(2), public, label="t", cache_dir=cache, max_bytes=1)
    assert again.cache == "hit" and again.model_dir == new.model_dir  # a hit does not prune
    entry = json.loads((cache / new.key / "entry.json").read_text())
    assert entry["model_hash"] == model_hash(new.model_dir)


def test_no_eviction_under_the_default_cap(
        monkeypatch: pytest.MonkeyPatch, public: Path, cache: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    Counting(monkeypatch, fake_train)
    keys = [pc.cached_pretrain(_seeded(s), public, label="t", cache_dir=cache).key
            for s in range(3)]
    assert _entries(cache) == sorted(keys) and "evicted" not in capsys.readouterr().out


def test_the_cap_comes_from_the_argument_or_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert pc.resolve_max_bytes() == 10 * 10**9
    monkeypatch.setenv(pc.MAX_GB_ENV, " ")
    assert pc.resolve_max_bytes() == 10 * 10**9
    monkeypatch.setenv(pc.MAX_GB_ENV, "2.5")
    assert pc.resolve_max_bytes() == 2_500_000_000
    assert pc.resolve_max_bytes(1234) == 1234  # the argument wins
    monkeypatch.setenv(pc.MAX_GB_ENV, "1e-12")
    assert pc.resolve_max_bytes() == 1  # tiny but positive: at least one byte


def test_the_cap_from_the_environment_prunes(
        monkeypatch: pytest.MonkeyPatch, public: Path, cache: Path) -> None:
    trainer = Counting(monkeypatch, fake_train)
    first = pc.cached_pretrain(_seeded(0), public, label="t", cache_dir=cache)
    monkeypatch.setenv(pc.MAX_GB_ENV, "1e-9")  # one byte
    second = pc.cached_pretrain(_seeded(1), public, label="t", cache_dir=cache)
    assert _entries(cache) == [second.key] and first.key != second.key
    assert trainer.calls == 2


@pytest.mark.parametrize("value", ["0", "-1", "-0.5", "abc", "nan", "inf", "10GB"])
def test_a_bad_cap_is_refused_before_anything_is_trained(
        value: str, monkeypatch: pytest.MonkeyPatch, public: Path, cache: Path) -> None:
    trainer = Counting(monkeypatch, fake_train)
    monkeypatch.setenv(pc.MAX_GB_ENV, value)
    with pytest.raises(ValueError, match=pc.MAX_GB_ENV):
        pc.resolve_max_bytes()
    with pytest.raises(ValueError, match=pc.MAX_GB_ENV):
        pc.cached_pretrain(SPEC, public, label="t", cache_dir=cache)
    assert trainer.calls == 0 and not cache.exists()


@pytest.mark.parametrize("value", [0, -5, 1.5, True])
def test_a_bad_max_bytes_argument_is_refused(
        value: Any, monkeypatch: pytest.MonkeyPatch, public: Path, cache: Path) -> None:
    trainer = Counting(monkeypatch, fake_train)
    with pytest.raises(ValueError, match="max_bytes"):
        pc.cached_pretrain(SPEC, public, label="t", cache_dir=cache, max_bytes=value)
    assert trainer.calls == 0


def test_pruning_cleans_trash_and_ignores_temporaries_and_other_directories(
        monkeypatch: pytest.MonkeyPatch, public: Path, cache: Path) -> None:
    Counting(monkeypatch, fake_train)
    first = pc.cached_pretrain(_seeded(0), public, label="t", cache_dir=cache)
    _age(cache, first.key, 100)
    trash = cache / f".trash-{first.key[:16]}-deadbeef"
    (trash / "model").mkdir(parents=True)
    (trash / "model" / "weights").write_bytes(b"\0" * 100_000)
    writing = cache / ".tmp-0123456789abcdef-x"  # a writer still training: never touched
    (writing / "train").mkdir(parents=True)
    (writing / "train" / "weights").write_bytes(b"\0" * 100_000)
    stray = cache / "notes"  # no entry.json: not an entry, neither counted nor evicted
    stray.mkdir()
    (stray / "big").write_bytes(b"\0" * 100_000)
    # room for two entries, far less than any of the leftovers
    cap = 3 * _size(cache / first.key)
    second = pc.cached_pretrain(_seeded(1), public, label="t", cache_dir=cache, max_bytes=cap)
    assert not trash.exists()
    assert (writing / "train" / "weights").exists() and (stray / "big").exists()
    assert _entries(cache) == sorted([writing.name, first.key, second.key, "notes"])
