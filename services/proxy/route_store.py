"""The routing table in Redis, so a restarted proxy routes like the one before it.

Saved after every `UpdateRoutes`, `Drain` and `OpenExecution` that names an engine (the
control plane), not after the sticky first-call assignment of an unrouted execution: after a
restart such an execution is assigned again, which costs prefix-cache hits, never correctness.
One hash (`Keys.proxy_routes`) with JSON fields `engines`, `routes`, `draining` and `default`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson
import redis.asyncio as aioredis

from gyre.store import Keys
from services.proxy.routing import EngineSpec, Router


@dataclass(slots=True)
class RouteSnapshot:
    engines: list[EngineSpec] = field(default_factory=list)
    routes: dict[str, str] = field(default_factory=dict)
    draining: list[str] = field(default_factory=list)
    default_engine_id: str = ""


class RouteStore:
    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self._redis = redis
        self._key = keys.proxy_routes()

    async def save(self, router: Router) -> None:
        engines = [
            {"engine_id": e.spec.engine_id, "url": e.spec.url, "cell": e.spec.cell}
            for e in router.engines.values()
        ]
        draining = [e.engine_id for e in router.engines.values() if not e.serving]
        await self._redis.hset(
            self._key,
            mapping={
                "engines": orjson.dumps(engines),
                "routes": orjson.dumps(router.routes),
                "draining": orjson.dumps(draining),
                "default": router.default_engine_id.encode(),
            },
        )

    async def load(self) -> RouteSnapshot | None:
        raw = await self._redis.hgetall(self._key)
        if not raw:
            return None
        engines = [
            EngineSpec(e["engine_id"], e["url"], int(e["cell"])) for e in orjson.loads(raw[b"engines"])
        ]
        return RouteSnapshot(
            engines=engines,
            routes=dict(orjson.loads(raw[b"routes"])),
            draining=list(orjson.loads(raw[b"draining"])),
            default_engine_id=_text(raw[b"default"]),
        )

    @staticmethod
    def restore(router: Router, snapshot: RouteSnapshot) -> None:
        router.update(snapshot.engines, snapshot.routes, snapshot.default_engine_id)
        for engine_id in snapshot.draining:
            engine = router.engines.get(engine_id)
            if engine is not None:
                engine.serving = False


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
