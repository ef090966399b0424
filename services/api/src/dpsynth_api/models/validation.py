"""Checking an uploaded model folder and repacking it as an uncompressed tar.

Only safetensors weights are accepted: pickle-based formats (``.bin``, ``.pt``, ``.pkl``,
``.ckpt``) can execute code when loaded, so the upload is refused outright.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

from dpsynth_shared.errors import DpsynthError, ErrorCode

from dpsynth_api.archives import SafeArchive

FORBIDDEN_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
INFO_FILE = "dpsynth_model.json"
_MAX_INFO_BYTES = 1 << 20


def _invalid(detail: str) -> DpsynthError:
    return DpsynthError(ErrorCode.INVALID_MODEL, detail)


def _strip_root(names: list[str]) -> str:
    # A folder archived with its own top directory: "mymodel/unet/config.json".
    if INFO_FILE in names:
        return ""
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) == 1 and all("/" in n for n in names):
        return tops.pop() + "/"
    return ""


def check_model_archive(archive: SafeArchive) -> str:
    """Validate the members of a model archive.

    Returns:
        The common root prefix to strip (a folder archived with its top directory).

    Raises:
        DpsynthError: 422 ``invalid_model``.
    """
    names = [m.name for m in archive.members]
    forbidden = [n for n in names if n.lower().endswith(FORBIDDEN_SUFFIXES)]
    if forbidden:
        raise _invalid(f"pickle-based weight files are refused (safetensors only): {forbidden[:5]}")
    root = _strip_root(names)
    rel = {n[len(root):]: n for n in names if n.startswith(root)}
    if not any(n.endswith(".safetensors") for n in rel):
        raise _invalid("the model has no .safetensors weights")
    if not any(n == "config.json" or n.endswith("/config.json") for n in rel):
        raise _invalid("the model has no config.json (diffusers save_pretrained layout)")
    if INFO_FILE not in rel:
        raise _invalid(f"the model has no {INFO_FILE} at its root")
    info_size = next(m.size for m in archive.members if m.name == rel[INFO_FILE])
    if info_size > _MAX_INFO_BYTES:
        raise _invalid(f"{INFO_FILE} is too large")
    return root


def repack(archive: SafeArchive, root: str, dest: Path) -> dict[str, Any]:
    """Write the model's files (root stripped) into an uncompressed tar at ``dest``.

    Returns:
        The parsed ``dpsynth_model.json``.
    """
    info: dict[str, Any] | None = None
    with tarfile.open(dest, mode="w", format=tarfile.PAX_FORMAT) as out:
        for name, data in archive.iter_files():
            if not name.startswith(root):
                continue
            rel = name[len(root):]
            if rel == INFO_FILE:
                info = _parse_info(data)
            member = tarfile.TarInfo(rel)
            member.size, member.mode = len(data), 0o644
            out.addfile(member, io.BytesIO(data))
    if info is None:
        raise _invalid(f"the model has no {INFO_FILE} at its root")
    return info


def _parse_info(data: bytes) -> dict[str, Any]:
    try:
        info = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _invalid(f"{INFO_FILE} is not valid JSON") from exc
    if not isinstance(info, dict):
        raise _invalid(f"{INFO_FILE} must be a JSON object")
    return info
