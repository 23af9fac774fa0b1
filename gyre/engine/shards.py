"""HttpShards: the httpx clients one EngineClient sends through, each with a small connection pool.

    shards = HttpShards(lambda verify: httpx.AsyncClient(base_url=url, verify=verify, limits=...),
                        per_shard=4, max_shards=512)
    shard = shards.acquire()          # the least-loaded client (a new one while all are full)
    try:
        response = await shard.client.send(request)
    finally:
        shards.release(shard)         # for a stream: once the response is closed

Why shards: httpcore's pool rescans every connection, and for every queued request every connection
again, on each request and each closed response — its cost per event grows with the square of the pool's
size. One 256-connection client in the proxy spent most of its CPU there at 256 concurrent calls and
collapsed at 1,152 (`gyre bench load`: under one call per second); pools of `per_shard` connections keep
the cost per event constant, and picking the least-loaded shard is linear in the shards. Even at 16
connections a shard's scans (a readability check per connection per request) were 10% of the proxy's CPU;
the engine client uses 4 (saturated `gyre bench load` at 64: 10.2 → 8.6 ms of proxy CPU per call; 2 gave
the same as 4).

The shards share one SSL context: httpx builds one per client otherwise (~50 ms each, on the event loop).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass

import httpx

ClientFactory = Callable[[ssl.SSLContext | bool], httpx.AsyncClient]

_SSL: ssl.SSLContext | None = None


def shared_ssl_context() -> ssl.SSLContext:
    """One verifying SSL context for every engine client of the process (built on first use)."""
    global _SSL
    if _SSL is None:
        _SSL = httpx.create_ssl_context()
    return _SSL


@dataclass(slots=True, eq=False)
class Shard:
    client: httpx.AsyncClient
    in_flight: int = 0


class HttpShards:
    def __init__(self, factory: ClientFactory, *, per_shard: int, max_shards: int) -> None:
        if per_shard < 1 or max_shards < 1:
            raise ValueError("per_shard and max_shards must be at least 1")
        self._factory = factory
        self.per_shard = per_shard
        self.max_shards = max_shards
        self.shards: list[Shard] = []

    @classmethod
    def of(cls, client: httpx.AsyncClient) -> HttpShards:
        """One given client (a test's mock transport, a caller's own client): never more."""
        shards = cls(lambda _verify: client, per_shard=1, max_shards=1)
        shards.shards.append(Shard(client))
        return shards

    @property
    def first(self) -> httpx.AsyncClient:
        """The client requests are built with (every shard has the same base URL and timeouts)."""
        return self._grow().client if not self.shards else self.shards[0].client

    def acquire(self) -> Shard:
        best = min(self.shards, key=lambda s: s.in_flight, default=None)
        if best is None or (best.in_flight >= self.per_shard and len(self.shards) < self.max_shards):
            best = self._grow()
        best.in_flight += 1
        return best

    def release(self, shard: Shard) -> None:
        shard.in_flight -= 1

    async def aclose(self) -> None:
        for shard in self.shards:
            await shard.client.aclose()
        self.shards.clear()

    def _grow(self) -> Shard:
        shard = Shard(self._factory(shared_ssl_context()))
        self.shards.append(shard)
        return shard
