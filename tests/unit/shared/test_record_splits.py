"""The keyed-hash split rule (dpsynth_shared.record_splits, issue 13 item 1): pinned to its
HMAC formula, exact at the fraction's edges, and 1-stable: adding or removing one unit of
a list changes the first part by at most that unit, wherever it is inserted."""

from __future__ import annotations

import hashlib
import hmac

import numpy as np
import pytest
from dpsynth_shared.record_splits import (
    SPLIT_SCHEME,
    draw_key,
    in_first_part,
    record_hashes,
    threshold,
)
from hypothesis import given, settings
from hypothesis import strategies as st

KEY = b"pinned-key-0123456789"


def _hash(i: int) -> str:
    return hashlib.sha256(f"unit-{i}".encode()).hexdigest()


def test_the_rule_is_hmac_sha256_of_the_unit_hash_below_f_times_two_to_the_64() -> None:
    hashes = [_hash(i) for i in range(200)]
    expected = [int.from_bytes(hmac.new(KEY, SPLIT_SCHEME + h.encode(), hashlib.sha256)
                               .digest()[:8], "big") < int(0.3 * 2**64) for h in hashes]
    assert in_first_part(KEY, hashes, 0.3).tolist() == expected
    assert 30 <= sum(expected) <= 90  # about f·U, not a quota


def test_the_edges_and_the_threshold_are_exact() -> None:
    hashes = [_hash(i) for i in range(50)]
    assert not in_first_part(KEY, hashes, 0.0).any()
    assert in_first_part(KEY, hashes, 1.0).all()
    assert threshold(0.5) == 2**63 and threshold(0.25) == 2**62
    with pytest.raises(ValueError):
        threshold(1.5)
    with pytest.raises(ValueError):
        in_first_part(b"", hashes, 0.5)


def test_the_same_record_falls_on_one_side_and_keys_differ() -> None:
    hashes = [_hash(i) for i in range(400)]
    first = in_first_part(KEY, hashes + hashes[:5], 0.5)
    assert first[400:].tolist() == first[:5].tolist()
    other = in_first_part(draw_key(), hashes, 0.5)
    assert not np.array_equal(first[:400], other)
    assert len(draw_key()) == 32 and draw_key() != draw_key()


def test_the_worker_and_the_api_hash_the_same_record_the_same() -> None:
    from dpsynth_api.datasets import overlap

    images = np.random.default_rng(1).integers(0, 256, size=(7, 4, 4, 3), dtype=np.uint8)
    assert overlap.record_hashes(images) == record_hashes(images)


@settings(max_examples=200, deadline=None)
@given(units=st.lists(st.integers(0, 10**6), min_size=0, max_size=60, unique=True),
       change=st.integers(0, 10**6), where=st.integers(0, 60),
       fraction=st.floats(0.01, 0.99), remove=st.booleans(),
       key=st.binary(min_size=1, max_size=40))
def test_one_unit_more_or_less_changes_the_first_part_by_at_most_that_unit(
        units: list[int], change: int, where: int, fraction: float, remove: bool,
        key: bytes) -> None:
    hashes = [_hash(u) for u in units]
    if remove and hashes:
        changed = hashes[where % len(hashes)]
        other = [h for h in hashes if h != changed]
    else:
        changed = _hash(10**7 + change)  # a unit not in the list, inserted anywhere
        other = [*hashes[:where], changed, *hashes[where:]]
    first = {h for h, side in zip(hashes, in_first_part(key, hashes, fraction), strict=True)
             if side}
    second = {h for h, side in zip(other, in_first_part(key, other, fraction), strict=True)
              if side}
    assert first ^ second <= {changed}
    rest = {h for h in hashes if h != changed}  # and so does the other part
    assert {h for h in rest if h not in first} == {h for h in rest if h not in second}
