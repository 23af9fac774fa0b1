"""Redis connection helper."""

from __future__ import annotations

import redis.asyncio as aioredis


async def connect_redis(url: str) -> aioredis.Redis:
    """Connect and verify with PING; bytes in, bytes out (no implicit decoding)."""
    client: aioredis.Redis = aioredis.from_url(url, decode_responses=False, health_check_interval=30)
    await client.ping()
    return client
