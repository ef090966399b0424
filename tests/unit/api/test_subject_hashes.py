"""Keyed subject hashes (issue 4, items 1+2): ids normalised at ingest (an integer and its
string form are one subject), hashed with HMAC-SHA256 under the api's key and the tenant, and
the record hash key is a required strong secret."""

from __future__ import annotations

import hashlib
import hmac

import numpy as np
import pytest
from dpsynth_api.datasets.ingest import dense_subjects, parse_subjects
from dpsynth_api.datasets.overlap import SUBJECT_SCHEME, record_hashes, subject_hashes
from dpsynth_api.settings import ApiSettings
from pydantic import ValidationError

KEY = b"k" * 32


def test_integer_and_string_ids_normalise_to_the_same_text() -> None:
    dense, ids = parse_subjects(np.asarray([7, 12, 7, 3], dtype=np.int64), 4)
    assert dense.tolist() == dense_subjects(np.asarray([7, 12, 7, 3]), 4).tolist()
    assert [ids[i] for i in dense.tolist()] == ["7", "12", "7", "3"]
    _, text = parse_subjects(np.asarray([" 7", "12 ", "7", "3"]), 4)
    assert sorted(text) == sorted(ids)
    _, unsigned = parse_subjects(np.asarray([7, 3], dtype=np.uint16), 2)
    assert unsigned == ["3", "7"]


def test_subject_hashes_are_keyed_per_tenant() -> None:
    (h,) = subject_hashes(KEY, "tn_1", ["7"])
    assert h == hmac.new(KEY, f"{SUBJECT_SCHEME}|tn_1|7".encode(), hashlib.sha256).hexdigest()
    assert len(h) == 64
    assert subject_hashes(KEY, "tn_2", ["7"]) != [h]  # another tenant
    assert subject_hashes(b"x" * 32, "tn_1", ["7"]) != [h]  # another key
    assert h != hashlib.sha256(b"7").hexdigest()
    # another hash space than the pixel hashes
    assert h not in record_hashes(np.zeros((1, 2, 2, 1), dtype=np.uint8))


def _settings(**extra: object) -> ApiSettings:
    return ApiSettings(database={"url": "postgresql+psycopg://x"},  # type: ignore[arg-type]
                       ledger={"url": "http://l", "token": "ledger-token-0123456789"},
                       worker_token="worker-token-0123456789abcdef", **extra)


def test_the_record_hash_key_is_required_and_strong(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DPSYNTH_API_RECORD_HASH_KEY", raising=False)
    with pytest.raises(ValidationError, match="record_hash_key"):
        _settings()
    with pytest.raises(ValidationError, match="DPSYNTH_API_RECORD_HASH_KEY"):
        _settings(record_hash_key="short")
    key = "a-strong-record-hash-key-0123456789"
    assert _settings(record_hash_key=key).record_hash_key.get_secret_value() == key
    monkeypatch.setenv("DPSYNTH_API_RECORD_HASH_KEY", key)
    assert _settings().record_hash_key.get_secret_value() == key
