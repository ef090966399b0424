"""The chain's anchor: every new entry, signed, in an append-only log outside the database.

A backup restored into the ledger's database would silently lower the spent epsilon of every
dataset charged after the backup. To notice, every entry is signed with the ledger's chain key
(Ed25519) and written, inside the writing transaction and before its commit, to an append-only
log the database cannot rewind: a local file opened ``O_APPEND`` (embedded mode) or one
object per record in an object-store bucket (production: versioning plus object lock, and no
delete permission for the ledger's credentials). Entries are written under the chain-head
lock, so the log's order is the chain's order.

The log is JSON Lines of two record types:

* ``{"type": "entry", "lineage": L, "seq", "at", "dataset_id", "kind", "payload",
  "prev_hash", "hash", "signature", "key_id"}``: one chain entry.
* ``{"type": "rebase", "lineage": L + 1, "seq", "hash", "superseded_seq",
  "superseded_hash", "reason", "at", "signature", "key_id"}``: from here on the chain's
  lineage continues from database entry ``seq``/``hash`` (written by reconciliation after a
  restore, or when an existing database is first anchored). The superseded lineage stays in
  the log: reconciliation re-charged what it held beyond ``seq``.

The anchored head is the last record's ``(seq, hash)``. A failed commit leaves the log one
entry ahead of the database, which only ever over-counts (reconciliation re-charges it).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from dpsynth_shared.dp_events import GENESIS_HASH
from dpsynth_shared.errors import DpsynthError, ErrorCode
from dpsynth_shared.grants import key_id_of, public_key_of, sign_message, verify_message
from dpsynth_shared.ledger_contract import AnchorStatus, signed_message

log = logging.getLogger(__name__)

RECONCILE_HINT = ("the ledger's database is behind its anchored head (restored from an older "
                  "backup?): admissions are refused until an operator runs "
                  "`dpsynth ledger reconcile-after-restore`")


def rebase_message(lineage: int, seq: int, entry_hash: str) -> bytes:
    """The bytes a rebase record's signature covers."""
    return f"dpsynth-ledger-rebase\n{lineage}\n{seq}\n{entry_hash}".encode("ascii")


class AnchorLog(Protocol):
    """An append-only sequence of JSON records (the port; two adapters below)."""

    location: str

    def append(self, records: Sequence[dict[str, Any]]) -> None:
        """Durably append ``records`` in order (raise on any failure)."""
        ...

    def records(self) -> list[dict[str, Any]]:
        """Every record in order (an unparsable one as ``{"type": "malformed", ...}``)."""
        ...

    def last(self) -> dict[str, Any] | None:
        """The newest record, or None for an empty log."""
        ...


def _parse(raw: bytes, where: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        return {"type": "malformed", "where": where}
    if not isinstance(value, dict):
        return {"type": "malformed", "where": where}
    value["where"] = where
    return value


def _dumps(record: dict[str, Any]) -> bytes:
    body = {k: v for k, v in record.items() if k != "where"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode() + b"\n"


class FileAnchor:
    """The embedded mode's anchor: one JSON line per record in a file opened ``O_APPEND``.

    Every append is one ``write`` of whole lines followed by ``fsync``; the file is never
    truncated or rewritten by the ledger. (It lives outside the database's data directory, so
    restoring a database backup does not rewind it.)
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.location = str(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, records: Sequence[dict[str, Any]]) -> None:
        data = b"".join(_dumps(r) for r in records)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(f"short write to the anchor ({written} of {len(data)} bytes)")
            os.fsync(fd)
        finally:
            os.close(fd)

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        with self.path.open("rb") as handle:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    out.append(_parse(line, f"line {number}"))
        return out

    def last(self) -> dict[str, Any] | None:
        """The last line, read backwards from the end (no full scan)."""
        if not self.path.exists():
            return None
        with self.path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            end = handle.tell()
            buf, pos = b"", end
            while pos > 0:
                step = min(65536, pos)
                pos -= step
                handle.seek(pos)
                buf = handle.read(step) + buf
                stripped = buf.rstrip(b"\n")
                cut = stripped.rfind(b"\n")
                if cut >= 0:
                    return _parse(stripped[cut + 1:], "last line")
            stripped = buf.rstrip(b"\n")
            return _parse(stripped, "last line") if stripped else None


class S3Anchor:
    """The production anchor: one object per record, ``<prefix><n:016d>.json``, n = 1, 2, ...

    Creating an object that exists fails: each write is preceded by an existence check (one
    writer: the ledger, under its chain-head lock). That check does not stop anyone else, so
    production needs a bucket with versioning and object lock (or at least no delete
    permission for the ledger's credentials): an overwrite then only adds a version and the
    original record stays readable, and nothing can rewind the log.
    """

    def __init__(self, client: Any, bucket: str, prefix: str) -> None:
        self._client = client
        self._bucket = bucket
        self._prefix = prefix.rstrip("/") + "/" if prefix else ""
        self.location = f"s3://{bucket}/{self._prefix}"
        self._count: int | None = None
        if not client.bucket_exists(bucket):
            client.make_bucket(bucket)

    def _key(self, n: int) -> str:
        return f"{self._prefix}{n:016d}.json"

    def _exists(self, n: int) -> bool:
        from minio.error import S3Error

        try:
            self._client.stat_object(self._bucket, self._key(n))
        except S3Error as exc:
            if exc.code in {"NoSuchKey", "NoSuchObject", "NotFound", "ResourceNotFound"}:
                return False
            raise
        return True

    def _size(self) -> int:
        """How many records exist: the cached count, then probes for newer ones."""
        if self._count is None:
            names = [o.object_name for o in self._client.list_objects(
                self._bucket, prefix=self._prefix)]
            self._count = len([n for n in names if n.endswith(".json")])
        while self._exists(self._count + 1):
            self._count += 1
        return self._count

    def append(self, records: Sequence[dict[str, Any]]) -> None:
        import io

        n = self._size()
        for record in records:
            n += 1
            if self._exists(n):
                raise OSError(f"anchor object {self._key(n)} exists: another writer?")
            data = _dumps(record)
            self._client.put_object(self._bucket, self._key(n), io.BytesIO(data), len(data),
                                    content_type="application/json")
            self._count = n

    def _get(self, n: int) -> dict[str, Any]:
        response = self._client.get_object(self._bucket, self._key(n))
        try:
            return _parse(response.read(), f"object {self._key(n)}")
        finally:
            response.close()
            response.release_conn()

    def records(self) -> list[dict[str, Any]]:
        return [self._get(n) for n in range(1, self._size() + 1)]

    def last(self) -> dict[str, Any] | None:
        n = self._size()
        return self._get(n) if n else None


@dataclass(frozen=True)
class AnchoredHead:
    """The newest anchored position: its lineage and the chain entry it names."""

    lineage: int
    seq: int
    hash: str


class ChainKeeper:
    """The chain key and the anchor log: signs entries, anchors them, compares heads.

    Args:
        signing_key: the Ed25519 chain key (urlsafe base64 of its 32 raw bytes).
        anchor: where anchored records go.
        retired_public_keys: public halves of earlier chain keys. Entries and anchor records
            carry the id of the key that signed them; after a key rotation the older ones
            were signed by a retired key and still verify with it (nothing new is signed
            with a retired key).
    """

    def __init__(self, signing_key: str, anchor: AnchorLog,
                 retired_public_keys: Sequence[str] = ()) -> None:
        self._key = signing_key
        self.anchor = anchor
        self.public_key = public_key_of(signing_key)
        self.key_id = key_id_of(self.public_key)
        self.retired_public_keys = [k for k in dict.fromkeys(retired_public_keys)
                                    if k != self.public_key]
        self.verifying_keys = {key_id_of(k): k for k in self.retired_public_keys}
        self.verifying_keys[self.key_id] = self.public_key

    def sign(self, seq: int, entry_hash: str) -> str:
        """The signature of one chain entry (``signed_message(seq, hash)``)."""
        return sign_message(signed_message(seq, entry_hash), self._key)

    def verify(self, seq: int, entry_hash: str, signature: str,
               key_id: str | None = None) -> bool:
        """True iff ``signature`` is the signature of entry ``seq``/``hash`` by the key
        ``key_id`` names (default: the current chain key); False for an unknown key id."""
        public = self.verifying_keys.get(self.key_id if key_id is None else key_id)
        return public is not None and verify_message(signed_message(seq, entry_hash),
                                                     signature, public)

    def head(self) -> AnchoredHead:
        """The anchored head (genesis for an empty log).

        Raises:
            DpsynthError: ``ledger_behind_anchor`` when the newest record is unreadable (the
                ledger cannot tell where it stands, so it refuses to write).
        """
        last = self.anchor.last()
        if last is None:
            return AnchoredHead(0, 0, GENESIS_HASH)
        try:
            return AnchoredHead(int(last["lineage"]), int(last["seq"]), str(last["hash"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise DpsynthError(ErrorCode.LEDGER_BEHIND_ANCHOR,
                               f"the anchor's newest record is unreadable ({self.anchor.location})"
                               ) from exc

    def entry_record(self, *, lineage: int, seq: int, at: datetime, dataset_id: str, kind: str,
                     payload: dict[str, Any], prev_hash: str, digest: str, signature: str
                     ) -> dict[str, Any]:
        """The anchor record of one entry."""
        return {"type": "entry", "lineage": lineage, "seq": seq, "at": at.isoformat(),
                "dataset_id": dataset_id, "kind": kind, "payload": payload,
                "prev_hash": prev_hash, "hash": digest, "signature": signature,
                "key_id": self.key_id}

    def rebase_record(self, *, lineage: int, seq: int, entry_hash: str, superseded: AnchoredHead,
                      reason: str) -> dict[str, Any]:
        """A signed record that starts ``lineage`` at database entry ``seq``/``entry_hash``."""
        return {"type": "rebase", "lineage": lineage, "seq": seq, "hash": entry_hash,
                "superseded_lineage": superseded.lineage, "superseded_seq": superseded.seq,
                "superseded_hash": superseded.hash, "reason": reason,
                "at": datetime.now(UTC).isoformat(),
                "signature": sign_message(rebase_message(lineage, seq, entry_hash), self._key),
                "key_id": self.key_id}

    def status(self, local_seq: int, local_hash: str,
               hash_at: Callable[[int], str | None]) -> AnchorStatus:
        """The database's head against the anchored head.

        ``behind``: the anchor holds entries the database lacks. ``diverged``: the same seq has
        different hashes, or the database holds entries the anchor never saw (the log was
        rewound or replaced). Either one blocks admissions until reconciliation.
        """
        anchored = self.head()
        behind = anchored.seq > local_seq
        if anchored.seq == local_seq:
            diverged = anchored.hash != local_hash
        elif anchored.seq < local_seq:
            diverged = True  # entries committed that were never anchored
        else:
            diverged = False
        return AnchorStatus(location=self.anchor.location, local_seq=local_seq,
                            local_hash=local_hash, anchored_seq=anchored.seq,
                            anchored_hash=anchored.hash, behind=behind, diverged=diverged,
                            public_key=self.public_key, key_id=self.key_id)

    def refuse_unless_current(self, local_seq: int, local_hash: str) -> AnchoredHead:
        """The anchored head, if it is the database's head.

        Raises:
            DpsynthError: 503 ``ledger_behind_anchor`` otherwise.
        """
        anchored = self.head()
        if (anchored.seq, anchored.hash) != (local_seq, local_hash):
            what = "behind" if anchored.seq > local_seq else "diverged from"
            raise DpsynthError(
                ErrorCode.LEDGER_BEHIND_ANCHOR,
                f"the ledger's database (head {local_seq}) is {what} its anchored head "
                f"({anchored.seq}); admissions are refused until an operator runs "
                "`dpsynth ledger reconcile-after-restore`",
                local_seq=local_seq, anchored_seq=anchored.seq)
        return anchored


def build_anchor(settings: Any) -> AnchorLog:
    """The anchor the settings name (``settings.anchor``, :class:`AnchorSettings`)."""
    cfg = settings.anchor
    if cfg.kind == "s3":
        from minio import Minio

        client = Minio(cfg.s3_endpoint, access_key=cfg.s3_access_key.get_secret_value(),
                       secret_key=cfg.s3_secret_key.get_secret_value(), secure=cfg.s3_secure,
                       region=cfg.s3_region)
        return S3Anchor(client, cfg.s3_bucket, cfg.s3_prefix)
    return FileAnchor(Path(cfg.path))
