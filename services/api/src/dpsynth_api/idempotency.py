"""``Idempotency-Key`` on the api's POSTs (issue 14, item 8; docs/hardening-requests.md).

A client that retries a POST after a timeout cannot know whether the first attempt made a
job (and reserved budget). With an ``Idempotency-Key`` header, the first request with a key
is run and its response stored in PostgreSQL (table ``idempotency_keys``, scoped per
tenant); a replay with the same key, method, path and body gets that response back without
the work being done again; the same key with another request is a 422
``idempotency_key_reused``; a duplicate arriving while the first still runs is a 409
``idempotency_in_progress`` with ``Retry-After``.

This is a pure ASGI middleware so uploads stay streamed: the body's fingerprint (sha256) is
computed from the ``http.request`` messages as the app reads them, never held whole. A
multipart body is hashed without its boundary (clients pick a random one per request, so
the same upload sent twice differs only there).

Stored bodies are sealed (AES-256-GCM) under a key derived from the caller's bearer token,
which the api never stores: a response that carries a new API key's secret, or an owner's
private figures, is unreadable in a database dump, and only the key that made the request
can replay it (another key of the same tenant gets a 422 for the reused key).

Stored: every answer below 500 except 401, 408 and 429, which say the request was not run
(as Stripe does for 4xx: a refused spec stays refused for that key; a 5xx may have been
transient, so its key is released and a retry runs again). A request whose body the app
did not read to the end is not stored either (its fingerprint would be partial).

A stored answer is committed before the client gets it: the middleware holds the answer
(start and body) until its row is committed, then forwards it, so a client that has the
whole answer and replays at once gets the replay, never a 409 ``idempotency_in_progress``
for a request that already finished. An answer above ``MAX_STORED_BODY_BYTES`` (no creating
POST has one) is streamed as it comes and not stored.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from hashlib import sha256
from typing import Any

import anyio
from anyio.to_thread import run_sync
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from dpsynth_shared.errors import DpsynthError, ErrorCode
from sqlalchemy import delete, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dpsynth_api.db import utcnow
from dpsynth_api.errors import problem_response
from dpsynth_api.tables import IdempotencyKey
from dpsynth_api.tenants import service as tenants

log = logging.getLogger(__name__)

HEADER = b"idempotency-key"
KEY_PATTERN = re.compile(r"[A-Za-z0-9_.:+/=~-]{1,255}")
IN_PROGRESS, DONE = "in_progress", "done"
NOT_STORED = frozenset({401, 408, 429})  # "not run, retry": the key stays free
RETRY_AFTER_S = 1
# An answer above this is streamed, not stored (every creating POST answers with small JSON).
MAX_STORED_BODY_BYTES = 1 << 20
_PURGE_EVERY_S = 60.0


class Sealer:
    """AES-256-GCM of a stored body under HMAC-SHA256(bearer token, tenant and key)."""

    def __init__(self, token: str, tenant_id: str, key: str) -> None:
        self._context = f"idempotency-v1\0{tenant_id}\0{key}".encode()
        self._aead = AESGCM(hmac.digest(token.encode(), self._context, "sha256"))

    def seal(self, body: bytes) -> bytes:
        nonce = os.urandom(12)
        return nonce + self._aead.encrypt(nonce, body, self._context)

    def open(self, sealed: bytes) -> bytes | None:
        """The body; None when it was sealed under another token."""
        try:
            return self._aead.decrypt(sealed[:12], sealed[12:], self._context)
        except (InvalidTag, ValueError):
            return None


class Fingerprint:
    """sha256 over method, path, query, media type and body; for multipart without the
    boundary, fed chunk by chunk (the boundary may straddle two chunks)."""

    def __init__(self, scope: Scope) -> None:
        headers = dict(scope.get("headers") or [])
        media, _, params = headers.get(b"content-type", b"").partition(b";")
        boundary = b""
        for param in params.split(b";"):
            name, _, value = param.strip().partition(b"=")
            if name.lower() == b"boundary":
                boundary = value.strip(b'"')
        self._sep = b"--" + boundary if boundary else b""
        self._carry = b""
        self._hash = sha256()
        for part in (scope["method"].encode(), scope["path"].encode(),
                     scope.get("query_string", b""), media.strip().lower()):
            self._hash.update(len(part).to_bytes(8, "big") + part)

    def update(self, chunk: bytes) -> None:
        if not self._sep:
            self._hash.update(chunk)
            return
        buf = self._carry + chunk
        at = buf.find(self._sep)
        while at != -1:
            self._hash.update(buf[:at])
            buf = buf[at + len(self._sep):]
            at = buf.find(self._sep)
        # what is left holds no whole separator; only its last len-1 bytes may start one
        keep = len(self._sep) - 1
        self._hash.update(buf[:max(0, len(buf) - keep)])
        self._carry = buf[max(0, len(buf) - keep):]

    def hexdigest(self) -> str:
        final = self._hash.copy()
        final.update(self._carry)
        return final.hexdigest()


@dataclass(frozen=True)
class Stored:
    """A key's row as a replay needs it."""

    state: str
    fingerprint: str
    status: int | None
    headers: list[list[str]]
    body: bytes


class IdempotencyStore:
    """The ``idempotency_keys`` rows: claim, finish, release, purge (sync: run in a thread)."""

    def __init__(self, sessions: sessionmaker[Session], *, ttl_s: int,
                 lock_timeout_s: int) -> None:
        self.sessions = sessions
        self.ttl = timedelta(seconds=ttl_s)
        self.lock_timeout = timedelta(seconds=lock_timeout_s)
        self._purge_every_s = min(_PURGE_EVERY_S, float(ttl_s))
        self._next_purge = 0.0

    def claim(self, tenant_id: str, key: str, method: str, path: str) -> Stored | None:
        """Take the key for a new request (None), or the row already holding it.

        An expired row, or an in-progress one older than the lock timeout (its process
        died mid-request), is taken over.
        """
        self._maybe_purge()
        now = utcnow()
        values = {"method": method, "path": path[:500], "fingerprint": "", "state": IN_PROGRESS,
                  "status_code": None, "response_headers": None, "response_body": None,
                  "created_at": now, "expires_at": now + self.ttl}
        with self.sessions() as session, session.begin():
            inserted = session.execute(
                insert(IdempotencyKey).values(tenant_id=tenant_id, key=key, **values)
                .on_conflict_do_nothing().returning(IdempotencyKey.key)).first()
            if inserted is not None:
                return None
            row = session.execute(select(IdempotencyKey).where(
                IdempotencyKey.tenant_id == tenant_id, IdempotencyKey.key == key)
                .with_for_update()).scalar_one_or_none()
            if row is None or self._stale(row, now):
                session.execute(update(IdempotencyKey).where(
                    IdempotencyKey.tenant_id == tenant_id, IdempotencyKey.key == key)
                    .values(**values))
                if row is None:  # purged between the insert and the select
                    session.execute(insert(IdempotencyKey).values(
                        tenant_id=tenant_id, key=key, **values).on_conflict_do_nothing())
                return None
            return Stored(row.state, row.fingerprint, row.status_code,
                          row.response_headers or [], row.response_body or b"")

    def _stale(self, row: IdempotencyKey, now: datetime) -> bool:
        return row.expires_at <= now or (
            row.state == IN_PROGRESS and row.created_at <= now - self.lock_timeout)

    def finish(self, tenant_id: str, key: str, fingerprint: str, status: int,
               headers: list[list[str]], body: bytes) -> None:
        """Store the first request's response under its key."""
        with self.sessions() as session, session.begin():
            session.execute(update(IdempotencyKey).where(
                IdempotencyKey.tenant_id == tenant_id, IdempotencyKey.key == key,
                IdempotencyKey.state == IN_PROGRESS).values(
                state=DONE, fingerprint=fingerprint, status_code=status,
                response_headers=headers, response_body=body))

    def release(self, tenant_id: str, key: str) -> None:
        """Free the key of a request that failed or was not run to the end."""
        with self.sessions() as session, session.begin():
            session.execute(delete(IdempotencyKey).where(
                IdempotencyKey.tenant_id == tenant_id, IdempotencyKey.key == key,
                IdempotencyKey.state == IN_PROGRESS))

    def purge(self) -> int:
        """Delete the expired rows; returns how many."""
        with self.sessions() as session, session.begin():
            result = session.execute(delete(IdempotencyKey).where(
                IdempotencyKey.expires_at <= utcnow()))
        return int(getattr(result, "rowcount", 0) or 0)

    def _maybe_purge(self) -> None:
        now = time.monotonic()
        if now >= self._next_purge:
            self._next_purge = now + self._purge_every_s
            purged = self.purge()
            if purged:
                log.info("idempotency keys purged", extra={"count": purged})

    def tenant_of(self, token: str) -> str | None:
        """The tenant of a bearer token; None when it does not authenticate (the app
        answers that request's 401 itself, and nothing is stored)."""
        with self.sessions() as session:
            try:
                return tenants.authenticate(session, token=token).tenant_id
            except DpsynthError:
                return None


def _bearer(scope: Scope) -> str | None:
    value = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


class IdempotencyMiddleware:
    """Honour ``Idempotency-Key`` on every ``POST /v1/...`` (see the module docstring)."""

    def __init__(self, app: ASGIApp, store: IdempotencyStore) -> None:
        self.app = app
        self.store = store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = dict(scope.get("headers") or []).get(HEADER) if scope["type"] == "http" else None
        if raw is None or scope["method"] != "POST" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        key = raw.decode("latin-1")
        if not KEY_PATTERN.fullmatch(key):
            error = DpsynthError(ErrorCode.INVALID_IDEMPOTENCY_KEY, "Idempotency-Key must be "
                                 "1 to 255 characters of A-Z a-z 0-9 _ . : + / = ~ -")
            await problem_response(error)(scope, receive, send)
            return
        token = _bearer(scope)
        tenant_id = await run_sync(self.store.tenant_of, token) if token else None
        if tenant_id is None:
            await self.app(scope, receive, send)
            return
        stored = await run_sync(self.store.claim, tenant_id, key, scope["method"],
                                scope["path"])
        sealer = Sealer(token or "", tenant_id, key)
        if stored is None:
            await self._first(scope, receive, send, tenant_id, key, sealer)
        else:
            await self._replay(scope, receive, send, stored, sealer)

    async def _first(self, scope: Scope, receive: Receive, send: Send, tenant_id: str,
                     key: str, sealer: Sealer) -> None:
        """Run the first request with a key; store its answer, then let the client have it.

        The answer of a storable status is held (it is small JSON: every creating POST
        answers so) and forwarded only once its row is committed, so a client that has the
        whole answer and replays at once gets the replay, never a 409 for a request that
        already finished. Past ``MAX_STORED_BODY_BYTES`` the answer is streamed instead and
        not stored (the key is freed).
        """
        fingerprint = Fingerprint(scope)
        seen: dict[str, Any] = {"complete": False, "stored": False}
        held: list[Message] = []  # the start and body messages not forwarded yet
        holding, size = False, 0

        async def hashing_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                fingerprint.update(message.get("body", b""))
                if not message.get("more_body", False):
                    seen["complete"] = True
            return message

        async def flush() -> None:
            nonlocal holding
            holding = False
            messages = list(held)
            held.clear()
            for message in messages:
                await send(message)

        async def holding_send(message: Message) -> None:
            nonlocal holding, size
            if message["type"] == "http.response.start":
                status = message["status"]
                holding = status < 500 and status not in NOT_STORED
                seen["status"] = status
                seen["headers"] = [[n.decode("latin-1"), v.decode("latin-1")]
                                   for n, v in message.get("headers", [])]
            if not holding or message["type"] not in ("http.response.start",
                                                       "http.response.body"):
                await send(message)
                return
            held.append(message)
            if message["type"] != "http.response.body":
                return
            size += len(message.get("body", b""))
            if size > MAX_STORED_BODY_BYTES:  # not an answer to store: stream it
                log.warning("idempotent response too large to store; key freed",
                            extra={"bytes": size, "path": scope["path"]})
                await flush()
                return
            if message.get("more_body", False):
                return
            if seen["complete"]:  # a request read to its end (else its fingerprint is partial)
                body = b"".join(m.get("body", b"") for m in held[1:])
                seen["stored"] = await self._store(
                    tenant_id, key, fingerprint.hexdigest(), seen["status"], seen["headers"],
                    sealer.seal(body))
                held[1:] = [{"type": "http.response.body", "body": body}]  # one message
            await flush()

        try:
            await self.app(scope, hashing_receive, holding_send)
            if held:  # the app ended without finishing its answer: pass on what it sent
                await flush()
        finally:
            if not seen["stored"]:
                with anyio.CancelScope(shield=True):
                    await run_sync(self.store.release, tenant_id, key)

    async def _store(self, tenant_id: str, key: str, fingerprint: str, status: int,
                     headers: list[list[str]], sealed: bytes) -> bool:
        """Commit the answer under its key; False (the key is then freed) when the database
        refused: the client still gets the answer, a retry runs again."""
        try:
            with anyio.CancelScope(shield=True):
                await run_sync(self.store.finish, tenant_id, key, fingerprint, status,
                               headers, sealed)
        except Exception:
            log.exception("could not store an idempotent response; key freed")
            return False
        return True

    async def _replay(self, scope: Scope, receive: Receive, send: Send, stored: Stored,
                      sealer: Sealer) -> None:
        if stored.state != DONE:
            error = DpsynthError(ErrorCode.IDEMPOTENCY_IN_PROGRESS, "a request with this "
                                 "Idempotency-Key is still in progress; retry shortly",
                                 retry_after_s=RETRY_AFTER_S)
            await problem_response(error, headers={"Retry-After": str(RETRY_AFTER_S)})(
                scope, receive, send)
            return
        fingerprint = Fingerprint(scope)
        while True:  # the body is read (hashed, discarded) to compare it with the first
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            fingerprint.update(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = sealer.open(stored.body) if fingerprint.hexdigest() == stored.fingerprint \
            else None
        if body is None:
            error = DpsynthError(ErrorCode.IDEMPOTENCY_KEY_REUSED, "this Idempotency-Key was "
                                 "used for another request (method, path or body differ, or "
                                 "another API key sent it); use a new key for a new request")
            await problem_response(error)(scope, receive, send)
            return
        headers = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in stored.headers]
        await send({"type": "http.response.start", "status": stored.status,
                    "headers": [*headers, (b"idempotent-replayed", b"true")]})
        await send({"type": "http.response.body", "body": body})


__all__ = ["Fingerprint", "IdempotencyMiddleware", "IdempotencyStore", "Sealer"]
