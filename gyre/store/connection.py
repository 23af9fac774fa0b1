"""Redis connection helper: one place where clients connect (and authenticate as their ACL user).

Every client retries a command whose connection failed (Redis restarting, or loading its append-only file
after a restart: `LOADING`) with backoff for about a minute before the error reaches the caller, so a
redis-server the stack's supervisor restarts costs the services a pause, not a crash. A command that was
executed just before the connection broke may run twice; Gyre's multi-key updates are Lua scripts whose
effects are idempotent (tokens, SETNX, sets), and the few plain increments (sequence numbers for event ids)
only skip a number then.
"""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import BusyLoadingError, ConnectionError, TimeoutError

from gyre.config.infra import ClientLogin

RETRIES = 40
"""Attempts of a command over a broken connection (0.05 s doubling to 2 s: about 70 s in all)."""


async def connect_redis(url: str, login: ClientLogin | None = None) -> aioredis.Redis:
    """Connect as `login`'s ACL user (None: the URL's, or none) and verify with PING; bytes in, bytes out."""
    auth = {"username": login.user, "password": login.password} if login is not None else {}
    client: aioredis.Redis = aioredis.from_url(
        url, decode_responses=False, health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), RETRIES),
        retry_on_error=[ConnectionError, TimeoutError, BusyLoadingError], **auth,
    )
    await client.ping()
    return client
