"""ProxyCore: the proxy's parts wired together, behind the HTTP app and the gRPC servicer.

    core = ProxyCore(config.proxy, template=build_template(config.proxy, model), redis=redis, keys=Keys(run_id))
    await core.start()                                   # reload the routing table
    key = await core.open_execution("e1", profile="claude_code", engine_id="", policy_version=0)
    await core.update_routes([EngineSpec("cell-0", url, 0)], {}, "cell-0")
    ...                                                  # the HTTP app serves harness calls
    await core.drain("cell-0", ["pool-0"], migrate_kv=True)
    await core.close_execution("e1")

It holds the chat template, the executions (credentials, trees), the router, the metrics and the
settings of a call; it owns no sockets (service.py does, through gyre/http_host.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import redis.asyncio as aioredis
import structlog

from gyre.config import ProxySection
from gyre.model.model_dir import ModelDir
from gyre.store import Keys
from gyre.store.trees import TreeStore
from gyre.trajectory import ChatTemplate, ModelRequest, get_profile, template_for_model
from services.proxy.calls import CallSettings, ModelCall, begin_call, prepare
from services.proxy.credentials import Credentials
from services.proxy.encoding import SegmentEncoder
from services.proxy.executions import Executions, ExecutionState
from services.proxy.metrics import OverheadClock, ProxyMetrics
from services.proxy.route_store import RouteStore
from services.proxy.routing import DrainResult, EngineSpec, Router

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class CloseSummary:
    num_calls: int
    num_nodes: int
    num_sampled_tokens: int


def build_template(section: ProxySection, model: ModelDir) -> ChatTemplate:
    """The chat template of the run's model directory (its tokenizer, template, family), as `proxy`
    configures it. A model's own template that is not append-only is replaced by its family's verified one
    (`proxy.template: auto`, logged here once) or refused with `TemplateError` (`strict`)."""
    path = model.path
    template = template_for_model(
        path,
        end_of_turn=section.end_of_turn,
        tool_call_parser=section.tool_call_parser,
        template_kwargs=section.template_kwargs,
        mode=section.template,
    )
    if template.substitution is not None:
        log.warning(
            "chat_template_replaced",
            model=str(path),
            template=template.name,
            family=template.substitution.family,
            replaced=template.substitution.shipped,
            replaced_breaks=list(template.substitution.shipped_breaks),
            why="the model's own chat template is not append-only; proxy.template: auto renders with the "
            "verified template of its family (`gyre model verify-template` shows the difference; "
            "proxy.template: strict refuses, shipped keeps it)",
        )
    return template


class ProxyCore:
    def __init__(
        self,
        section: ProxySection,
        *,
        template: ChatTemplate,
        redis: aioredis.Redis,
        keys: Keys,
        lora: bool = False,
    ) -> None:
        """`lora`: the run trains a LoRA adapter, so calls name the engine's policy adapter."""
        self.section = section
        get_profile(section.default_profile)  # ValueError names the known profiles
        self.template = template
        self.metrics = ProxyMetrics()
        self.store = TreeStore(redis, keys)
        self.executions = Executions(
            self.store,
            Credentials(redis, keys),
            self.template,
            section.default_profile,
            strict_matching=section.matching == "strict",
        )
        self.router = Router(
            engine_timeout_s=section.engine_timeout_s, drain_timeout_s=section.drain_timeout_s, lora=lora
        )
        self.route_store = RouteStore(redis, keys)
        self.encoder = SegmentEncoder(
            template, threads=section.encode_threads, inline_chars=section.encode_inline_chars
        )
        self.settings = CallSettings(
            default_max_tokens=section.default_max_tokens,
            max_engine_attempts=section.max_engine_attempts,
            retry_backoff_s=section.retry_backoff_s,
            unreachable_wait_s=section.unreachable_wait_s,
            replay_unanswered_calls=section.replay_unanswered_calls,
            record_routed_experts=section.record_routed_experts,
        )
        self.base_url = ""
        """Where harnesses reach the HTTP API (set once it is bound)."""

    async def start(self) -> None:
        snapshot = await self.route_store.load()
        if snapshot is not None:
            RouteStore.restore(self.router, snapshot)

    async def aclose(self) -> None:
        await self.router.aclose()
        self.encoder.close()

    # -- harness calls -----------------------------------------------------------------------

    async def begin(
        self, state: ExecutionState, request: ModelRequest, request_id: str, clock: OverheadClock
    ) -> ModelCall:
        return await begin_call(
            state=state,
            request=request,
            router=self.router,
            template=self.template,
            encoder=self.encoder,
            executions=self.executions,
            metrics=self.metrics,
            settings=self.settings,
            request_id=request_id,
            clock=clock,
        )

    async def count_tokens(self, state: ExecutionState, request: ModelRequest) -> int:
        """Prompt tokens of a call (matched ids reused; nothing stored)."""
        return len((await prepare(state, request, self.encoder)).input_ids)

    def in_transition(self, call: ModelCall | None) -> bool:
        """Whether an error now counts as one seen during a role transition."""
        return self.router.num_drains_active > 0 or (call is not None and call.moved)

    # -- control plane (gRPC) ----------------------------------------------------------------

    async def open_execution(
        self,
        execution_id: str,
        *,
        profile: str,
        engine_id: str,
        policy_version: int,
        extra: Mapping[str, str] | None = None,
    ) -> str:
        key = await self.executions.open(execution_id, profile, policy_version, extra)
        if engine_id:
            self.router.set_route(execution_id, engine_id)
            await self.route_store.save(self.router)
        self.metrics.open_executions.set(self.executions.num_open)
        return key

    async def close_execution(self, execution_id: str) -> CloseSummary:
        meta, num_nodes = await self.executions.close(execution_id)
        self.router.forget(execution_id)
        self.metrics.open_executions.set(self.executions.num_open)
        return CloseSummary(meta.num_calls, num_nodes, meta.num_sampled_tokens)

    async def update_routes(
        self, engines: Iterable[EngineSpec], routes: Mapping[str, str], default_engine_id: str
    ) -> int:
        held = self.router.update(engines, routes, default_engine_id)
        await self.route_store.save(self.router)
        return held

    async def drain(self, engine_id: str, destinations: Iterable[str], migrate_kv: bool) -> DrainResult:
        result = await self.router.drain(engine_id, destinations, migrate_kv)
        self.metrics.rerouted(result.calls_rerouted, result.kv_migrated_tokens)
        await self.route_store.save(self.router)
        return result
