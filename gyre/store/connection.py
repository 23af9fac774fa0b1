"""Redis connection helper: one place where clients connect (and authenticate as their ACL user).

Clients share a blocking pool of `MAX_CONNECTIONS`: a caller that finds every connection busy waits up
to `POOL_WAIT_S` for one instead of failing (redis-py's default pool raises `MaxConnectionsError` at
100 busy connections, which the proxy answered as a 500 under 256 concurrent harness calls; see
`gyre bench load`).
"""

from __future__ import annotations

import redis.asyncio as aioredis

from gyre.config.infra import ClientLogin

MAX_CONNECTIONS = 512
"""Connections one process may hold to Redis at once."""
POOL_WAIT_S = 30.0
"""Seconds a command waits for a free connection before it fails."""


async def connect_redis(url: str, login: ClientLogin | None = None) -> aioredis.Redis:
    """Connect as `login`'s ACL user (None: the URL's, or none) and verify with PING; bytes in, bytes out."""
    auth = {"username": login.user, "password": login.password} if login is not None else {}
    pool = aioredis.BlockingConnectionPool.from_url(
        url, decode_responses=False, health_check_interval=30, max_connections=MAX_CONNECTIONS, timeout=POOL_WAIT_S,
        **auth,
    )
    client: aioredis.Redis = aioredis.Redis.from_pool(pool)
    try:
        await client.ping()
    except BaseException:
        await client.aclose()
        raise
    return client
