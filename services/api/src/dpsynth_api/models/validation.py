"""Checking an uploaded model folder and repacking it as an uncompressed tar.

A model upload is the zip (or tar) of a diffusers ``save_pretrained`` folder plus dpsynth's
``dpsynth_model.json``, in one of two layouts (``space`` in ``dpsynth_model.json``,
:mod:`dpsynth_api.models.info_file`): a latent model has every folder below, a pixel model
(a denoiser on images up to 64x64, no autoencoder) every folder but ``vae/``::

    dpsynth_model.json                                  format version, space, classes, sizes
    vae/config.json + diffusion_pytorch_model.safetensors   AutoencoderKL (latent models only)
    unet/config.json + diffusion_pytorch_model.safetensors           the denoiser, or
    denoisers/<key>/unet/...  (+ denoisers/<key>/class_embedder/...)  one per class
    scheduler/scheduler_config.json                                  DDPM/DDIM/DPM-Solver
    class_embedder/config.json + model.safetensors     the class tokens (UNet2DConditionModel)
    dpsynth_provenance.json                            (downloads of trained models; dropped)

Checks, each refusal a 422 ``invalid_model`` problem naming the file:

1. From the archive's headers, before a byte is read: no pickle-based weights (``.bin``,
   ``.pt``, ``.pth``, ``.pkl``, ``.ckpt`` can execute code when loaded), no Python files, no
   file outside the layout above, per-file size limits (configs 64 KiB, weights bounded by
   the parameter limits), every component complete.
2. From the contents: every config against the allow-list of
   :mod:`dpsynth_shared.model_configs` (classes, keys, block types, sizes, no ``auto_map`` or
   other remote-code hints); every safetensors header parsed and checked (length prefix,
   JSON, dtypes, shapes, offsets contiguous and inside the file); ``dpsynth_model.json``
   against its schema; and the parts against each other (the layout of the model's space,
   channels, sizes, classes).

The safetensors header checks are in :mod:`dpsynth_api.models.safetensors_header`, the
``dpsynth_model.json`` schema in :mod:`dpsynth_api.models.info_file` and the cross-checks of
the parts in :mod:`dpsynth_api.models.consistency`.
"""

from __future__ import annotations

import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dpsynth_shared.job_specs import MAX_PIXEL_IMAGE_SIZE
from dpsynth_shared.model_configs import (
    DEFAULT_LIMITS,
    ConfigLimits,
    ModelConfigError,
    check_config,
    parse_config,
)

from dpsynth_api.archives import MemberStream, SafeArchive, read_exactly, read_whole
from dpsynth_api.models.consistency import check_consistency as _check_parts

# dpsynth_model.json's schema and checks live in info_file; re-exported for their readers
from dpsynth_api.models.info_file import INFO_FILE as INFO_FILE
from dpsynth_api.models.info_file import MODEL_FORMAT_VERSION as MODEL_FORMAT_VERSION
from dpsynth_api.models.info_file import ModelInfoFile as ModelInfoFile
from dpsynth_api.models.info_file import invalid_model as _invalid
from dpsynth_api.models.info_file import parse_info as parse_info

# safetensors headers are read and checked in their own module; re-exported for their callers
from dpsynth_api.models.safetensors_header import _MAX_HEADER_BYTES
from dpsynth_api.models.safetensors_header import DTYPES as DTYPES
from dpsynth_api.models.safetensors_header import check_safetensors as check_safetensors
from dpsynth_api.models.safetensors_header import check_safetensors_head as check_safetensors_head
from dpsynth_api.models.safetensors_header import read_safetensors_head as read_safetensors_head

FORBIDDEN_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
CODE_SUFFIXES = (".py", ".pyc", ".pyo", ".pyd", ".so", ".dll", ".dylib", ".sh", ".ipynb")
PROVENANCE_FILE = "dpsynth_provenance.json"
_MAX_INFO_BYTES = 1 << 20
#: folder -> (config file, weights file or None).
COMPONENT_FILES: dict[str, tuple[str, str | None]] = {
    "vae": ("config.json", "diffusion_pytorch_model.safetensors"),
    "unet": ("config.json", "diffusion_pytorch_model.safetensors"),
    "scheduler": ("scheduler_config.json", None),
    "class_embedder": ("config.json", "model.safetensors"),
}
_PER_LABEL = ("unet", "class_embedder")
_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}$")
_LAYOUT_HINT = ("a latent model holds dpsynth_model.json, vae/, scheduler/, unet/ (or "
                "denoisers/<key>/unet/ per class) and class_embedder/, with safetensors "
                "weights; a pixel model (dpsynth_model.json space 'pixel', images up to "
                f"{MAX_PIXEL_IMAGE_SIZE}x{MAX_PIXEL_IMAGE_SIZE}) holds the same without vae/")

Kind = Literal["info", "provenance", "config", "weights"]


@dataclass(frozen=True)
class Entry:
    """What one archive member is in the model layout."""

    kind: Kind
    component: str | None = None
    prefix: str = ""  # "" or "denoisers/<key>/"


def classify(rel: str) -> Entry | None:
    """The place of ``rel`` (a path inside the model folder) in the layout; None if none."""
    if rel == INFO_FILE:
        return Entry("info")
    if rel == PROVENANCE_FILE:
        return Entry("provenance")
    parts = rel.split("/")
    prefix = ""
    if len(parts) == 4 and parts[0] == "denoisers" and _KEY.match(parts[1]):
        if parts[2] not in _PER_LABEL:
            return None
        prefix, parts = f"denoisers/{parts[1]}/", parts[2:]
    if len(parts) != 2 or parts[0] not in COMPONENT_FILES:
        return None
    config_file, weights_file = COMPONENT_FILES[parts[0]]
    if parts[1] == config_file:
        return Entry("config", parts[0], prefix)
    if parts[1] == weights_file:
        return Entry("weights", parts[0], prefix)
    return None


def _strip_root(names: list[str]) -> str:
    # A folder archived with its own top directory: "mymodel/unet/config.json".
    if INFO_FILE in names:
        return ""
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) == 1 and all("/" in n for n in names):
        return tops.pop() + "/"
    return ""


def weights_limit(component: str, limits: ConfigLimits = DEFAULT_LIMITS) -> int:
    """The largest weights file of ``component`` (its parameter bound in float64 + header)."""
    params = {"unet": limits.max_unet_parameters, "vae": limits.max_vae_parameters,
              "class_embedder": (limits.max_classes + 1) * limits.max_cross_attention_dim}
    return params[component] * 8 + _MAX_HEADER_BYTES + 8


def check_model_archive(archive: SafeArchive, limits: ConfigLimits = DEFAULT_LIMITS) -> str:
    """Validate the members of a model archive from its headers (names, sizes, layout).

    Returns:
        The common root prefix to strip (a folder archived with its top directory).

    Raises:
        DpsynthError: 422 ``invalid_model``.
    """
    names = [m.name for m in archive.members]
    forbidden = [n for n in names if n.lower().endswith(FORBIDDEN_SUFFIXES)]
    if forbidden:
        raise _invalid(f"pickle-based weight files are refused (safetensors only): {forbidden[:5]}",
                       files=forbidden[:5])
    code = [n for n in names if n.lower().endswith(CODE_SUFFIXES)]
    if code:
        raise _invalid(f"code files are refused (no custom or remote code): {code[:5]}",
                       files=code[:5])
    root = _strip_root(names)
    sizes = {m.name[len(root):]: m.size for m in archive.members if m.name.startswith(root)}
    outside = [n for n in names if not n.startswith(root)]
    entries = {rel: classify(rel) for rel in sizes}
    unexpected = outside + [rel for rel, e in entries.items() if e is None]
    if unexpected:
        raise _invalid(f"unexpected file(s) in the model folder: {unexpected[:5]}; "
                       f"{_LAYOUT_HINT}", files=unexpected[:5])
    if INFO_FILE not in sizes:
        raise _invalid(f"the model has no {INFO_FILE} at its root")
    for rel, entry in entries.items():
        assert entry is not None
        _check_size(rel, entry, sizes[rel], limits)
    _check_complete(entries)
    return root


def _check_size(rel: str, entry: Entry, size: int, limits: ConfigLimits) -> None:
    if entry.kind in ("info", "provenance"):
        bound = _MAX_INFO_BYTES
    elif entry.kind == "config":
        bound = limits.max_config_bytes
    else:
        assert entry.component is not None
        bound = weights_limit(entry.component, limits)
    if size > bound:
        raise _invalid(f"{rel} is {size} bytes, over the limit of {bound} bytes", file=rel,
                       limit=bound)


def _check_complete(entries: dict[str, Entry | None]) -> None:
    present = {(e.prefix, e.component, e.kind) for e in entries.values()
               if e is not None and e.component is not None}
    if not any(kind == "weights" for _, _, kind in present):
        raise _invalid("the model has no .safetensors weights")
    folders = {(prefix, comp) for prefix, comp, _ in present}
    for prefix, comp in sorted(folders):
        config_file, weights_file = COMPONENT_FILES[comp]
        if (prefix, comp, "config") not in present:
            raise _invalid(f"{prefix}{comp}/ has no {config_file} (diffusers save_pretrained "
                           "layout)", file=f"{prefix}{comp}/{config_file}")
        if weights_file and (prefix, comp, "weights") not in present:
            raise _invalid(f"{prefix}{comp}/ has no {weights_file} (safetensors weights)",
                           file=f"{prefix}{comp}/{weights_file}")
    # vae/ is there or not by the model's space, which only dpsynth_model.json says: that is
    # checked with the contents (check_consistency)
    if ("", "scheduler") not in folders:
        raise _invalid(f"the model has no scheduler/ folder; {_LAYOUT_HINT}")
    denoisers = {p for p, c in folders if c == "unet"}
    if not denoisers:
        raise _invalid(f"the model has no unet/ (nor denoisers/<key>/unet/); {_LAYOUT_HINT}")
    orphans = [p for p, c in folders if c == "class_embedder" and p not in denoisers
               and p != ""]
    if orphans:
        raise _invalid(f"{orphans[0]}class_embedder/ has no unet/ beside it")


# --- contents and repacking ------------------------------------------------------------

@dataclass
class CheckedModel:
    """What the contents check found: the info and every config, by path."""

    info: dict[str, Any]
    configs: dict[str, tuple[Entry, dict[str, Any]]] = field(default_factory=dict)
    #: (prefix, component) -> number of values in its safetensors weights.
    values: dict[tuple[str, str], int] = field(default_factory=dict)

    def config(self, component: str, prefix: str = "") -> dict[str, Any] | None:
        for entry, config in self.configs.values():
            if entry.component == component and entry.prefix == prefix:
                return config
        return None


def check_member(rel: str, data: bytes, checked: CheckedModel,
                 limits: ConfigLimits = DEFAULT_LIMITS, *, size: int | None = None) -> bool:
    """Check one member's contents; returns whether it is kept in the stored model.

    ``data`` is the whole member, or for weights of ``size`` bytes only their head
    (:func:`read_safetensors_head`).

    Raises:
        DpsynthError: 422 ``invalid_model``.
    """
    entry = classify(rel)
    if entry is None:  # check_model_archive refused these already
        raise _invalid(f"unexpected file in the model folder: {rel!r}")
    if entry.kind == "info":
        checked.info = parse_info(data)
        return True
    if entry.kind == "provenance":
        # A downloaded trained model carries the provenance of its training; an upload's
        # lineage is the api's record, so the file is not kept.
        return False
    assert entry.component is not None
    if entry.kind == "config":
        try:
            config = parse_config(data, component=entry.component, limits=limits)
            check_config(entry.component, config, limits=limits)
        except ModelConfigError as exc:
            raise _invalid(f"{rel}: {exc}", file=rel, key=exc.key) from exc
        checked.configs[rel] = (entry, config)
        return True
    max_elements = (weights_limit(entry.component, limits) - _MAX_HEADER_BYTES - 8) // 8
    checked.values[(entry.prefix, entry.component)] = check_safetensors_head(
        data, len(data) if size is None else size, name=rel, max_elements=max_elements)
    return True


class _Prefixed:
    """A member's already-read head, then the rest of its stream (for ``tarfile``)."""

    def __init__(self, head: bytes, rest: MemberStream) -> None:
        self._head, self._rest = head, rest

    def read(self, size: int = -1, /) -> bytes:
        """``size`` bytes, fewer only at the end (``tarfile`` refuses a short read)."""
        if size < 0:
            raise ValueError("a member is copied in bounded reads only")
        taken, self._head = self._head[:size], self._head[size:]
        return taken + read_exactly(self._rest, size - len(taken))


def repack(archive: SafeArchive, root: str, dest: Path,
           limits: ConfigLimits = DEFAULT_LIMITS) -> CheckedModel:
    """Check every member's contents and write the kept ones (root stripped) into an
    uncompressed tar at ``dest``.

    Returns:
        The parsed ``dpsynth_model.json`` and configs, cross-checked.

    Raises:
        DpsynthError: 422 ``invalid_model``.
    """
    checked = CheckedModel(info={})
    with tarfile.open(dest, mode="w", format=tarfile.PAX_FORMAT) as out:
        # Weights are streamed into the tar after their header is checked: memory per
        # upload stays at one header or one small file, whatever the weights weigh.
        for name, size, stream in archive.iter_members():
            if not name.startswith(root):
                continue
            rel = name[len(root):]
            entry = classify(rel)
            data = (read_safetensors_head(stream, size, name=rel)
                    if entry is not None and entry.kind == "weights"
                    else read_whole(stream, size, archive.limits, where=f"member {name!r}"))
            if not check_member(rel, data, checked, limits, size=size):
                continue
            member = tarfile.TarInfo(rel)
            member.size, member.mode = size, 0o644
            out.addfile(member, _Prefixed(data, stream))
            if stream.read(1):  # at the end: a zip member's CRC is checked here
                raise _invalid(f"{rel} is longer than its archive header says", file=rel)
    if not checked.info:
        raise _invalid(f"the model has no {INFO_FILE} at its root")
    check_consistency(checked)
    return checked


def check_consistency(checked: CheckedModel) -> None:
    """The parts must fit together (:mod:`dpsynth_api.models.consistency`): the layout of
    the model's space, image and latent channels, sizes, classes, class tokens.

    Raises:
        DpsynthError: 422 ``invalid_model`` naming the two sides that disagree.
    """
    _check_parts(checked, layout_hint=_LAYOUT_HINT)
