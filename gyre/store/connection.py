"""Redis connection helper: one place where clients connect (and authenticate as their ACL user)."""

from __future__ import annotations

import redis.asyncio as aioredis

from gyre.config.infra import ClientLogin


async def connect_redis(url: str, login: ClientLogin | None = None) -> aioredis.Redis:
    """Connect as `login`'s ACL user (None: the URL's, or none) and verify with PING; bytes in, bytes out."""
    auth = {"username": login.user, "password": login.password} if login is not None else {}
    client: aioredis.Redis = aioredis.from_url(url, decode_responses=False, health_check_interval=30, **auth)
    await client.ping()
    return client
