"""Routing replay through the real proxy: with `proxy.record_routed_experts` the proxy asks the embedded
engine (a small Qwen3-MoE) for `return_routed_experts`, plain and streamed, and records the experts of
every forwarded token in the execution's tree — the same rows a fresh forward over the path chooses,
each node's once — and Redis holds them as the live tree does."""

from __future__ import annotations

from pathlib import Path

import anthropic
import numpy as np
import torch

from app.stack.servers import ServerProcess
from gyre.config.engine import EngineSection
from gyre.model.routing import ExpertRouting
from gyre.model.weights import load_model
from gyre.trajectory import encode_node
from gyre.trajectory.routing import known_rows
from services.cell_agent.engine import EngineServer
from tests.support.models import MOE_SMALL, moe_dir
from tests.support.proxy_stack import proxy_stack

LAYERS, TOP_K = 2, 2
DIMS = {**MOE_SMALL, "max_position_embeddings": 2048}


async def test_the_proxy_records_each_tokens_experts_in_the_tree(
    nats_server: ServerProcess, redis_server: ServerProcess, tmp_path: Path, run_id: str
) -> None:
    model_dir = moe_dir(7, **DIMS)
    section = EngineSection(output_source="model", kv_cache_tokens=8192)
    async with (
        EngineServer(section, model_dir=model_dir) as engine,
        proxy_stack(
            nats_server.url,
            redis_server.url,
            tmp_path,
            run_id,
            {"cell-0": engine},
            proxy={"record_routed_experts": True},
        ) as stack,
    ):
        key = await stack.open("e1")
        client = anthropic.AsyncAnthropic(base_url=stack.base_url, api_key=key, max_retries=0)
        messages: list[dict[str, object]] = [{"role": "user", "content": "hi there"}]
        first = await client.messages.create(model="m", max_tokens=12, messages=messages)  # type: ignore[arg-type]
        messages += [{"role": "assistant", "content": first.content}, {"role": "user", "content": "go on"}]
        stream = await client.messages.create(model="m", max_tokens=12, messages=messages, stream=True)  # type: ignore[arg-type]
        async for _ in stream:
            pass
        tree = stack.tree("e1")
        stored = await stack.stored_tree("e1")
    assert [encode_node(n) for n in stored.ordered_nodes()] == [encode_node(n) for n in tree.ordered_nodes()]
    (leaf,) = tree.leaves()
    path = leaf.path()
    assert len(path) >= 4 and all(n.routed_experts is not None for n in path if n.num_tokens)
    rows = np.concatenate([n.routed_experts for n in path if n.routed_experts is not None])
    tokens = np.concatenate([n.token_ids for n in path])
    routing = ExpertRouting()
    with torch.no_grad():
        load_model(model_dir)(
            torch.as_tensor(tokens, dtype=torch.int64),
            torch.arange(len(tokens)),
            [0, len(tokens)],
            routing=routing,
        )
    fresh = routing.stacked(LAYERS, TOP_K).reshape(len(tokens), -1).numpy()
    known = known_rows(rows)
    assert leaf.sampled is not None
    last_sampled = len(tokens) - leaf.num_tokens + int(np.flatnonzero(leaf.sampled)[-1])
    assert known[:last_sampled].all() and not known[last_sampled:].any()
    assert np.array_equal(rows[known], fresh[known])
