"""Content hashes of model directories.

:func:`model_hash` identifies a whole model directory exactly (released models, provenance in
training and generation manifests); :func:`_part_fingerprint` compares one part (``vae/``,
``scheduler/``) across model directories while ignoring the diffusers bookkeeping that may
differ between two saves of the same weights (used when bundling per-label models,
:func:`dpsynth_ml.models.model_io.save_per_label_model`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def model_hash(model_dir: Path) -> str:
    """SHA-256 over the sorted files of a model directory.

    Each file contributes its POSIX relative path, a NUL byte, its size and its bytes, so
    renames and content changes both change the hash.

    Args:
        model_dir: the model directory.

    Returns:
        Hex digest.
    """
    root = Path(model_dir)
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        digest.update(rel.encode() + b"\0" + str(path.stat().st_size).encode() + b"\0")
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _part_fingerprint(part_dir: Path) -> str:
    """SHA-256 of a part's weights and configs, ignoring where diffusers loaded it from and
    which version wrote it (a resumed job bundles classes saved by two attempts)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(part_dir).rglob("*") if p.is_file()):
        digest.update(path.relative_to(part_dir).as_posix().encode() + b"\0")
        if path.suffix == ".json":
            config = json.loads(path.read_text())
            for key in ("_diffusers_version", "_name_or_path"):
                config.pop(key, None)
            digest.update(json.dumps(config, sort_keys=True).encode())
        else:
            digest.update(path.read_bytes())
    return digest.hexdigest()
