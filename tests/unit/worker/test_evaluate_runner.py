"""The feature_net and evaluate runners with fake ports and a real local store.

feature_net runs the real ML core (a tiny network on 8x8 digits). The evaluate tests here use
a fake ``evaluate_corpus`` (it checks what the runner hands it and answers with real
memorisation figures) to pin the runner's own duties: grants, refusals, labels, keys, the
result's keys and what a failure may say. ``tests/integration/worker/test_evaluate_runner.py``
runs the real metrics end to end on a real S3 server.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
import uuid
import zipfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dpsynth_ml import ImageDataset, InvalidSpecError
from dpsynth_ml.evaluation import memorisation
from dpsynth_ml.evaluation.corpus import EvaluationResult
from dpsynth_ml.evaluation.errors import InceptionWeightsUnavailable
from dpsynth_shared.errors import DpsynthError
from dpsynth_shared.grants import GrantClaims, sign_grant
from dpsynth_shared.job_states import JobState
from dpsynth_shared.ledger_contract import ReadGrant
from dpsynth_shared.worker_contract import (
    Claim,
    CorpusRef,
    DatasetInfo,
    HeartbeatReply,
    ModelRef,
)
from dpsynth_worker.runners import Outcome
from dpsynth_worker.runners.artifacts import PROVENANCE_FILE, model_key
from dpsynth_worker.runners.corpus_zip import class_dirs, read_corpus
from dpsynth_worker.runners.feature_net import validation_split
from dpsynth_worker.runtime import build_runtime
from dpsynth_worker.settings import WorkerSettings
from PIL import Image

from tests.unit.worker.conftest import CLASS_NAMES, World
from tests.unit.worker.fakes import FakeLedger, MetricsCore

EVALUATE_RESULT_KEYS = {"report_artifact_id", "report_html_artifact_id", "non_dp",
                        "contains_private_images"}


@dataclass
class EvalLedger(FakeLedger):
    """The fake ledger plus evaluation grants for the budget's private prefix."""

    evaluations: dict[str, str] = field(default_factory=dict)  # evaluation id -> budget

    def evaluation_grant(self, evaluation_id: str, *, attempt: int,
                         worker_id: str) -> ReadGrant:
        self.calls.append(("evaluation_grant", {"evaluation_id": evaluation_id,
                                                "attempt": attempt, "worker_id": worker_id}))
        budget = self.evaluations[evaluation_id]
        expires = time.time() + 600
        claims = GrantClaims(grant_id=f"grt_{uuid.uuid4().hex}", dataset_id=budget,
                             reservation_id=evaluation_id, job_id="job_eval", attempt=attempt,
                             expires_at=expires)
        return ReadGrant(token=sign_grant(claims, self.signing_key), dataset_id=budget,
                         reservation_id=evaluation_id, attempt=attempt,
                         expires_at=datetime.fromtimestamp(expires, UTC))


@pytest.fixture()
def ledger() -> EvalLedger:
    return EvalLedger()


@dataclass
class FakeMetrics:
    """``evaluate_corpus`` that records its inputs; ``fail_with`` makes it raise."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    fail_with: Exception | None = None

    def __call__(self, synthetic: ImageDataset, train: ImageDataset, holdout: ImageDataset,
                 **kwargs: Any) -> EvaluationResult:
        folder = kwargs.get("feature_net_dir")
        self.calls.append({"synthetic": synthetic, "train": train, "holdout": holdout,
                           "feature_files": sorted(p.name for p in Path(folder).iterdir())
                           if folder else [], **kwargs})
        if kwargs.get("progress"):
            kwargs["progress"](1, 2)
        if self.fail_with is not None:
            raise self.fail_with
        mem = memorisation(synthetic.images, train.images, holdout.images, space="pixel")
        document = {
            "sizes": {"synthetic": len(synthetic), "real_train": len(train),
                      "real_holdout": len(holdout)},
            "headline": {"tstr_accuracy": {"cnn": 0.5}, "real_accuracy": {"cnn": 0.9},
                         "memorisation_flagged": int(mem.flagged.sum())},
            "classifiers": [{"classifier": "cnn", "train_on": on, "accuracy": a,
                             "train_size": 10, "test_size": len(holdout), "chance": 0.1}
                            for on, a in (("synthetic", 0.5), ("real", 0.9))],
            "memorisation": [mem.summary()], "notes": [], "settings": {"cnn": {"epochs": 1}},
            "per_class": {}}
        sets = {"synthetic": synthetic, "real_train": train, "real_holdout": holdout}
        return EvaluationResult(document=document, class_names=train.class_names,
                                images={k: v.images for k, v in sets.items()},
                                labels={k: v.labels for k, v in sets.items()},
                                memorisation={"pixel": mem})


def _npz(path: Path, images: np.ndarray, labels: np.ndarray) -> Path:
    np.savez(path, images=images, labels=labels.astype(np.int64),
             class_names=np.array(CLASS_NAMES))
    return path


def _digits(world: World) -> tuple[np.ndarray, np.ndarray]:
    with np.load(world.digits_npz) as npz:
        return npz["images"], npz["labels"]


def _corpus_zip(world: World, images: np.ndarray, labels: np.ndarray, *,
                names: list[str] | None = None, extra: dict[str, bytes] | None = None) -> str:
    names = names or CLASS_NAMES
    dirs = class_dirs(names)
    buffer = io.BytesIO()
    counts: dict[str, int] = {}
    with zipfile.ZipFile(buffer, "w") as zf:
        for i, (image, label) in enumerate(zip(images, labels, strict=True)):
            png = io.BytesIO()
            Image.fromarray(image[..., 0]).save(png, format="PNG")
            zf.writestr(f"{dirs[label]}/{i}.png", png.getvalue())
            counts[names[label]] = counts.get(names[label], 0) + 1
        manifest = {"manifest_version": 1, "dp": True, "job_epsilon": 1.0, "delta": 1e-5,
                    "dataset_epsilon_spent": 2.5, "counts": counts, "sampler": "ddim",
                    "non_dp_evaluations": []}
        zf.writestr("manifest.json", json.dumps(manifest))
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    key = f"corpora/job_gen{uuid.uuid4().hex[:8]}/corpus.zip"
    world.store.put_bytes(key, buffer.getvalue())
    return key


def _evaluate_claim(world: World, *, visibility: str = "private", corpus_key: str | None = None,
                    holdout: bool = True, spec_extra: dict[str, Any] | None = None,
                    **claim_extra: Any) -> Claim:
    images, labels = _digits(world)
    dataset_id = f"ds_{uuid.uuid4().hex}"
    prefix = (f"private/datasets/{dataset_id}/" if visibility == "private"
              else f"public/datasets/{dataset_id}/")
    train_key, holdout_key = prefix + "data.npz", prefix + "holdout.npz"
    world.store.put_file(train_key, _npz(world.tmp_path / "train.npz", images[:40], labels[:40]))
    world.store.put_file(holdout_key, _npz(world.tmp_path / "ho.npz", images[40:], labels[40:]))
    if corpus_key is None:  # a "corpus" that copies three training images and adds noise
        rng = np.random.default_rng(0)
        synthetic = np.concatenate([images[:3], rng.integers(0, 256, (7, 8, 8, 1),
                                                             dtype=np.uint8)])
        corpus_key = _corpus_zip(world, synthetic, np.concatenate([labels[:3],
                                                                   np.arange(7)]))
    evaluation_id = None
    if visibility == "private":
        evaluation_id = f"evl_{uuid.uuid4().hex}"
        world.ledger.evaluations[evaluation_id] = dataset_id  # type: ignore[attr-defined]
    spec = {"type": "evaluate", "corpus_artifact_id": "art_corpus", "dataset_id": dataset_id,
            "classifiers": ["cnn"], **(spec_extra or {})}
    return Claim(job_id=world.job_id, tenant_id="ten_x", attempt=1, type="evaluate", spec=spec,
                 dataset=DatasetInfo(dataset_id=dataset_id, visibility=visibility,
                                     object_key=train_key, class_names=CLASS_NAMES,
                                     holdout_object_key=holdout_key if holdout else None,
                                     holdout_size=10, budget_id=dataset_id),
                 corpus=CorpusRef(artifact_id="art_corpus", object_key=corpus_key,
                                  job_id="job_gen", model_id="mdl_gen", dp=True),
                 evaluation_id=evaluation_id, lease_ttl_s=60, heartbeat_s=10, **claim_extra)


def _report(world: World, fmt: str) -> bytes:
    (artifact,) = [a for a in world.api.of_kind("report") if a.metadata["format"] == fmt]
    return (world.store.root / artifact.object_key).read_bytes()


# --- feature_net ---------------------------------------------------------------------------


def _feature_claim(world: World, *, visibility: str = "public", holdout: bool = False,
                   epochs: int = 2) -> Claim:
    images, labels = _digits(world)
    dataset_id = f"ds_{uuid.uuid4().hex}"
    root = "public" if visibility == "public" else "private"
    key = f"{root}/datasets/{dataset_id}/data.npz"
    world.store.put_file(key, _npz(world.tmp_path / "fn.npz", images[:40], labels[:40]))
    holdout_key = None
    if holdout:
        holdout_key = f"{root}/datasets/{dataset_id}/holdout.npz"
        world.store.put_file(holdout_key, _npz(world.tmp_path / "fnh.npz", images[40:],
                                               labels[40:]))
    spec = {"type": "feature_net", "dataset_id": dataset_id, "image_size": 8, "epochs": epochs,
            "batch_size": 16, "validation_fraction": 0.25, "seed": 3}
    return Claim(job_id=world.job_id, tenant_id="ten_x", attempt=1, type="feature_net",
                 spec=spec, dataset=DatasetInfo(dataset_id=dataset_id, visibility=visibility,
                                                object_key=key, class_names=CLASS_NAMES,
                                                holdout_object_key=holdout_key),
                 lease_ttl_s=60, heartbeat_s=10)


def test_feature_net_publishes_a_non_dp_feature_model(world: World) -> None:
    claim = _feature_claim(world)
    assert world.run(claim) == Outcome.SUCCEEDED
    (model,) = world.api.of_kind("model")
    meta = model.metadata
    assert meta["model_kind"] == "feature_net" and meta["dp"] is False
    assert meta["public_dataset_id"] == claim.dataset.dataset_id  # type: ignore[union-attr]
    feature = meta["feature_net"]
    assert feature["architecture"] == "dpsynth-featnet-v1" and len(feature["sha256"]) == 64
    assert feature["validation_size"] == 10 and feature["train_size"] == 30
    assert feature["class_names"] == CLASS_NAMES and 0.0 <= feature["accuracy"] <= 1.0
    assert meta["validation"] == {"source": "split", "seed": 3, "fraction": 0.25, "size": 10}
    assert model.object_key == model_key(meta["model_id"])
    with tarfile.open(world.store.root / model.object_key) as tar:
        names = set(tar.getnames())
        provenance = json.load(tar.extractfile(PROVENANCE_FILE))  # type: ignore[arg-type]
    assert {"feature_net.safetensors", "feature_net.json"} <= names
    assert provenance["model_kind"] == "feature_net" and provenance["dp"] is False
    assert provenance["validation"]["source"] == "split"
    final = world.api.final
    assert final.to_state == JobState.SUCCEEDED
    assert final.result["model_id"] == meta["model_id"] and final.result["validation_size"] == 10
    assert final.result["model_hash"] == meta["model_hash"]
    assert world.ledger.calls == []
    assert world.api.heartbeats[-1].total == 2


def test_feature_net_validates_on_the_held_out_records(world: World) -> None:
    assert world.run(_feature_claim(world, holdout=True)) == Outcome.SUCCEEDED
    (model,) = world.api.of_kind("model")
    assert model.metadata["validation"] == {"source": "holdout", "size": 10}
    assert model.metadata["feature_net"]["train_size"] == 40


def test_feature_net_refuses_a_private_dataset(world: World) -> None:
    assert world.run(_feature_claim(world, visibility="private")) == Outcome.FAILED
    assert world.api.final.error_code == "visibility_mismatch"
    assert world.api.artifacts == [] and world.ledger.calls == []


def test_validation_split_is_seeded_and_disjoint() -> None:
    val, train = validation_split(50, seed=3, fraction=0.2)
    again, _ = validation_split(50, seed=3, fraction=0.2)
    assert len(val) == 10 and len(train) == 40 and not set(val) & set(train)
    assert (val == again).all() and not (val == validation_split(50, seed=4, fraction=0.2)[0]
                                         ).all()


# --- evaluate ------------------------------------------------------------------------------


def test_private_evaluation_reads_with_the_evaluation_grant_and_labels_the_report(
        world: World) -> None:
    metrics = FakeMetrics()
    claim = _evaluate_claim(world)
    assert world.run(claim, ml=MetricsCore(metrics=metrics)) == Outcome.SUCCEEDED
    assert world.ledger.names() == ["evaluation_grant"]
    assert world.ledger.calls[0][1]["evaluation_id"] == claim.evaluation_id
    (call,) = metrics.calls
    assert len(call["synthetic"]) == 10 and len(call["train"]) == 40
    assert len(call["holdout"]) == 10 and call["classifiers"] == ["cnn"]
    assert call["feature_net_dir"] is None and call["inception_weights"] is None
    assert call["synthetic"].class_names == tuple(CLASS_NAMES)
    reports = world.api.of_kind("report")
    assert sorted(a.object_key for a in reports) == [
        f"reports/{world.job_id}/report.html", f"reports/{world.job_id}/report.json"]
    for artifact in reports:
        assert artifact.owner_only and artifact.non_dp
        assert artifact.metadata["contains_private_images"] is True
        assert artifact.metadata["reference_visibility"] == "private"
    final = world.api.final
    assert final.to_state == JobState.SUCCEEDED and set(final.result) == EVALUATE_RESULT_KEYS
    assert final.result["non_dp"] is True and final.result["contains_private_images"] is True
    doc = json.loads(_report(world, "json"))
    assert doc["non_dp"] is True and doc["reference_visibility"] == "private"
    assert doc["corpus_manifest"]["job_epsilon"] == 1.0
    assert doc["memorisation"][0]["exact_copies"] >= 3  # the three copied training images
    assert doc["generate_job_id"] == "job_gen" and doc["model_id"] == "mdl_gen"
    html = _report(world, "html").decode()
    assert "NON-DP — owner only — contains private images" in html and "<script" not in html
    assert "real held-out ·" in html and "training image not shown" not in html


def test_without_private_images_the_page_shows_no_real_image(world: World) -> None:
    claim = _evaluate_claim(world, spec_extra={"include_private_images": False})
    assert world.run(claim, ml=MetricsCore(metrics=FakeMetrics())) == Outcome.SUCCEEDED
    assert world.api.final.result["contains_private_images"] is False
    html = _report(world, "html").decode()
    assert "real held-out ·" not in html and "training image not shown" in html
    assert all(a.owner_only and a.non_dp for a in world.api.of_kind("report"))


def test_public_reference_needs_no_grant_and_is_not_owner_only(world: World) -> None:
    claim = _evaluate_claim(world, visibility="public")
    assert world.run(claim, ml=MetricsCore(metrics=FakeMetrics())) == Outcome.SUCCEEDED
    assert world.ledger.calls == []
    assert not any(a.owner_only or a.non_dp for a in world.api.of_kind("report"))
    assert world.api.final.result["non_dp"] is False


def test_inception_without_weights_fails_before_reading_private_data(world: World) -> None:
    metrics = FakeMetrics()
    claim = _evaluate_claim(world, spec_extra={"inception": True})
    assert world.run(claim, ml=MetricsCore(metrics=metrics)) == Outcome.FAILED
    final = world.api.final
    assert final.error_code == "inception_weights_unavailable"
    assert "DPSYNTH_WORKER_INCEPTION_WEIGHTS" in (final.message or "")
    assert world.ledger.calls == [] and metrics.calls == []


def test_a_class_subset_reference_keeps_the_held_out_records_of_its_classes(
        world: World) -> None:
    images, labels = _digits(world)
    kept = ["digit 1", "digit 3"]
    keep = np.isin(labels[:40], [1, 3])
    corpus_key = _corpus_zip(world, images[:40][keep], (labels[:40][keep] == 3).astype(int),
                             names=kept)
    claim = _evaluate_claim(world, corpus_key=corpus_key)
    assert claim.dataset is not None
    subset = claim.dataset.model_copy(update={"class_names": kept,
                                              "selection": {"classes": kept}})
    claim = claim.model_copy(update={"dataset": subset})
    metrics = FakeMetrics()
    assert world.run(claim, ml=MetricsCore(metrics=metrics)) == Outcome.SUCCEEDED
    (call,) = metrics.calls
    for name in ("train", "holdout"):
        assert call[name].class_names == tuple(kept)
    assert len(call["train"]) == int(keep.sum())
    assert len(call["holdout"]) == int(np.isin(labels[40:], [1, 3]).sum())
    assert sorted(call["synthetic"].labels.tolist()) == sorted(
        (labels[:40][keep] == 3).astype(int).tolist())


def test_wrong_inception_weights_fail_with_their_code_and_message(world: World,
                                                                tmp_path: Path) -> None:
    weights = tmp_path / "pt_inception.pth"
    weights.write_bytes(b"not the pinned weights")
    metrics = FakeMetrics(fail_with=InceptionWeightsUnavailable("the weights file's sha256 "
                                                                "is not the pinned one"))
    claim = _evaluate_claim(world, spec_extra={"inception": True})
    assert world.run(claim, ml=MetricsCore(metrics=metrics, inception_weights=weights)) \
        == Outcome.FAILED
    assert metrics.calls[0]["inception_weights"] == weights
    final = world.api.final
    assert final.error_code == "inception_weights_unavailable"
    assert "pinned" in (final.message or "")


def test_the_worker_setting_reaches_the_ml_core(tmp_path: Path) -> None:
    settings = WorkerSettings(broker_url="redis://localhost:6379/0",
                              api={"url": "http://api", "token": "t" * 32},
                              ledger={"url": "http://ledger", "token": "t" * 32},
                              object_store={"kind": "local", "root": str(tmp_path / "o")},
                              work_dir=tmp_path / "w",
                              inception_weights=tmp_path / "pt_inception.pth")
    runtime = build_runtime(settings)
    assert runtime.ml.inception_weights == tmp_path / "pt_inception.pth"
    assert build_runtime(settings.model_copy(update={"inception_weights": None})
                         ).ml.inception_weights is None


def test_reference_without_holdout_fails_with_no_holdout(world: World) -> None:
    assert world.run(_evaluate_claim(world, holdout=False),
                     ml=MetricsCore(metrics=FakeMetrics())) == Outcome.FAILED
    assert world.api.final.error_code == "no_holdout" and world.ledger.calls == []


def test_a_corpus_with_unknown_classes_is_refused_clearly(world: World) -> None:
    images, _ = _digits(world)
    key = _corpus_zip(world, images[:4], np.array([0, 1, 0, 1]), names=["cat", "dog"])
    assert world.run(_evaluate_claim(world, corpus_key=key),
                     ml=MetricsCore(metrics=FakeMetrics())) == Outcome.FAILED
    final = world.api.final
    assert final.error_code == "invalid_spec"
    assert "does not know" in (final.message or "") and "cat" in (final.message or "")
    assert world.ledger.calls == []  # refused before the private data is read


@pytest.mark.parametrize("member", ["../escape.png", "/abs.png"])
def test_a_corpus_escaping_its_archive_is_refused(world: World, member: str) -> None:
    images, labels = _digits(world)
    key = _corpus_zip(world, images[:2], labels[:2], extra={member: b"x"})
    assert world.run(_evaluate_claim(world, corpus_key=key),
                     ml=MetricsCore(metrics=FakeMetrics())) == Outcome.FAILED
    assert world.api.final.error_code == "unsafe_archive"


def test_failures_on_private_data_withhold_their_details(world: World) -> None:
    metrics = FakeMetrics(fail_with=InvalidSpecError("record 17 of class 'digit 3' is odd"))
    assert world.run(_evaluate_claim(world), ml=MetricsCore(metrics=metrics)) \
        == Outcome.FAILED
    final = world.api.final
    assert final.error_code == "invalid_spec"
    assert "record 17" not in (final.message or "") and "withheld" in (final.message or "")


def test_cancel_during_the_evaluation_proposes_cancelled(world: World) -> None:
    world.api.on_heartbeat = lambda beat: HeartbeatReply(
        cancel_requested=beat.message == "evaluating", state="cancelling")
    assert world.run(_evaluate_claim(world), ml=MetricsCore(metrics=FakeMetrics())) \
        == Outcome.CANCELLED
    assert world.api.final.to_state == JobState.CANCELLED
    assert world.api.of_kind("report") == []


def test_feature_network_and_its_public_validation_split_reach_the_metrics(
        world: World) -> None:
    assert world.run(_feature_claim(world, epochs=40)) == Outcome.SUCCEEDED
    (model,) = world.api.of_kind("model")
    feature_dataset = _feature_dataset_of(world)
    world.api.artifacts.clear()
    world.api.transitions.clear()
    metrics = FakeMetrics()
    model_id = model.metadata["model_id"]
    claim = _evaluate_claim(world, spec_extra={"feature_model_id": model_id,
                                               "min_feature_accuracy": 0.2},
                            feature_model=ModelRef(model_id=model_id,
                                                   object_key=model.object_key),
                            feature_dataset=feature_dataset)
    assert world.run(claim, ml=MetricsCore(metrics=metrics)) == Outcome.SUCCEEDED
    (call,) = metrics.calls
    assert {"feature_net.json", "feature_net.safetensors"} <= set(call["feature_files"])
    images, labels = call["feature_check"]
    val_idx, _ = validation_split(40, seed=3, fraction=0.25)
    digits, digit_labels = _digits(world)
    assert (images == digits[:40][val_idx]).all() and (labels == digit_labels[:40][val_idx]).all()
    assert call["min_feature_accuracy"] == 0.2
    assert world.ledger.names() == ["evaluation_grant"]


def test_a_failing_feature_network_is_refused_before_private_data_is_read(
        world: World) -> None:
    assert world.run(_feature_claim(world, epochs=1)) == Outcome.SUCCEEDED
    (model,) = world.api.of_kind("model")
    feature_dataset = _feature_dataset_of(world)
    world.api.artifacts.clear()
    world.api.transitions.clear()
    metrics = FakeMetrics()
    model_id = model.metadata["model_id"]
    claim = _evaluate_claim(world, spec_extra={"feature_model_id": model_id,
                                               "min_feature_accuracy": 1.0},
                            feature_model=ModelRef(model_id=model_id,
                                                   object_key=model.object_key),
                            feature_dataset=feature_dataset)
    assert world.run(claim, ml=MetricsCore(metrics=metrics)) == Outcome.FAILED
    final = world.api.final
    assert final.error_code == "feature_network_rejected"
    assert "below the threshold" in (final.message or "")  # public figures: shown
    assert world.ledger.calls == [] and metrics.calls == []


def _feature_dataset_of(world: World) -> DatasetInfo:
    claim = world.api.claim_result
    assert isinstance(claim, Claim) and claim.dataset is not None
    return claim.dataset


def test_a_private_feature_dataset_is_refused(world: World) -> None:
    claim = _evaluate_claim(
        world, visibility="public", spec_extra={"feature_model_id": "mdl_x"},
        feature_model=ModelRef(model_id="mdl_x", object_key=model_key("mdl_x")),
        feature_dataset=DatasetInfo(dataset_id="ds_p", visibility="private",
                                    object_key="private/datasets/ds_p/data.npz",
                                    class_names=CLASS_NAMES))
    assert world.run(claim, ml=MetricsCore(metrics=FakeMetrics())) == Outcome.FAILED
    assert world.api.final.error_code == "visibility_mismatch"


# --- the corpus reader ---------------------------------------------------------------------


def _zip(path: Path, members: dict[str, bytes], *,
         compression: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _png(value: int, size: int = 8, mode: str = "L") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, (size, size), value if mode == "L" else (value,) * 3).save(buffer, "PNG")
    return buffer.getvalue()


MANIFEST = json.dumps({"counts": {"digit 0": 2}}).encode()


def test_corpus_reader_orders_images_and_maps_class_folders(tmp_path: Path) -> None:
    members = {"manifest.json": MANIFEST, "digit_1/10.png": _png(10), "digit_1/9.png": _png(9),
               "digit_0/0.png": _png(0)}
    corpus = read_corpus(_zip(tmp_path / "c.zip", members), CLASS_NAMES)
    assert corpus.labels.tolist() == [0, 1, 1]
    assert corpus.images[:, 0, 0, 0].tolist() == [0, 9, 10] and corpus.images.shape[1:] == (8, 8, 1)
    assert corpus.manifest == {"counts": {"digit 0": 2}}


@pytest.mark.parametrize(("members", "code"), [
    ({"digit_0/0.png": _png(0)}, "invalid_spec"),                                  # no manifest
    ({"manifest.json": MANIFEST, "cats/0.png": _png(0)}, "invalid_spec"),          # unknown class
    ({"manifest.json": MANIFEST, "digit_0/0.png": _png(0),
      "digit_0/1.png": _png(0, size=16)}, "invalid_spec"),                         # two shapes
    ({"manifest.json": MANIFEST, "digit_0/a/0.png": _png(0)}, "invalid_spec"),     # too deep
    ({"manifest.json": MANIFEST, "digit_0/0.png": b"not a png"}, "invalid_spec"),
    ({"manifest.json": b"[1, 2]", "digit_0/0.png": _png(0)}, "invalid_spec"),
    ({"manifest.json": MANIFEST, "digit_0/../../0.png": _png(0)}, "unsafe_archive"),
])
def test_corpus_reader_refuses_what_a_generate_job_never_writes(
        tmp_path: Path, members: dict[str, bytes], code: str) -> None:
    with pytest.raises(DpsynthError) as info:
        read_corpus(_zip(tmp_path / "c.zip", members), CLASS_NAMES)
    assert info.value.code == code


def test_corpus_reader_refuses_a_decompression_bomb_before_inflating(tmp_path: Path) -> None:
    members = {"manifest.json": MANIFEST, "digit_0/0.png": b"\0" * (8 << 20)}
    path = _zip(tmp_path / "bomb.zip", members, compression=zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 100_000
    with pytest.raises(DpsynthError) as info:
        read_corpus(path, CLASS_NAMES)
    assert info.value.code == "unsafe_archive"


def test_corpus_reader_refuses_symbolic_links(tmp_path: Path) -> None:
    path = tmp_path / "link.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("manifest.json", MANIFEST)
        link = zipfile.ZipInfo("digit_0/0.png")
        link.external_attr = (0o120777 << 16)
        zf.writestr(link, "/etc/passwd")
    with pytest.raises(DpsynthError) as info:
        read_corpus(path, CLASS_NAMES)
    assert info.value.code == "unsafe_archive"


def test_the_apis_held_out_caveat_leads_the_report(world: World) -> None:
    caveat = "model mdl_up was uploaded: what it was trained on is unknown to the platform"
    claim = _evaluate_claim(world).model_copy(update={"holdout_overlap": {
        "status": "unchecked", "caveat": caveat}})
    assert world.run(claim, ml=MetricsCore(metrics=FakeMetrics())) == Outcome.SUCCEEDED
    doc = json.loads(_report(world, "json"))
    assert doc["holdout_caveat"] == caveat and doc["notes"][0] == caveat
    html = _report(world, "html").decode()
    assert html.index("HELD-OUT NOT VERIFIED") < html.index("Headline metrics")
