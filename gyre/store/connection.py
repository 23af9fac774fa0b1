"""Redis connection helper: one place where clients connect (and authenticate as their ACL user).

Every client retries a command whose connection failed (Redis restarting, or loading its append-only file
after a restart: `LOADING`) with backoff for about a minute before the error reaches the caller, so a
redis-server the stack's supervisor restarts costs the services a pause, not a crash. A command that was
executed just before the connection broke may run twice; Gyre's multi-key updates are Lua scripts whose
effects are idempotent (tokens, SETNX, sets), and the few plain increments (sequence numbers for event ids)
only skip a number then.

Clients share a blocking pool of `MAX_CONNECTIONS`: a caller that finds every connection busy waits up
to `POOL_WAIT_S` for one instead of failing (redis-py's default pool raises `MaxConnectionsError` at
100 busy connections, which the proxy answered as a 500 under 256 concurrent harness calls; see
`gyre bench load`).
"""

from __future__ import annotations

import ssl

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import AuthenticationError, BusyLoadingError, ConnectionError, TimeoutError

from gyre import tls
from gyre.config.infra import ClientLogin

RETRIES = 40
"""Attempts of a command over a broken connection (0.05 s doubling to 2 s: about 70 s in all)."""
MAX_CONNECTIONS = 512
"""Connections one process may hold to Redis at once."""
POOL_WAIT_S = 30.0
"""Seconds a command waits for a free connection before it fails."""


class _RetryUnlessRefused(Retry):
    """Retry over broken connections, but not a refused login: redis-py's `AuthenticationError` is a
    `ConnectionError`, and a client with wrong credentials must fail at once, not after a minute."""

    async def call_with_retry(  # type: ignore[no-untyped-def]
        self, do, fail, is_retryable=None, with_failure_count: bool = False
    ):
        def retryable(error: Exception) -> bool:
            return not isinstance(error, AuthenticationError) and (
                is_retryable is None or is_retryable(error)
            )

        return await super().call_with_retry(do, fail, retryable, with_failure_count)


async def connect_redis(url: str, login: ClientLogin | None = None) -> aioredis.Redis:
    """Connect as `login`'s ACL user (None: the URL's, or none) and verify with PING; bytes in, bytes out.
    A `rediss://` URL connects over TLS with this process's identity (`gyre.tls`) when it has one."""
    auth: dict[str, object] = (
        {"username": login.user, "password": login.password} if login is not None else {}
    )
    identity = tls.current()
    if identity is not None and url.startswith("rediss://"):
        auth |= {
            "ssl_certfile": str(identity.cert),
            "ssl_keyfile": str(identity.key),
            "ssl_ca_certs": str(identity.ca),
            "ssl_cert_reqs": "required",
            "ssl_check_hostname": True,
            "ssl_min_version": ssl.TLSVersion.TLSv1_2,
        }
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        decode_responses=False,
        health_check_interval=30,
        max_connections=MAX_CONNECTIONS,
        timeout=POOL_WAIT_S,
        retry=_RetryUnlessRefused(ExponentialBackoff(cap=2.0, base=0.05), RETRIES),
        retry_on_error=[ConnectionError, TimeoutError, BusyLoadingError],
        **auth,
    )
    client: aioredis.Redis = aioredis.Redis.from_pool(pool)
    try:
        await client.ping()
    except BaseException:
        await client.aclose()
        raise
    return client
