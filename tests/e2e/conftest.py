"""End-to-end fixtures: the whole platform as real processes on real servers.

Short lease and heartbeat periods (seconds) so the reaper's behaviour is testable.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from dpsynth_client import Client

from tests.support.platform import ServicePlatform

LEASE_TTL_S = 4
CLASSES = [str(i) for i in range(10)]

FAST_ENV = {
    "DPSYNTH_API_LEASE_TTL_S": str(LEASE_TTL_S),
    "DPSYNTH_API_HEARTBEAT_S": "1",
    "DPSYNTH_LEDGER_LEASE_TTL_S": str(LEASE_TTL_S),
    "DPSYNTH_API_MAX_ATTEMPTS": "3",
}


def make_platform(tmp: Path, pg, redis_url: str, s3_endpoint: str | None, *, workers: int,
                  extra_env: dict[str, str] | None = None) -> ServicePlatform:
    platform = ServicePlatform(workdir=tmp, database_url=pg.url(pg.create_database()),
                               broker_url=redis_url, s3_endpoint=s3_endpoint,
                               extra_env={**FAST_ENV, **(extra_env or {})})
    platform.start(workers=workers)
    return platform


@pytest.fixture(scope="module")
def platform(tmp_path_factory, pg, redis_url, s3_endpoint) -> Iterator[ServicePlatform]:
    p = make_platform(tmp_path_factory.mktemp("platform"), pg, redis_url, s3_endpoint,
                      workers=1)
    yield p
    p.stop()


@pytest.fixture(scope="module")
def client(platform: ServicePlatform) -> Client:
    return Client(platform.api_url, platform.admin_key())


_PRIVATE_CURSOR = {"next": 0}


@pytest.fixture(autouse=True, scope="module")
def _fresh_private_records() -> None:
    """Each module's private uploads start at the private part's first record again."""
    _PRIVATE_CURSOR["next"] = 0


def digits_npz(path: Path, *, part: str, n: int | None = None) -> tuple[Path, np.ndarray]:
    """A seeded split of sklearn's digits: 'public', 'private' or 'test'.

    Successive 'private' calls of one module take the NEXT ``n`` records of the private part
    (cycling): a tenant's re-upload of its private records is refused (409
    ``private_data_overlap``), so the tests' private datasets must not share records.
    """
    from sklearn.datasets import load_digits

    d = load_digits()
    images = np.clip(d.images * 16, 0, 255).astype(np.uint8)[..., None]
    order = np.random.default_rng(7).permutation(len(d.target))
    parts = {"test": order[:200], "public": order[200:900], "private": order[900:]}
    idx = parts[part][:n] if n else parts[part]
    if part == "private" and n:
        start = _PRIVATE_CURSOR["next"]
        idx = np.take(parts[part], np.arange(start, start + n), mode="wrap")
        _PRIVATE_CURSOR["next"] = (start + n) % len(parts[part])
    np.savez(path, images=images[idx], labels=d.target[idx].astype(np.int64))
    return path, d.target[idx]


TINY_PRETRAIN = {"type": "pretrain", "preset": "tiny", "image_size": 16, "channels": 1,
                 "class_conditional": True, "epochs": 2, "batch_size": 64, "seed": 0}


def upload_npz(platform: ServicePlatform, npz: Path, metadata: dict) -> dict:
    """Upload a canonical npz with the admin key (metadata as the form field); 201 or fail."""
    with npz.open("rb") as handle:
        r = httpx.post(f"{platform.api_url}/v1/datasets", timeout=60,
                       headers={"Authorization": f"Bearer {platform.admin_key()}"},
                       data={"metadata": json.dumps(metadata)},
                       files={"file": (npz.name, handle, "application/octet-stream")})
    assert r.status_code == 201, r.text
    return dict(r.json())


def finetune_spec(dataset_id: str, base_model_id: str, *, target_epsilon: float = 4.0,
                  expected_batch_size: int = 32, epochs: float = 1.0,
                  checkpoint_every: int = 2) -> dict:
    return {
        "type": "finetune", "dataset_id": dataset_id, "base_model_id": base_model_id,
        "privacy": {"target_epsilon": target_epsilon, "max_grad_norm": 1.0},
        "training": {"trainable": "attention", "expected_batch_size": expected_batch_size,
                     "epochs": epochs, "learning_rate": 3e-4, "class_conditional": True,
                     "label_dropout": 0.1, "max_physical_batch_size": 32,
                     "checkpoint_every": checkpoint_every,
                     "class_map": {c: c for c in CLASSES}},
    }
