"""Record content hashes and the 1-stable split rule (issue 13, item 1).

Pure functions (numpy and hashlib only), shared by the api, which splits an upload into its
training and held-out parts at ingest, and the worker, which applies a derived dataset's
split inside a job (docs/privacy.md "Held-out and derived splits are 1-stable").

**The rule** (``keyed_hash_v1``). A unit (a record, or a subject of a subject-level dataset)
falls in the first part of a split at fraction f iff

    u = the first 8 bytes (big-endian) of HMAC-SHA256(key, "dpsynth-split-v1|" + unit_hash)
    u < floor(f · 2^64)

where ``unit_hash`` is the unit's own hash: the record's content hash
(:func:`record_hashes`) or the subject's keyed hash. The side of a unit depends on the key,
f and that unit alone, never on the other units or on its position, so adding or removing
one unit changes each part by at most that unit (the seeded permutation it replaces moved
hundreds of other records). The key is fixed before the data is seen (the owner's, or drawn
from OS entropy); it need not be secret: the guarantee rests on the rule's locality, not on
hiding which side a candidate record would fall. The comparison is on integers: f · 2^64 is
exact in binary floating point, so the rule has no rounding ambiguity across platforms.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from collections.abc import Sequence

import numpy as np

HASH_SCHEME = "dpsynth-record-v1"
"""Prefix of every hashed record message; a new canonical form gets a new scheme."""
SPLIT_SCHEME = b"dpsynth-split-v1|"
"""Prefix of every split message (another hash space than the record hashes)."""
SPLIT_RULE = "keyed_hash_v1"
"""The name of the rule above, recorded with every split made by it."""
LEGACY_RULE = "seeded_permutation_v0"
"""Splits made before the rule: a seeded permutation of the whole upload (not 1-stable)."""
KEY_BYTES = 32
"""Length of a key drawn by the platform."""


def record_hashes(images: np.ndarray) -> list[str]:
    """The content hash of each record: sha256 over its canonical decoded pixels.

    The message is ``scheme | dtype | shape | raw bytes`` of the record's image as stored in
    the canonical npz (uint8 ``[H,W,C]``), so the same image hashes the same whatever the
    upload's container (a PNG in an image folder, or a row of an ``.npz``), and the worker
    recomputes from the stored object exactly the hash the api stored at ingest. One sha256
    per row over a contiguous view: no per-record copy (70k 28x28 images take well under a
    second).

    Args:
        images: canonical images ``[N,H,W,C]``.

    Returns:
        N lowercase hex digests, in record order.
    """
    array = np.ascontiguousarray(images)
    n = int(array.shape[0])
    if n == 0:  # an empty selection (a class with no record, a split keeping none)
        return []
    shape = "x".join(str(int(d)) for d in array.shape[1:])
    base = hashlib.sha256(f"{HASH_SCHEME}|{array.dtype.str}|{shape}|".encode())
    rows = array.reshape(n, -1)
    out: list[str] = []
    for row in rows:
        digest = base.copy()
        digest.update(row.data)
        out.append(digest.hexdigest())
    return out


def draw_key() -> bytes:
    """A fresh split key from OS entropy (``secrets``), independent of any data."""
    return secrets.token_bytes(KEY_BYTES)


def threshold(fraction: float) -> int:
    """``floor(fraction · 2^64)``: a unit with draw ``u < threshold`` is in the first part.

    Raises:
        ValueError: ``fraction`` outside [0, 1].
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"a split fraction is in [0, 1], not {fraction!r}")
    return math.floor(fraction * 2.0**64)


def unit_draws(key: bytes, unit_hashes: Sequence[str]) -> list[int]:
    """Each unit's draw u in [0, 2^64): the first 8 bytes of its keyed split hash."""
    return [int.from_bytes(hmac.new(key, SPLIT_SCHEME + h.encode(), hashlib.sha256)
                           .digest()[:8], "big") for h in unit_hashes]


def in_first_part(key: bytes, unit_hashes: Sequence[str], fraction: float) -> np.ndarray:
    """Which units fall in the first part (share ``fraction``) of the keyed-hash split.

    Args:
        key: the split's key (bytes; at least one byte).
        unit_hashes: each unit's own hash (record content hashes, or keyed subject hashes).
        fraction: the first part's expected share f, in [0, 1].

    Returns:
        ``[len(unit_hashes)]`` bool, True for the units of the first part. Equal hashes
        (the same record twice) fall on the same side.

    Raises:
        ValueError: an empty key or a fraction outside [0, 1].
    """
    if not key:
        raise ValueError("a split key is at least one byte")
    cut = threshold(fraction)
    return np.fromiter((u < cut for u in unit_draws(key, unit_hashes)), dtype=bool,
                       count=len(unit_hashes))
