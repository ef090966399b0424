"""The Python client as a notebook user runs it (issue 15, item 11), against the real api.

``Client.from_env()`` in a sub-folder of a project finds the project's ``.dpsynth``, then
``submit_and_wait`` and ``download_corpus`` run a generate job to a corpus of arrays. The api
is the real app on a real PostgreSQL (``tests/integration/api/conftest.py``); a test plays
the worker through the internal endpoints while the client polls (no Celery worker: what
is tested here is the client, and the job states it sees are the api's own).
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from dpsynth_client import Client, JobFailed

from tests.integration.api import conftest as api_fixtures
from tests.integration.api.conftest import Api
from tests.unit.api import builders as b

migrated_url = api_fixtures.migrated_url  # the api's fixtures, for this folder's tests
make_api = api_fixtures.make_api

MODEL_CLASSES = ["b", "a"]  # the model's class order, not the alphabet's


@pytest.fixture()
def api(make_api: Any) -> Api:
    """The real api app on a fresh, migrated PostgreSQL database."""
    made: Api = make_api()
    return made


@pytest.fixture()
def notebook(api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Client:
    """A tenant's credentials in ``project/.dpsynth``; the current folder two levels below;
    no DPSYNTH_* variable; a per-user state folder of the test's own."""
    _, token = api.tenant("hospital")
    home = tmp_path / "project" / ".dpsynth"
    home.mkdir(parents=True)
    (home / "credentials.json").write_text(json.dumps(
        {"api_url": "http://dpsynth.test:8000", "api_key": token}))
    (tmp_path / "project" / "notebooks" / "week1").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "project" / "notebooks" / "week1")
    for name in ("DPSYNTH_API_URL", "DPSYNTH_API_KEY", "DPSYNTH_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    def forward(request: httpx.Request) -> httpx.Response:  # to the app, in process
        r = api.client.request(request.method, str(request.url.copy_with(
            scheme="http", host="testserver")), content=request.read(),
            headers=dict(request.headers))
        return httpx.Response(r.status_code, headers=r.headers, content=r.content)

    return Client.from_env(transport=httpx.MockTransport(forward))


def _corpus_zip(model_id: str, per_class: int) -> bytes:
    """A corpus as the generate runner zips it; pixel (0, 0) is 10 * class index + i."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for label, name in enumerate(MODEL_CLASSES):
            for i in range(per_class):
                zf.writestr(f"{name}/{i}.png", b.png(value=10 * label + i))
        zf.writestr("manifest.json", json.dumps(
            {"model_id": model_id, "counts": dict.fromkeys(MODEL_CLASSES, per_class),
             "job_epsilon": None, "non_dp_evaluations": []}, sort_keys=True))
    return buf.getvalue()


class PlayedWorker:
    """Advances a job one step per poll of the client: claim, then its final state."""

    def __init__(self, api: Api, *, fail: bool = False) -> None:
        self.api, self.fail = api, fail
        self.seen: list[str] = []

    def __call__(self, job: dict[str, Any]) -> None:
        self.seen.append(job["state"])
        job_id = job["job_id"]
        if job["state"] == "queued":
            claim = self.api.worker(f"{job_id}/claim", {"attempt": 1, "worker_id": "w"})
            assert claim.status_code == 200, claim.text
        elif job["state"] == "running" and self.fail:
            self.api.worker(f"{job_id}/transition", {"attempt": 1, "to_state": "failed",
                                                     "error_code": "sampling_failed"})
        elif job["state"] == "running":
            key = f"corpora/{job_id}/corpus.zip"
            info = self.api.store.put_bytes(key, _corpus_zip(job["spec"]["model_id"], 3))
            registered = self.api.worker(f"{job_id}/artifacts", {
                "attempt": 1, "kind": "corpus", "object_key": key, "sha256": info.sha256,
                "size": info.size})
            assert registered.status_code == 201, registered.text
            self.api.worker(f"{job_id}/transition", {"attempt": 1, "to_state": "succeeded",
                                                     "result": {"images": 6}})


def _model(client: Client, tmp_path: Path) -> str:
    path = tmp_path / "base.zip"
    path.write_bytes(b.zip_bytes(b.model_folder(info={"class_names": MODEL_CLASSES})))
    return str(client.upload_model(path, name="base")["model_id"])


def test_from_env_in_a_sub_folder_submit_and_wait_then_arrays(api: Api, notebook: Client,
                                                             tmp_path: Path) -> None:
    assert notebook.base_url == "http://dpsynth.test:8000"  # the credentials file's URL
    assert notebook.config is not None
    assert notebook.config.home == tmp_path / "project" / ".dpsynth"
    model_id = _model(notebook, tmp_path)
    worker = PlayedWorker(api)
    job = notebook.submit_and_wait({"type": "generate", "model_id": model_id,
                                    "samples_per_class": 3}, poll=0.0, on_progress=worker)
    assert job["state"] == "succeeded" and worker.seen == ["queued", "running", "succeeded"]
    corpus = notebook.download_corpus(job)
    assert corpus.class_names == MODEL_CLASSES  # the model's order, from the api
    assert corpus.images.shape == (6, 8, 8, 1) and corpus.images.dtype == np.uint8
    assert corpus.labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert corpus.images[:, 0, 0, 0].tolist() == [0, 1, 2, 10, 11, 12]
    assert corpus.manifest["model_id"] == model_id


def test_submit_and_wait_raises_with_the_failed_job(api: Api, notebook: Client,
                                                    tmp_path: Path) -> None:
    model_id = _model(notebook, tmp_path)
    with pytest.raises(JobFailed) as excinfo:
        notebook.submit_and_wait({"type": "generate", "model_id": model_id}, poll=0.0,
                                 on_progress=PlayedWorker(api, fail=True))
    err = excinfo.value
    assert err.state == "failed" and err.code == "sampling_failed"
    assert err.job["error"]["code"] == "sampling_failed"
    assert str(err) == f"job {err.job_id} failed: sampling_failed"
    assert notebook.get_job(err.job_id)["state"] == "failed"
