"""Issue 13, items 2 and 3: no exact private count is published without DP, and
``partitions_disjoint`` is the owner's declaration, checked at ingest, never computed.

Each test here fails on the code before the change: a private add/remove upload without
``declared_size`` got its true count as N̂ (so uploads of N and N+1 records got N̂ = N and
N + 1, and δ = min(1e-6, 1/(10 N))), the stored file's size and hash were shown to every
reader, and ``partitions_disjoint`` was computed from the data.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from dpsynth_api.archives import ArchiveLimits
from dpsynth_api.datasets import units
from dpsynth_api.datasets.ingest import Ingested, IngestLimits, ingest_upload
from dpsynth_api.datasets.schemas import DatasetMetadata, dataset_out
from dpsynth_api.fakes import FakeLedger
from dpsynth_api.tables import Dataset
from dpsynth_shared.errors import BudgetExhausted, DpsynthError, ErrorCode
from dpsynth_shared.release_contract import SizeReleasePlanRequest

from tests.unit.api import builders as b

LIMITS = IngestLimits(ArchiveLimits(max_uncompressed_bytes=5 * 1024 * 1024, max_members=1000),
                      max_image_pixels=1024 * 1024)


def _images(tmp_path: Path, n: int) -> Ingested:
    path = tmp_path / f"u{n}.npz"
    path.write_bytes(b.digits_npz(n, k=3))
    return ingest_upload(path, "u.npz", private=True, label_domain=["x", "y", "z"],
                         limits=LIMITS, subject_column=None)


def _subjects(tmp_path: Path, subjects: list[int], labels: list[int]) -> Ingested:
    path = tmp_path / "s.npz"
    path.write_bytes(b.npz_bytes(images=np.zeros((len(labels), 8, 8), dtype=np.uint8),
                                 labels=np.asarray(labels, dtype=np.int64),
                                 subjects=np.asarray(subjects, dtype=np.int64)))
    return ingest_upload(path, "s.npz", private=True, label_domain=["a", "b"], limits=LIMITS,
                         subject_column="subjects")


def _meta(**fields: object) -> DatasetMetadata:
    base: dict[str, object] = dict(name="d", visibility="private", epsilon_limit=4.0,
                                   label_domain=["x", "y", "z"])
    base.update(fields)
    return DatasetMetadata.model_validate(base)


def _refusal(meta: DatasetMetadata, data: Ingested, **kw: object) -> DpsynthError:
    with pytest.raises(DpsynthError) as info:
        units.resolve_units(meta, data, **kw)  # type: ignore[arg-type]
    assert info.value.code == ErrorCode.INVALID_DATASET
    return info.value


# -- item 2: N̂ ------------------------------------------------------------------------------

def test_a_private_upload_without_a_size_is_refused_alike_for_n_and_n_plus_1(
        tmp_path: Path) -> None:
    """Old code: N̂ = N and N + 1 (the true counts, published); now both are refused with
    the same words, which name no count."""
    small, large = _images(tmp_path, 20), _images(tmp_path, 21)
    first, second = _refusal(_meta(), small), _refusal(_meta(), large)
    assert first.detail == second.detail and first.extensions == second.extensions
    assert "declared_size" in first.detail and "size_epsilon" in first.detail
    assert "20" not in first.detail and "21" not in second.detail


def test_n_hat_of_a_dp_count_never_differs_deterministically_between_n_and_n_plus_1(
        tmp_path: Path) -> None:
    """Uploads of N and N+1 records asking for a DP count: N̂ is N + Z + 6σ, fresh noise each
    time, so the two sets of N̂ overlap; old code gave N̂ = N and N + 1, always."""
    ledger = FakeLedger()
    meta = _meta(size_epsilon=1.0)
    draws: dict[int, list[int]] = {}
    for n in (20, 21):
        data = _images(tmp_path, n)
        draws[n] = []
        for _ in range(60):
            released = units.release_size(ledger, meta, data.unit_count)
            terms = units.resolve_units(meta, data, released=released)
            assert terms.declared_size == released.declared_size
            assert terms.row_fields()["declared_size_source"] == "dp_count"
            draws[n].append(terms.declared_size)
    sigma = ledger.plan_size_release(SizeReleasePlanRequest(
        epsilon_limit=4.0, delta=units.DP_COUNT_DELTA, target_epsilon=1.0)).event.sigma
    assert sigma > 3
    for n, values in draws.items():
        assert len(set(values)) > 10  # noisy, not a function of n
        assert abs(np.mean(values) - (n + 6 * sigma)) < 4 * sigma / math.sqrt(len(values)) + 1
        assert min(values) >= n  # the margin: P[N̂ < N] = Φ(−6) < 1e-9
    assert set(draws[20]) & set(draws[21])  # the same N̂ arises from both


def test_the_dp_count_delta_is_fixed_never_from_the_count(tmp_path: Path) -> None:
    """Old code: δ = min(1e-6, 1/(10 N)) from the true count; now 1e-6 (or declared)."""
    ledger = FakeLedger()
    for n in (20, 21):
        data = _images(tmp_path, n)
        meta = _meta(size_epsilon=1.0)
        released = units.release_size(ledger, meta, n)
        assert released.delta == units.DP_COUNT_DELTA == 1e-6
        assert units.resolve_units(meta, data, released=released).delta == 1e-6
        declared = _meta(size_epsilon=1.0, delta=1e-7)
        assert units.resolve_units(declared, data, released=units.release_size(
            ledger, declared, n)).delta == 1e-7
    row = released.row_value()
    assert row["margin_z"] == 6.0 and row["failure_probability"] < 1e-9
    assert row["failure_probability"] == pytest.approx(0.5 * math.erfc(6 / math.sqrt(2)))
    assert set(row) == {"release_id", "target_epsilon", "sigma", "margin_z",
                        "failure_probability", "epsilon", "delta"}  # nothing of N


def test_a_count_that_alone_exceeds_the_limit_is_refused_before_any_noise() -> None:
    with pytest.raises(BudgetExhausted):
        units.release_size(FakeLedger(), _meta(epsilon_limit=0.5, size_epsilon=1.0), 20)


def test_declared_bounds_and_replace_one(tmp_path: Path) -> None:
    data = _images(tmp_path, 20)
    terms = units.resolve_units(_meta(declared_size=25), data)
    assert (terms.declared_size, terms.size_source) == (25, "declared")
    assert terms.delta == units.default_delta(25)  # from the declared N̂ only
    low = _refusal(_meta(declared_size=19), data)
    assert "20" not in json.dumps(low.to_problem().model_dump(mode="json"))
    owner = _refusal(_meta(declared_size=19), data, owner=True)  # the owner may see it
    assert owner.extensions["unit_count"] == 20
    # replace-one: a replacement never changes the count, so the true count is public
    replace = units.resolve_units(_meta(neighbouring="replace_one"), data)
    assert (replace.declared_size, replace.size_source) == (20, "true_count")
    public = units.resolve_units(DatasetMetadata(name="p", visibility="public"), data)
    assert (public.declared_size, public.size_source) == (20, "true_count")


def test_metadata_size_rules() -> None:
    with pytest.raises(ValueError, match="not both"):
        _meta(declared_size=30, size_epsilon=1.0)
    with pytest.raises(ValueError, match="add/remove"):
        _meta(size_epsilon=1.0, neighbouring="replace_one")
    with pytest.raises(ValueError, match="private"):
        DatasetMetadata(name="p", visibility="public", size_epsilon=1.0)
    with pytest.raises(ValueError, match="private datasets only"):
        DatasetMetadata(name="p", visibility="public", partitions_disjoint=True)


def _row(visibility: str) -> Dataset:
    return Dataset(
        id="ds_1", tenant_id="ten_1", name="d", visibility=visibility, object_key="k",
        source_format="npz", true_size=20, declared_size=25, declared_size_source="declared",
        class_names=["x"], class_counts={"x": 20}, image_shape=[8, 8, 1], has_masks=False,
        delta=1e-6, epsilon_limit=4.0, neighbouring="add_remove", uploaded_by="key",
        sha256="ab" * 32, size_bytes=4242, created_at=datetime.now(UTC))


def test_the_stored_files_size_and_hash_are_owner_only_for_private_data() -> None:
    """Old code showed both to every reader (an uncompressed npz's size gives N)."""
    reader = dataset_out(_row("private"), owner=False)
    assert reader.sha256 is None and reader.size_bytes is None and reader.true_size is None
    assert reader.declared_size == 25 and reader.declared_size_source == "declared"
    owner = dataset_out(_row("private"), owner=True)
    assert (owner.sha256, owner.size_bytes) == ("ab" * 32, 4242)
    public = dataset_out(_row("public"), owner=False)
    assert (public.sha256, public.size_bytes) == ("ab" * 32, 4242)


# -- item 3: partitions_disjoint ---------------------------------------------------------------

def _subject_meta(**fields: object) -> DatasetMetadata:
    return _meta(label_domain=["a", "b"], privacy_unit="subject", declared_size=10, **fields)


def test_disjointness_of_a_subject_dataset_is_declared_default_false(tmp_path: Path) -> None:
    """Old code computed True from these disjoint data; now the safe default is False."""
    data = _subjects(tmp_path, [0, 0, 1, 2], [0, 0, 1, 1])  # every subject in one class
    assert units.resolve_units(_subject_meta(), data).partitions_disjoint is False
    assert units.resolve_units(_subject_meta(partitions_disjoint=True),
                               data).partitions_disjoint is True


def test_a_false_declaration_of_disjointness_is_refused_naming_nothing(tmp_path: Path) -> None:
    """Old code silently published False (computed); now a declared True that the data
    contradicts is refused, and the refusal says only that."""
    data = _subjects(tmp_path, [0, 0, 1, 2], [0, 1, 1, 1])  # subject 0 in a and b
    err = _refusal(_subject_meta(partitions_disjoint=True), data)
    assert "partitions_disjoint is declared true" in err.detail
    assert err.extensions == {}
    assert not any(ch.isdigit() for ch in err.detail)  # no count, no id
    # declared (or defaulted) False is accepted
    assert units.resolve_units(_subject_meta(partitions_disjoint=False),
                               data).partitions_disjoint is False


def test_images_are_disjoint_by_default_and_may_declare_otherwise(tmp_path: Path) -> None:
    data = _images(tmp_path, 20)
    assert units.resolve_units(_meta(declared_size=20), data).partitions_disjoint is True
    assert units.resolve_units(_meta(declared_size=20, partitions_disjoint=False),
                               data).partitions_disjoint is False  # conservative, allowed
