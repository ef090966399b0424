"""feature_net and evaluate end to end on a real S3 server (SeaweedFS) and the real ledger
(its app on a real PostgreSQL database), with the real ML metrics on tiny 8x8 digits.

The api side is the in-memory fake of the worker's api port: the full platform's journey is
the e2e suite's. What is real here: the object store and its grant checks, the ledger's
evaluation authorisation and read grant (a recorded, uncharged read), the feature network,
a classifier (logistic regression: the CNN's 200 minimum steps cost minutes on the shared
CPU; the metrics' own tests cover it), the Fréchet distance, PRDC and the memorisation check.
"""

from __future__ import annotations

import io
import json
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from dpsynth_ledger.app import create_app as create_ledger_app
from dpsynth_ledger.migrate import upgrade as upgrade_ledger
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.evaluation import EvaluationReport
from dpsynth_shared.grants import public_key_of
from dpsynth_shared.job_states import JobState
from dpsynth_shared.object_store import ObjectStore
from dpsynth_shared.settings import ObjectStoreSettings
from dpsynth_shared.stores import from_settings
from dpsynth_shared.worker_contract import Claim, CorpusRef, DatasetInfo, ModelRef
from dpsynth_worker.clients import LedgerClient
from dpsynth_worker.runners import Outcome, run_job
from dpsynth_worker.runners.corpus_zip import class_dirs
from fastapi.testclient import TestClient
from PIL import Image
from pydantic import SecretStr

from tests.integration.ledger.conftest import TOKEN as LEDGER_TOKEN
from tests.integration.ledger.conftest import make_settings as ledger_settings
from tests.unit.worker.fakes import FakeApi

CLASS_NAMES = [f"digit {i}" for i in range(10)]
BUCKET = f"evaluate-{uuid.uuid4().hex[:10]}"  # SeaweedFS has few volume slots: one per module
COPIES = 12


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    data = load_digits()
    images = (data.images / 16.0 * 255.0).round().astype(np.uint8)[..., None]
    return images, data.target.astype(np.int64)


class Platform:
    """The real ledger (in-process app, real PostgreSQL), a real S3 store, a fake api."""

    def __init__(self, ledger_http: TestClient, ledger: LedgerClient, store: ObjectStore,
                 work_dir: Path) -> None:
        self.ledger_http, self.ledger, self.store, self.work_dir = (ledger_http, ledger, store,
                                                                    work_dir)

    def npz(self, key: str, images: np.ndarray, labels: np.ndarray) -> str:
        buffer = io.BytesIO()
        np.savez(buffer, images=images, labels=labels, class_names=np.array(CLASS_NAMES))
        self.store.put_bytes(key, buffer.getvalue())
        return key

    def run(self, claim: Claim) -> tuple[Outcome, FakeApi]:
        api = FakeApi(claim_result=claim)
        outcome = run_job(claim.job_id, claim.attempt, api=api, ledger=self.ledger,
                          store=self.store, work_dir=self.work_dir, worker_id="w-int",
                          heartbeat_s=0.5)
        return outcome, api


@pytest.fixture()
def platform(pg: Any, s3_endpoint: str, tmp_path: Path) -> Iterator[Platform]:
    settings = ledger_settings(pg.url(pg.create_database()))
    upgrade_ledger(settings)
    public_key = public_key_of(settings.grant_signing_key.get_secret_value())
    port = s3_endpoint.rsplit(":", 1)[1]
    store = from_settings(ObjectStoreSettings(
        kind="s3", endpoint=s3_endpoint, public_endpoint=f"localhost:{port}",
        access_key=SecretStr("evaluate-test"), secret_key=SecretStr("evaluate-test-secret"),
        bucket=BUCKET, presign_ttl_s=120), grant_public_key=public_key)
    with TestClient(create_ledger_app(settings),
                    headers={"Authorization": f"Bearer {LEDGER_TOKEN}"}) as http:
        def forward(request: httpx.Request) -> httpx.Response:
            r = http.request(request.method, str(request.url.copy_with(
                scheme="http", host="testserver")), content=request.read(),
                headers=dict(request.headers))
            return httpx.Response(r.status_code, headers=r.headers, content=r.content)

        ledger = LedgerClient("http://ledger", LEDGER_TOKEN,
                              transport=httpx.MockTransport(forward), backoff_s=0.0)
        yield Platform(http, ledger, store, tmp_path / "work")


def _corpus(platform: Platform, images: np.ndarray, labels: np.ndarray, job_id: str) -> str:
    dirs = class_dirs(CLASS_NAMES)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as zf:
        counters: dict[int, int] = {}
        for image, label in zip(images, labels, strict=True):
            i = counters[int(label)] = counters.get(int(label), -1) + 1
            png = io.BytesIO()
            Image.fromarray(image[..., 0]).save(png, format="PNG")
            zf.writestr(f"{dirs[label]}/{i}.png", png.getvalue())
        counts = {CLASS_NAMES[k]: v + 1 for k, v in counters.items()}
        zf.writestr("manifest.json", json.dumps({
            "manifest_version": 1, "generate_job_id": job_id, "model_id": "mdl_gen",
            "dp": True, "job_epsilon": 3.0, "delta": 1e-5, "dataset_epsilon_spent": 3.0,
            "dataset_tight_epsilon": 2.4, "dataset_tight_epsilon_label": "PLD",
            "accountant": "rdp-filter+pld", "sampler": "ddim", "steps": 20,
            "guidance_scale": 2.0, "seed": 0, "counts": counts, "non_dp_evaluations": []},
            sort_keys=True))
    key = f"corpora/{job_id}/corpus.zip"
    platform.store.put_bytes(key, buffer.getvalue(), content_type="application/zip")
    return key


def _feature_net(platform: Platform, images: np.ndarray, labels: np.ndarray
                 ) -> tuple[ModelRef, DatasetInfo]:
    dataset_id = f"ds_{uuid.uuid4().hex}"
    key = platform.npz(f"public/datasets/{dataset_id}/data.npz", images, labels)
    dataset = DatasetInfo(dataset_id=dataset_id, visibility="public", object_key=key,
                          class_names=CLASS_NAMES)
    claim = Claim(job_id=f"job_{uuid.uuid4().hex}", tenant_id="ten_int", attempt=1,
                  type="feature_net", dataset=dataset, lease_ttl_s=60, heartbeat_s=1,
                  spec={"type": "feature_net", "dataset_id": dataset_id, "image_size": 8,
                        "epochs": 8, "batch_size": 32, "learning_rate": 3e-3,
                        "validation_fraction": 0.25, "seed": 0})
    outcome, api = platform.run(claim)
    assert outcome == Outcome.SUCCEEDED, api.transitions
    (model,) = api.of_kind("model")
    assert model.metadata["feature_net"]["accuracy"] >= 0.5
    return ModelRef(model_id=model.metadata["model_id"], object_key=model.object_key), dataset


def _private_reference(platform: Platform, images: np.ndarray, labels: np.ndarray,
                       job_id: str) -> tuple[DatasetInfo, str]:
    """A private dataset (300 training, 100 held-out records), its budget and the ledger's
    evaluation authorisation for ``job_id``."""
    dataset_id = f"ds_{uuid.uuid4().hex}"
    root = f"private/datasets/{dataset_id}/"
    train_key = platform.npz(root + "data.npz", images[:300], labels[:300])
    holdout_key = platform.npz(root + "holdout.npz", images[300:400], labels[300:400])
    r = platform.ledger_http.post("/v1/budgets", json={
        "dataset_id": dataset_id, "tenant_id": "ten_int", "epsilon_limit": 8.0,
        "delta": 1e-5, "declared_size": 300, "partitions": []})
    assert r.status_code == 201, r.text
    r = platform.ledger_http.post("/v1/evaluations", json={
        "dataset_id": dataset_id, "job_id": job_id, "reference_dataset_id": dataset_id,
        "requested_by": "key_owner"})
    assert r.status_code == 201, r.text
    dataset = DatasetInfo(dataset_id=dataset_id, visibility="private", object_key=train_key,
                          class_names=CLASS_NAMES, declared_size=300, delta=1e-5,
                          holdout_object_key=holdout_key, holdout_size=100,
                          budget_id=dataset_id)
    return dataset, r.json()["evaluation_id"]


def test_private_evaluation_end_to_end(platform: Platform,
                                       digits: tuple[np.ndarray, np.ndarray]) -> None:
    images, labels = digits
    feature_model, feature_dataset = _feature_net(platform, images[1000:1240],
                                                  labels[1000:1240])
    job_id = f"job_{uuid.uuid4().hex}"
    reference, evaluation_id = _private_reference(platform, images, labels, job_id)
    # the "synthetic" corpus: unseen digits (a generator that generalises) plus COPIES
    # verbatim copies of private training images (one that memorised some)
    synthetic = np.concatenate([images[500:700], images[:COPIES]])
    synthetic_labels = np.concatenate([labels[500:700], labels[:COPIES]])
    corpus_key = _corpus(platform, synthetic, synthetic_labels, "job_gen")
    spec = {"type": "evaluate", "corpus_artifact_id": "art_corpus",
            "dataset_id": reference.dataset_id, "feature_model_id": feature_model.model_id,
            "classifiers": ["logreg"], "prdc_k": 3, "seed": 1}
    claim = Claim(job_id=job_id, tenant_id="ten_int", attempt=1, type="evaluate", spec=spec,
                  dataset=reference, evaluation_id=evaluation_id,
                  corpus=CorpusRef(artifact_id="art_corpus", object_key=corpus_key,
                                   job_id="job_gen", model_id="mdl_gen", dp=True),
                  feature_model=feature_model, feature_dataset=feature_dataset,
                  lease_ttl_s=60, heartbeat_s=1)
    outcome, api = platform.run(claim)
    assert outcome == Outcome.SUCCEEDED, api.transitions

    # the ledger recorded the read, charged nothing
    (evaluation,) = platform.ledger_http.get(
        f"/v1/datasets/{reference.dataset_id}/evaluations").json()
    assert evaluation["grants"] == 1 and evaluation["touched_at"] is not None
    budget = platform.ledger_http.get(f"/v1/budgets/{reference.dataset_id}").json()
    assert budget["dataset_epsilon_spent"] == 0.0

    # two owner-only, non-DP reports outside the private prefix; a result without metrics
    reports = {a.metadata["format"]: a for a in api.of_kind("report")}
    assert set(reports) == {"json", "html"}
    for artifact in reports.values():
        assert artifact.object_key.startswith(f"reports/{job_id}/")
        assert artifact.owner_only and artifact.non_dp
        assert artifact.metadata["contains_private_images"] is True
    final = api.final
    assert final.to_state == JobState.SUCCEEDED
    assert set(final.result) == {"report_artifact_id", "report_html_artifact_id", "non_dp",
                                 "contains_private_images"}
    json_path, html_path = platform.work_dir / "r.json", platform.work_dir / "r.html"
    platform.store.get_file(reports["json"].object_key, json_path)
    platform.store.get_file(reports["html"].object_key, html_path)
    report = EvaluationReport.model_validate_json(json_path.read_bytes())

    # real metrics, on the figures this data must give
    assert report.non_dp and report.reference_visibility == "private"
    assert report.sizes["synthetic"] == 200 + COPIES and report.sizes["real_holdout"] == 100
    head = report.headline
    assert set(head.tstr_accuracy) == set(head.real_accuracy) == {"logreg"}
    assert head.tstr_accuracy["logreg"] > 0.5 and head.real_accuracy["logreg"] > 0.5
    assert head.fd_dpsynth is not None and head.fd_dpsynth_real_train is not None
    assert head.precision is not None and head.coverage is not None
    assert head.inception_fid is None
    assert report.feature_network is not None and report.feature_network.passed
    assert report.feature_network.model_id == feature_model.model_id
    assert report.feature_network.dataset_id == feature_dataset.dataset_id
    pixel = next(m for m in report.memorisation if m.space == "pixel")
    assert pixel.exact_copies >= COPIES and pixel.flagged >= COPIES
    assert report.corpus_manifest["job_epsilon"] == 3.0
    html = html_path.read_text()
    assert "<script" not in html.lower() and "NON-DP — owner only" in html
    assert "FD (dpsynth-featnet-v1 features, not Inception FID)" in html
    assert html.count("data:image/png;base64,") > 10


def test_an_unknown_evaluation_reads_nothing(platform: Platform,
                                             digits: tuple[np.ndarray, np.ndarray]) -> None:
    images, labels = digits
    job_id = f"job_{uuid.uuid4().hex}"
    reference, _ = _private_reference(platform, images, labels, job_id)
    corpus_key = _corpus(platform, images[500:520], labels[500:520], "job_gen2")
    claim = Claim(job_id=job_id, tenant_id="ten_int", attempt=1, type="evaluate",
                  spec={"type": "evaluate", "corpus_artifact_id": "art_c",
                        "dataset_id": reference.dataset_id, "classifiers": ["logreg"]},
                  dataset=reference, evaluation_id=f"evl_{uuid.uuid4().hex}",
                  corpus=CorpusRef(artifact_id="art_c", object_key=corpus_key,
                                   job_id="job_gen2"), lease_ttl_s=60, heartbeat_s=1)
    outcome, api = platform.run(claim)
    assert outcome == Outcome.FAILED
    assert api.final.error_code == "not_found" and api.of_kind("report") == []
    (evaluation,) = platform.ledger_http.get(
        f"/v1/datasets/{reference.dataset_id}/evaluations").json()
    assert evaluation["grants"] == 0
    # and the store refuses the private data without a grant
    with pytest.raises(DpsynthError) as info:
        platform.store.get_file(reference.object_key, platform.work_dir / "x.npz")
    assert info.value.code == ErrorCode.GRANT_REQUIRED
