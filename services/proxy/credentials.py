"""Per-execution API keys: issued by `OpenExecution`, resolved on every harness request.

A key is a random secret (`gyre-` + 43 URL-safe characters). Redis keeps only its SHA-256
(`proxy_key(digest)` → execution id, and the execution's digests in `proxy_keys_of`, which archiving
uses to drop them), so a restarted proxy still resolves every key it issued and a Redis dump does not
leak usable keys. Resolved keys are cached in memory: the hot path
costs one hash and one dictionary lookup.
"""

from __future__ import annotations

import hashlib
import secrets

import redis.asyncio as aioredis

from gyre.store import Keys

KEY_PREFIX = "gyre-"
_MAX_KEY_CHARS = 128


def key_digest(api_key: str) -> str:
    return hashlib.sha256(api_key.encode("utf-8", "surrogatepass")).hexdigest()


class Credentials:
    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._cache: dict[str, str] = {}

    async def issue(self, execution_id: str) -> str:
        """A new key for `execution_id` (an execution may hold several, e.g. after a retried open)."""
        api_key = KEY_PREFIX + secrets.token_urlsafe(32)
        digest = key_digest(api_key)
        async with self._redis.pipeline(transaction=False) as pipe:  # the index first: it never misses a key
            pipe.sadd(self._keys.proxy_keys_of(execution_id), digest)
            pipe.set(self._keys.proxy_key(digest), execution_id.encode())
            await pipe.execute()
        self._cache[digest] = execution_id
        return api_key

    async def resolve(self, api_key: str) -> str | None:
        """The execution a key belongs to, or None for a key this run never issued."""
        if not api_key.startswith(KEY_PREFIX) or len(api_key) > _MAX_KEY_CHARS:
            return None
        digest = key_digest(api_key)
        execution_id = self._cache.get(digest)
        if execution_id is None:
            raw = await self._redis.get(self._keys.proxy_key(digest))
            if raw is None:
                return None
            execution_id = raw.decode() if isinstance(raw, bytes) else str(raw)
            self._cache[digest] = execution_id
        return execution_id
