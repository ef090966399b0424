"""Content-addressed cache of PUBLIC pretrainings, so that no benchmark run pays twice.

:func:`cached_pretrain`: ``dpsynth_ml.train``'s model of a ``PretrainTraining``, trained on a miss.

**Key**: sha256 of the canonical JSON (sorted keys, no spaces) of :func:`key_inputs`:
``spec`` (class name and every field, ``seed`` included, nested dataclasses, mappings and
tuples made JSON-stable: a pretraining is seeded by ``spec.seed`` alone; ``train``'s
``_test_generator`` only stamps it ``rng: "test"``, so it is not accepted here),
``dataset_sha256`` (the dataset file's bytes; ``np.savez`` writes the same bytes for the
same arrays), ``ml_core_sha256`` (:func:`ml_core_digest`: every ``*.py`` of the imported
``dpsynth_ml``, i.e. ``services/worker/src/dpsynth_ml``, by relative path: path + bytes),
``model_format_version``, the torch, diffusers, numpy and Python versions, ``cache_format``.

NOT in the key: the torch thread count, the CPU (instruction set, BLAS), the device. They
change float rounding, so a rerun's weights may differ in their last bits, never in what was
trained on or how: the data is public and a pretraining is one sample of the same
distribution of models, all a benchmark reading it assumes (they already share one
pretraining per source across seeds).

**Storage**: ``<cache_dir>/<key>/model/`` and ``<cache_dir>/<key>/entry.json`` (the key's
inputs in clear, the model's ``model_io.model_hash``, the training result's fields, the date,
the pretraining's wall time). ``cache_dir``: the argument, else ``$DPSYNTH_PRETRAIN_CACHE``,
else ``~/.cache/dpsynth/pretrain``; ``DPSYNTH_PRETRAIN_CACHE=off`` disables reuse (always
trains, into ``scratch_dir`` or a new temporary directory). Clear it with ``rm -rf``.

**Eviction** (least recently used): the cache holds at most ``max_bytes`` (the argument,
else ``$DPSYNTH_PRETRAIN_CACHE_MAX_GB`` in GB of 10⁹ bytes, float, else 10 GB; a cap that is
not a positive finite number is refused with a ValueError, cache on, before training). An
entry's last use is the modification time of its ``entry.json``: set when it is stored,
refreshed with ``os.utime`` on every lookup (before the model is verified, so a concurrent
pruner already sees it as recent); its content is never rewritten. After a miss stores its
entry, the cache is pruned: the size of every entry (a ``<key>/`` directory whose
``entry.json`` parses and names that key; all its files) is summed, and the least recently
used entries are discarded (renamed aside, then deleted; one log line each) until the total
is at most the cap. The entry just stored is never evicted: alone larger than the cap, it
stays (and a line says so). An entry whose ``entry.json`` was touched after the listing (a
concurrent hit) is skipped. ``.tmp-*`` directories (a writer still training) are neither
counted nor touched; ``.trash-*`` leftovers (a discard that was interrupted) are deleted.
A hit does not prune, so a lowered cap applies at the next miss. An entry that a running
benchmark still reads is the most recently used when its run started; it can only be
evicted when the entries stored since then fill the cap.

**Safety rules**: only a ``PretrainTraining`` goes through here (never anything that reads
private data); an entry is written whole (trained into a temporary directory inside
``cache_dir``, then ``os.replace``-d into place; a writer that loses the race drops its copy
and uses the winner's entry); on a hit the stored content hash is checked against the model
directory, and a mismatch or a missing or corrupt entry is discarded (one line says why) and
retrained. Callers treat the returned model directory as read-only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import platform
import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from dpsynth_ml import PretrainTraining, TrainingResult

ENV = "DPSYNTH_PRETRAIN_CACHE"
MAX_GB_ENV = "DPSYNTH_PRETRAIN_CACHE_MAX_GB"
DEFAULT_MAX_GB = 10.0
GB = 10**9
CACHE_FORMAT = 1
ENTRY_FILE = "entry.json"


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """A pretraining, fresh or reused; ``result.model_dir`` is read-only for the caller."""

    result: TrainingResult
    cache: Literal["hit", "miss", "off"]
    key: str
    pretrain_s: float          # wall time of the training that produced the model
    reuse_s: float | None = None  # a hit: seconds to find and verify the entry

    @property
    def model_dir(self) -> Path:
        return self.result.model_dir

    def record(self) -> dict[str, Any]:
        """What a benchmark result records about this pretraining."""
        reuse = {} if self.reuse_s is None else {"reuse_s": round(self.reuse_s, 3)}
        return {"cache": self.cache, "key": self.key,
                "pretrain_s": round(self.pretrain_s, 1), **reuse}


def _log(message: str) -> None:
    print(f"[pretrain-cache] {message}", flush=True)


def _jsonable(value: Any) -> Any:
    """A JSON-stable form: dataclasses by class name and fields, mappings with string keys."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"__class__": type(value).__name__,
                **{f.name: _jsonable(getattr(value, f.name))
                   for f in dataclasses.fields(value)}}
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"cannot key a {type(value).__name__} ({value!r})")


def file_sha256(path: Path) -> str:
    with Path(path).open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def ml_core_digest() -> str:
    """sha256 over every ``*.py`` of the ``dpsynth_ml`` package: relative path, NUL, bytes."""
    import dpsynth_ml

    root = Path(dpsynth_ml.__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def key_inputs(spec: PretrainTraining, dataset_path: Path) -> dict[str, Any]:
    """Everything the key covers, in clear (see the module docstring)."""
    import diffusers
    import numpy
    import torch
    from dpsynth_ml.spec import MODEL_FORMAT_VERSION

    return {"cache_format": CACHE_FORMAT, "spec": _jsonable(spec),
            "dataset_sha256": file_sha256(dataset_path), "ml_core_sha256": ml_core_digest(),
            "model_format_version": MODEL_FORMAT_VERSION, "torch": torch.__version__,
            "diffusers": diffusers.__version__, "numpy": numpy.__version__,
            "python": platform.python_version()}


def cache_key(inputs: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of ``inputs`` (sorted keys, no spaces)."""
    canonical = json.dumps(_jsonable(inputs), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def resolve_cache_dir(cache_dir: Path | str | None = None) -> Path | None:
    """The cache directory, or None when reuse is off (``$DPSYNTH_PRETRAIN_CACHE=off`` wins)."""
    env = os.environ.get(ENV, "").strip()
    if env.lower() == "off" or str(cache_dir).strip().lower() == "off":
        return None
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "dpsynth" / "pretrain"


def resolve_max_bytes(max_bytes: int | None = None) -> int:
    """The cache's size cap in bytes: ``max_bytes``, else ``$DPSYNTH_PRETRAIN_CACHE_MAX_GB``
    (GB of 10⁹ bytes; unset or blank: 10). Raises ValueError for a cap that is not a positive
    finite number (to stop reusing pretrainings, set ``$DPSYNTH_PRETRAIN_CACHE=off``)."""
    if max_bytes is not None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"max_bytes must be a positive number of bytes, not {max_bytes!r}")
        return max_bytes
    raw = os.environ.get(MAX_GB_ENV, "").strip()
    if not raw:
        return int(DEFAULT_MAX_GB * GB)
    try:
        gb = float(raw)
    except ValueError:
        raise ValueError(f"${MAX_GB_ENV}={raw!r} is not a number of gigabytes") from None
    if not math.isfinite(gb) or gb <= 0:
        raise ValueError(f"${MAX_GB_ENV}={raw!r}: the cap must be a positive, finite number "
                         f"of gigabytes (to stop reusing pretrainings, set ${ENV}=off)")
    return max(1, int(gb * GB))


def _run_train(spec: PretrainTraining, dataset_path: Path,
               out_dir: Path) -> tuple[TrainingResult, float]:
    """The one call that trains, and its wall seconds (tests wrap it to count calls)."""
    from dpsynth_ml import train

    started = time.perf_counter()
    result = train(spec, dataset_path=Path(dataset_path), out_dir=Path(out_dir))
    return result, time.perf_counter() - started


def _discard(entry_dir: Path) -> None:
    """Remove an entry: renamed aside first, so no reader sees it half deleted."""
    trash = entry_dir.parent / f".trash-{entry_dir.name[:16]}-{uuid.uuid4().hex[:8]}"
    with contextlib.suppress(FileNotFoundError):
        os.replace(entry_dir, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _touch(entry_dir: Path) -> None:
    """Mark an entry used now: ``entry.json``'s modification time, its content untouched."""
    with contextlib.suppress(OSError):  # absent: the lookup that follows discards the entry
        os.utime(entry_dir / ENTRY_FILE)


def _tree_size(path: Path) -> int:
    """Bytes of every file under ``path`` (files that vanish meanwhile count as 0)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


@dataclasses.dataclass(frozen=True)
class _Stored:
    """One valid entry as the pruner sees it."""

    key: str
    path: Path
    last_used: float  # entry.json's st_mtime
    size: int
    label: str


def _stored_entries(root: Path) -> list[_Stored]:
    """The valid entries under ``root`` (``<key>/`` with an ``entry.json`` that parses and
    names that key), least recently used first; deletes ``.trash-*`` leftovers on the way and
    skips ``.tmp-*`` (a writer still at work) and anything else."""
    stored = []
    for child in root.iterdir():
        if child.name.startswith(".trash-"):
            shutil.rmtree(child, ignore_errors=True)
            continue
        if child.name.startswith(".") or child.is_symlink() or not child.is_dir():
            continue
        entry_file = child / ENTRY_FILE
        try:
            entry = json.loads(entry_file.read_text())
            if not isinstance(entry, dict) or entry.get("key") != child.name:
                continue
            last_used = entry_file.stat().st_mtime
        except (OSError, ValueError):
            continue
        stored.append(_Stored(child.name, child, last_used, _tree_size(child),
                              str(entry.get("label", "?"))))
    return sorted(stored, key=lambda e: (e.last_used, e.key))


def prune(root: Path, max_bytes: int, *, keep: str, label: str) -> list[str]:
    """Evict least recently used entries of ``root`` until they total at most ``max_bytes``,
    never ``keep`` (the entry just stored); returns the evicted keys. See the module
    docstring ("Eviction")."""
    stored = _stored_entries(root)
    total = sum(e.size for e in stored)
    evicted: list[str] = []
    for e in stored:
        if total <= max_bytes:
            break
        if e.key == keep:
            continue
        with contextlib.suppress(OSError):
            if (e.path / ENTRY_FILE).stat().st_mtime > e.last_used:
                continue  # hit by another run since the listing: recent now
        _discard(e.path)
        total -= e.size
        evicted.append(e.key)
        used = datetime.fromtimestamp(e.last_used, UTC).isoformat(timespec="seconds")
        _log(f"{label}: evicted {e.key[:12]} ({e.label}, {e.size / 1e6:.1f} MB, last used "
             f"{used}) to keep the cache under {max_bytes / GB:g} GB")
    if total > max_bytes:
        kept = next((e for e in stored if e.key == keep), None)
        if kept is not None and kept.size > max_bytes:
            _log(f"{label}: entry {keep[:12]} alone ({kept.size / 1e6:.1f} MB) is larger "
                 f"than the cache's cap of {max_bytes / GB:g} GB; kept")
        else:
            _log(f"{label}: the cache holds {total / 1e6:.1f} MB, over its cap of "
                 f"{max_bytes / GB:g} GB (entries in use by other runs were kept)")
    return evicted


def _lookup(entry_dir: Path, key: str, label: str) -> tuple[TrainingResult, float] | None:
    """A verified entry's result and original pretrain seconds; None (and discarded) if the
    entry is absent, corrupt or its model does not match its recorded hash."""
    from dpsynth_ml import TrainingResult
    from dpsynth_ml.models.model_io import model_hash

    if not entry_dir.exists():
        return None
    _touch(entry_dir)  # used now (before verifying, so a concurrent pruner sees it as recent)
    try:
        entry = json.loads((entry_dir / ENTRY_FILE).read_text())
        model_dir, r = entry_dir / "model", entry["result"]
        if entry.get("key") != key or not model_dir.is_dir():
            raise ValueError("entry.json names another key" if entry.get("key") != key
                             else "no model directory")
        if (actual := model_hash(model_dir)) != entry["model_hash"]:
            raise ValueError(f"model hash {actual[:12]} != recorded {entry['model_hash'][:12]}")
        return TrainingResult(
            steps_completed=int(r["steps_completed"]), stopped_early=False,
            model_dir=model_dir, trainable_parameters=int(r["trainable_parameters"]),
            total_parameters=int(r["total_parameters"]), rng=r["rng"]), float(entry["pretrain_s"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _log(f"{label}: discarding cached entry {key[:12]} and retraining: {exc}")
        _discard(entry_dir)
        return None


def cached_pretrain(spec: PretrainTraining, dataset_path: Path, *, label: str,
                    cache_dir: Path | str | None = None,
                    scratch_dir: Path | None = None,
                    max_bytes: int | None = None) -> Pretrained:
    """The model of the public pretraining ``spec`` on ``dataset_path`` (cached or trained
    now). ``label`` names it in log lines and the entry; ``cache_dir``: see
    :func:`resolve_cache_dir`; ``scratch_dir``: where to train when the cache is off (default:
    a new temporary directory the caller owns); ``max_bytes``: the cache's size cap (see
    :func:`resolve_max_bytes`; a miss prunes down to it). Raises TypeError for any other spec
    and ValueError for a bad cap (with the cache on, before anything is trained)."""
    from dpsynth_ml import PretrainTraining
    from dpsynth_ml.models.model_io import model_hash

    if not isinstance(spec, PretrainTraining):
        raise TypeError(f"only public pretrainings are cached, not {type(spec).__name__}")
    started = time.perf_counter()
    inputs = key_inputs(spec, dataset_path)
    key = cache_key(inputs)
    root = resolve_cache_dir(cache_dir)
    if root is None:
        out = scratch_dir or Path(tempfile.mkdtemp(prefix="pretrain-"))
        result, seconds = _run_train(spec, dataset_path, out)
        _log(f"{label}: cache off, trained in {seconds:.1f} s")
        return Pretrained(result, "off", key, seconds)
    cap = resolve_max_bytes(max_bytes)
    entry_dir = root / key
    if (found := _lookup(entry_dir, key, label)) is not None:
        reuse_s = time.perf_counter() - started
        _log(f"{label}: hit {key[:12]} (trained once in {found[1]:.1f} s; reused in "
             f"{reuse_s:.2f} s)")
        return Pretrained(found[0], "hit", key, found[1], reuse_s)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:16]}-", dir=root))
    try:
        result, seconds = _run_train(spec, dataset_path, tmp / "train")
        # the seconds as the entry stores them, so a miss and later hits record the same
        # figure (rounding 0.5497 and the stored 0.55 to 0.1 s gave 0.5 against 0.6)
        seconds = round(seconds, 3)
        if result.stopped_early:
            raise RuntimeError(f"{label}: the pretraining stopped early; nothing cached")
        os.replace(result.model_dir, tmp / "model")  # an entry: model/ + entry.json only
        shutil.rmtree(tmp / "train")
        entry = {"key": key, "label": label, "inputs": inputs,
                 "model_hash": model_hash(tmp / "model"),
                 "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
                 "pretrain_s": seconds,
                 "result": {"steps_completed": result.steps_completed,
                            "trainable_parameters": result.trainable_parameters,
                            "total_parameters": result.total_parameters, "rng": result.rng}}
        (tmp / ENTRY_FILE).write_text(json.dumps(entry, indent=2, sort_keys=True) + "\n")
        try:
            os.replace(tmp, entry_dir)
        except OSError:  # another writer's entry is there (a non-empty directory)
            found = _lookup(entry_dir, key, label)
            if found is None:  # it was corrupt and is discarded now: take its place
                os.replace(tmp, entry_dir)
            else:
                _log(f"{label}: another run stored {key[:12]} first; using its entry")
                return Pretrained(found[0], "miss", key, seconds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _log(f"{label}: miss {key[:12]}, trained in {seconds:.1f} s and stored in {entry_dir}")
    try:
        prune(root, cap, keep=key, label=label)
    except OSError as exc:  # the entry is stored and valid: a failed prune costs only space
        _log(f"{label}: could not prune the cache: {exc}")
    stored = dataclasses.replace(result, model_dir=entry_dir / "model")
    return Pretrained(stored, "miss", key, seconds)
