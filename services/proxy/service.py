"""The proxy service shell: NATS + Redis + gRPC (Proxy, health) from GyreService, plus the HTTP API.

`setup` builds the `ProxyCore`, reloads the routing table, binds the harness-facing HTTP server on
`run.host:proxy.http_port` and registers the gRPC servicer; the HTTP server is supervised (an
unexpected exit crashes the service). `stop` lets in-flight harness calls finish before the
shared shutdown sequence, so nothing being recorded is cut off.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from gyre.config import GyreConfig
from gyre.http_host import HttpHost
from gyre.model.model_dir import ModelDir
from gyre.service import GyreService
from gyre.v1 import proxy_pb2_grpc
from services.proxy.app import build_app
from services.proxy.core import ProxyCore, build_template
from services.proxy.grpc_api import ERROR_STATUSES, ProxyServicer


class ProxyService(GyreService):
    """Harness-facing APIs, per-execution credentials, TITO recording, routing and reroute."""

    name = "proxy"
    error_statuses = ERROR_STATUSES

    def __init__(self, config: GyreConfig, instance: int | None = None) -> None:
        super().__init__(config, instance)
        # Before any connection: a model directory or chat template the proxy cannot use stops it here.
        self.template = build_template(config.proxy, ModelDir.open(config.model))

    async def setup(self) -> None:
        self.core = ProxyCore(
            self.config.proxy,
            template=self.template,
            redis=self.redis,
            keys=self.keys,
            lora=self.config.cell_agent.trainer.lora is not None,
        )
        await self.core.start()
        self.http = HttpHost(
            build_app(self.core),
            host=self.config.run.host,
            port=self.config.proxy.http_port,
            name="proxy-http",
            client_certificates=False,  # harnesses authenticate with their per-execution keys
        )
        await self.http.start()
        self.core.base_url = f"{self.http.scheme}://{self.config.run.peer_host('proxy')}:{self.http.port}"
        self.supervisor.spawn(self.http.wait(), "http")
        proxy_pb2_grpc.add_ProxyServicer_to_server(ProxyServicer(self.core), self.server)

    def metrics_registries(self) -> list[CollectorRegistry]:
        return [self.core.metrics.registry] if hasattr(self, "core") else []

    def endpoint_info(self) -> dict[str, Any]:
        return {"http_port": self.http.port, "base_url": self.core.base_url} if hasattr(self, "http") else {}

    async def stop(self, grace_s: float = 5.0) -> None:
        if hasattr(self, "http"):
            await self.http.stop(grace_s)
        await super().stop(grace_s)

    async def teardown(self) -> None:
        if hasattr(self, "core"):
            await self.core.aclose()
