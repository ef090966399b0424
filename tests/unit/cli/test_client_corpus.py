"""A corpus zip as arrays (issue 15, item 11): ``read_corpus`` and ``Client.download_corpus``.

The zips are built as a generate job builds them: the sampler's class folders (the worker's
own spelling), ``<i>.png`` per image, ``manifest.json`` written with sorted keys, zipped by
the worker's ``zip_folder``; the worker's own reader is the reference for the arrays.
"""

from __future__ import annotations

import json
import tempfile
import zipfile
from pathlib import Path

import httpx
import numpy as np
import pytest
from dpsynth_client import Client, CorpusError, read_corpus
from dpsynth_worker.runners.artifacts import zip_folder
from dpsynth_worker.runners.corpus_zip import class_dirs
from dpsynth_worker.runners.corpus_zip import read_corpus as worker_read_corpus
from PIL import Image

from tests.unit.cli.fake_api import FakeApi, problem

MODEL_ORDER = ["zebra", "apple", "x ray"]  # the model's class order is not alphabetical


def write_corpus(tmp: Path, per_class: int = 3, *, mode: str = "L", size: int = 8) -> Path:
    """A generate job's corpus zip; pixel (0, 0) of image i of class c is 10 * c + i."""
    folder = tmp / "corpus"
    for label, (name, sub) in enumerate(zip(MODEL_ORDER, class_dirs(MODEL_ORDER),
                                            strict=True)):
        (folder / sub).mkdir(parents=True)
        for i in range(per_class):
            pixels = np.full((size, size) if mode == "L" else (size, size, 3), 200, np.uint8)
            pixels[0, 0] = 10 * label + i
            Image.fromarray(pixels, mode=mode).save(folder / sub / f"{i}.png")
    manifest = {"manifest_version": 1, "model_id": "m1", "job_epsilon": 3.9, "delta": 1e-5,
                "counts": {name: per_class for name in MODEL_ORDER}, "job_ids": ["j1", "g1"]}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return Path(zip_folder(folder, tmp / "corpus.zip"))


def test_read_corpus_returns_images_labels_and_the_manifest(tmp_path: Path) -> None:
    corpus = read_corpus(write_corpus(tmp_path, per_class=12))
    assert corpus.class_names == ["apple", "x ray", "zebra"]  # the manifest's, sorted
    assert corpus.images.dtype == np.uint8 and corpus.images.shape == (36, 8, 8, 1)
    assert corpus.labels.dtype == np.int64 and len(corpus) == 36
    assert np.bincount(corpus.labels).tolist() == [12, 12, 12]
    # image i of a class is its <i>.png: 10.png comes after 9.png, and pixels are kept
    for position, label in enumerate(corpus.labels):
        model_label = MODEL_ORDER.index(corpus.class_names[label])
        assert corpus.images[position, 0, 0, 0] == 10 * model_label + position % 12
    assert corpus.manifest["job_epsilon"] == 3.9 and corpus.manifest["model_id"] == "m1"


def test_arrays_match_the_workers_own_reader(tmp_path: Path) -> None:
    path = write_corpus(tmp_path, mode="RGB")
    ours = read_corpus(path, MODEL_ORDER)
    theirs = worker_read_corpus(path, MODEL_ORDER)
    assert ours.images.shape == (9, 8, 8, 3)
    # the worker orders by folder name, the client by label: compare as sets of pairs

    def pairs(images: np.ndarray, labels: np.ndarray) -> list[tuple[int, bytes]]:
        return sorted((int(label), image.tobytes()) for image, label in zip(images, labels,
                                                                             strict=True))

    assert pairs(ours.images, ours.labels) == pairs(theirs.images, theirs.labels)
    assert ours.manifest == theirs.manifest


def test_a_zip_that_is_not_a_corpus_is_refused(tmp_path: Path) -> None:
    plain = tmp_path / "plain.zip"
    with zipfile.ZipFile(plain, "w") as zf:
        zf.writestr("a/0.png", b"")
    with pytest.raises(CorpusError, match=r"has no manifest\.json: not a dpsynth corpus"):
        read_corpus(plain)
    with pytest.raises(CorpusError, match=r"'x_ray' is no class of \['apple', 'zebra'\]$"):
        read_corpus(write_corpus(tmp_path), ["apple", "zebra"])


def _corpus_api(api: FakeApi, zip_bytes: bytes, model: httpx.Response) -> None:
    api.route("GET", "/v1/artifacts/a1/download", lambda r: httpx.Response(
        200, content=zip_bytes, headers={"content-type": "application/zip"}))
    api.route("GET", "/v1/models/m1", lambda r: model)


def test_download_corpus_labels_follow_the_models_class_order(api: FakeApi,
                                                               tmp_path: Path) -> None:
    _corpus_api(api, write_corpus(tmp_path).read_bytes(), httpx.Response(
        200, json={"model_id": "m1", "info": {"class_names": MODEL_ORDER}}))
    client = Client("http://api.test", api.key, transport=api.transport())
    corpus = client.download_corpus("a1", tmp_path / "kept" / "corpus.zip")
    assert corpus.class_names == MODEL_ORDER
    assert corpus.labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert corpus.images[3:6, 0, 0, 0].tolist() == [10, 11, 12]  # "apple" is label 1
    assert zipfile.is_zipfile(tmp_path / "kept" / "corpus.zip")


def test_download_corpus_without_the_model_uses_the_manifests_names(
        api: FakeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _corpus_api(api, write_corpus(tmp_path).read_bytes(),
                problem(404, "not_found", "model m1 not found"))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    corpus = Client("http://api.test", api.key, transport=api.transport()).download_corpus("a1")
    assert corpus.class_names == ["apple", "x ray", "zebra"]
    assert corpus.images.shape == (9, 8, 8, 1)
    assert list(scratch.iterdir()) == []  # the temporary zip is gone


def test_download_corpus_takes_the_generate_job_too(api: FakeApi, tmp_path: Path) -> None:
    _corpus_api(api, write_corpus(tmp_path).read_bytes(), httpx.Response(
        200, json={"model_id": "m1", "info": {"class_names": MODEL_ORDER}}))
    job = {"job_id": "job_1", "type": "generate", "state": "succeeded", "artifacts": [
        {"artifact_id": "a0", "kind": "model"}, {"artifact_id": "a1", "kind": "corpus"}]}
    api.route("GET", "/v1/jobs/job_1", job)
    client = Client("http://api.test", api.key, transport=api.transport())
    assert len(client.download_corpus(job)) == 9  # the document submit_and_wait returns
    assert not any(r.url.path == "/v1/jobs/job_1" for r in api.requests)
    assert client.download_corpus("job_1").class_names == MODEL_ORDER  # or its id
    api.route("GET", "/v1/jobs/job_2", {"job_id": "job_2", "type": "finetune",
                                        "state": "succeeded", "artifacts": []})
    with pytest.raises(CorpusError, match=r"job job_2 \(finetune, succeeded\) has no corpus"):
        client.download_corpus("job_2")


@pytest.fixture()
def api() -> FakeApi:
    return FakeApi()
