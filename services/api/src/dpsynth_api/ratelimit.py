"""Per-key rate limits: token buckets in Redis, shared by every api replica (issue 14, 12).

Each API key (identified by the sha256 of the presented bearer token, so a caller who does
not hold a key's secret cannot drain its buckets) has three buckets: non-upload requests,
upload requests (multipart POSTs) and upload bytes (charged by ``Content-Length``). Until a
token has been accepted once (an answer other than 401 marks it for ``_KNOWN_TTL_S``), and
without a token, a request also draws on its client address's "unknown caller" bucket, so
inventing a new token per request buys no fresh capacity: a flood of made-up keys (each a
database lookup and a 401) is limited per address, while a real key pays that bucket on its
first request only. One Lua
script refills, checks and takes from a request's buckets atomically on Redis's clock, so
replicas agree and their clocks do not matter. Only ``/v1/...`` is limited: health, readiness,
metrics, the worker's ``/internal/v1`` and the dashboard's static files never are.

When Redis is unreachable the limiter fails OPEN (the request goes through, a warning is
logged at most once a minute, Redis is not retried for a few seconds). Limits here guard
capacity, not privacy: the ledger's budget and the tenant checks hold without them, and
failing closed would turn a Redis outage into an outage of every read as well (docs/
hardening-requests.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from dataclasses import dataclass

from dpsynth_shared.errors import DpsynthError, ErrorCode
from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dpsynth_api.errors import problem_response
from dpsynth_api.settings import ApiSettings

log = logging.getLogger(__name__)

# KEYS[1]: the token's "accepted" marker ('' without a token), then the request's n buckets,
# then its address's unknown-caller bucket. ARGV: n, then rate, burst, cost per bucket (n + 1
# of them). The last bucket is drawn on only while the marker is absent. Takes from all or
# none; returns {allowed 1/0, seconds until the scarcest bucket holds its cost, marker 1/0}.
_TAKE = """
local n = tonumber(ARGV[1])
local known = 0
if KEYS[1] ~= '' and redis.call('EXISTS', KEYS[1]) == 1 then known = 1 end
local m = n + 1 - known
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local tokens, wait = {}, 0
for i = 1, m do
  local key = KEYS[i + 1]
  local rate, burst, cost = tonumber(ARGV[3*i-1]), tonumber(ARGV[3*i]), tonumber(ARGV[3*i+1])
  local s = redis.call('HMGET', key, 'tokens', 'ts')
  local level = tonumber(s[1]) or burst
  local ts = tonumber(s[2]) or now
  level = math.min(burst, level + math.max(0, now - ts) * rate)
  tokens[i] = level
  if level < cost then wait = math.max(wait, (cost - level) / rate) end
end
if wait > 0 then return {0, tostring(wait), known} end
for i = 1, m do
  local key = KEYS[i + 1]
  local rate, burst, cost = tonumber(ARGV[3*i-1]), tonumber(ARGV[3*i]), tonumber(ARGV[3*i+1])
  redis.call('HSET', key, 'tokens', tostring(tokens[i] - cost), 'ts', tostring(now))
  redis.call('EXPIRE', key, math.ceil(burst / rate) + 1)
end
return {1, '0', known}
"""

_LIMITED_PREFIX = "/v1/"
_REDIS_TIMEOUT_S = 0.5
_BACKOFF_S = 5.0  # after a Redis failure, skip it this long (fail open without a round trip)
_WARN_EVERY_S = 60.0
_KNOWN_TTL_S = 600  # how long an accepted token keeps buckets of its own without a request


@dataclass(frozen=True)
class Bucket:
    """One token bucket: ``rate`` tokens a second, at most ``burst`` held."""

    name: str
    rate: float
    burst: int


@dataclass(frozen=True)
class Limits:
    """The buckets of every key, from :class:`ApiSettings`."""

    requests: Bucket
    uploads: Bucket
    upload_bytes: Bucket
    unknown: Bucket

    @classmethod
    def from_settings(cls, s: ApiSettings) -> Limits:
        return cls(Bucket("req", s.rate_limit_requests_per_s, s.rate_limit_requests_burst),
                   Bucket("upl", s.rate_limit_uploads_per_s, s.rate_limit_uploads_burst),
                   Bucket("upb", s.rate_limit_upload_bytes_per_s,
                          s.rate_limit_upload_bytes_burst),
                   Bucket("unk", s.rate_limit_unknown_per_s, s.rate_limit_unknown_burst))

    def as_dict(self) -> dict[str, float]:
        """The limits in force, as the service-load benchmark records them."""
        return {"requests_per_s": self.requests.rate, "requests_burst": self.requests.burst,
                "uploads_per_s": self.uploads.rate, "uploads_burst": self.uploads.burst,
                "upload_bytes_per_s": self.upload_bytes.rate,
                "upload_bytes_burst": self.upload_bytes.burst,
                "unknown_callers_per_s": self.unknown.rate,
                "unknown_callers_burst": self.unknown.burst}


def token_identity(scope: Scope) -> str | None:
    """The sha256 of the request's bearer token (None without one)."""
    headers = dict(scope.get("headers") or [])
    scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return "key:" + hashlib.sha256(token.strip().encode()).hexdigest()[:32]
    return None


def address_identity(scope: Scope) -> str:
    """The client address a request without an accepted token draws on."""
    client = scope.get("client")
    return "addr:" + (client[0] if client else "unknown")


def is_upload(scope: Scope) -> bool:
    """A multipart POST (dataset and model uploads) draws on the upload buckets."""
    headers = dict(scope.get("headers") or [])
    content_type: bytes = headers.get(b"content-type", b"").lower()
    return scope["method"] == "POST" and content_type.startswith(b"multipart/")


class RateLimiter:
    """The token buckets of every key, in Redis (one per app; closed at its shutdown)."""

    def __init__(self, settings: ApiSettings) -> None:
        self.limits = Limits.from_settings(settings)
        self.url = settings.rate_limit_redis_url or settings.broker_url
        self._redis: Redis | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._take_script: AsyncScript | None = None
        self._skip_until = 0.0
        self._warned_at = -math.inf

    def _script(self) -> AsyncScript:
        # asyncio connections belong to the loop that opened them: one client per loop
        # (uvicorn runs one; a test client may start a loop per request)
        loop = asyncio.get_running_loop()
        if self._take_script is None or self._loop is not loop:
            self._redis = Redis.from_url(self.url, socket_timeout=_REDIS_TIMEOUT_S,
                                         socket_connect_timeout=_REDIS_TIMEOUT_S)
            self._loop = loop
            self._take_script = self._redis.register_script(_TAKE)  # EVALSHA, EVAL once
        return self._take_script

    def _costs(self, scope: Scope) -> list[tuple[Bucket, float]]:
        if not is_upload(scope):
            return [(self.limits.requests, 1.0)]
        length = dict(scope.get("headers") or []).get(b"content-length", b"0")
        size = float(length) if length.isdigit() else 0.0
        # never more than a full bucket: an upload the size cap lets through can always pass
        return [(self.limits.uploads, 1.0),
                (self.limits.upload_bytes, min(size, float(self.limits.upload_bytes.burst)))]

    async def take(self, scope: Scope) -> tuple[float, bool]:
        """(seconds until the request may pass, 0: it passes now with its tokens taken;
        whether its token already has buckets of its own)."""
        now = time.monotonic()
        if now < self._skip_until:
            return 0.0, True
        token = token_identity(scope)
        costs = self._costs(scope)
        marker = f"dpsynth:rl:known:{token}" if token else ""
        who = token or address_identity(scope)
        unknown = self.limits.unknown
        keys = [marker, *(f"dpsynth:rl:{bucket.name}:{who}" for bucket, _ in costs),
                f"dpsynth:rl:{unknown.name}:{address_identity(scope)}"]
        args: list[float] = [len(costs)]
        for bucket, cost in [*costs, (unknown, 1.0)]:
            args += [bucket.rate, bucket.burst, cost]
        try:
            allowed, wait, known = await self._script()(keys=keys, args=args)
        except (RedisError, OSError, ValueError) as exc:  # ValueError: a URL Redis can't use
            self._redis_failed(now, exc)
            return 0.0, True
        return (0.0 if int(allowed) else float(wait)), bool(int(known))

    async def accepted(self, scope: Scope) -> None:
        """Give the request's token buckets of its own (it was not answered 401)."""
        token = token_identity(scope)
        if token is None or self._redis is None:
            return
        try:
            await self._redis.set(f"dpsynth:rl:known:{token}", b"1", ex=_KNOWN_TTL_S)
        except (RedisError, OSError) as exc:
            self._redis_failed(time.monotonic(), exc)

    def _redis_failed(self, now: float, exc: Exception) -> None:
        self._skip_until = now + _BACKOFF_S
        if now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            log.warning("rate limits not enforced: Redis is unreachable (failing open)",
                        extra={"error": type(exc).__name__})

    async def close(self) -> None:
        """Close the Redis connections (at the app's shutdown)."""
        redis, self._redis, self._take_script = self._redis, None, None
        if redis is not None:
            try:
                await redis.aclose()
            except (RedisError, OSError, RuntimeError):  # a dead Redis, or another loop's
                log.debug("rate-limit Redis client not closed cleanly")


class RateLimitMiddleware:
    """Answer 429 ``rate_limited`` with ``Retry-After`` when a key's bucket is empty."""

    def __init__(self, app: ASGIApp, limiter: RateLimiter) -> None:
        self.app = app
        self.limiter = limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(_LIMITED_PREFIX):
            await self.app(scope, receive, send)
            return
        wait, known = await self.limiter.take(scope)
        if wait > 0:
            retry_after = max(1, math.ceil(wait))
            error = DpsynthError(ErrorCode.RATE_LIMITED, "too many requests for this API key; "
                                 f"retry after {retry_after} s", retry_after_s=retry_after)
            await problem_response(error, headers={"Retry-After": str(retry_after)})(
                scope, receive, send)
            return
        if known:
            await self.app(scope, receive, send)
            return

        async def noting_acceptance(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] != 401:
                await self.limiter.accepted(scope)
            await send(message)

        await self.app(scope, receive, noting_acceptance)


__all__ = ["Limits", "RateLimitMiddleware", "RateLimiter"]
