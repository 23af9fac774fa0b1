"""Trees in Redis: the TreeStore round trip the packer relies on, and a restarted proxy that keeps
serving the same keys, extends the reloaded trees and routes as before."""

from __future__ import annotations

import asyncio
from pathlib import Path

import anthropic
import pytest
import redis.asyncio as aioredis

from app.stack.servers import ServerProcess
from gyre.store import Keys
from gyre.store.trees import TreeStore, UnknownTreeError
from gyre.trajectory import CallMeta, Message, TrajectoryTree, encode_node, get_profile, template_for_family
from gyre.trajectory.messages import Api, ModelRequest
from services.cell_agent.engine import EngineServer
from services.proxy.credentials import Credentials
from services.proxy.errors import ExecutionClosedError
from services.proxy.executions import Executions
from tests.support.proxy_stack import proxy_stack, scripted_engine


def _tree_with_two_calls() -> tuple[TrajectoryTree, list[list[int]]]:
    tree = TrajectoryTree("e1", template_for_family("chatml"), get_profile("generic"))
    outputs = [[*b"first", 258], [*b"second", 258]]
    history = [Message.text("user", "hi")]
    for i, ids in enumerate(outputs):
        prepared = tree.prepare(ModelRequest(Api.ANTHROPIC, ("sys",), tuple(history)))
        result = tree.commit(prepared, ids, [-0.5] * len(ids), CallMeta(request_id=f"r{i}", policy_version=3))
        assert result.output is not None
        history += [result.output.to_message(), Message.text("user", f"more {i}")]
    return tree, outputs


async def test_tree_store_round_trip(redis: aioredis.Redis, keys: Keys) -> None:
    store = TreeStore(redis, keys)
    assert await store.create(
        "e1", profile="generic", template="embedded", policy_version=3, extra={"group_id": "g"}
    )
    assert not await store.create("e1", profile="claude_code", template="embedded", policy_version=9)
    with pytest.raises(ValueError):
        await store.create(
            "e2", profile="generic", template="embedded", policy_version=0, extra={"closed": "1"}
        )
    tree, outputs = _tree_with_two_calls()
    for node in tree.ordered_nodes():
        await store.append("e1", [node], num_calls=1 if node.meta else 0, num_sampled=node.num_sampled)
    loaded = await store.load("e1")
    assert [encode_node(n) for n in loaded.ordered_nodes()] == [encode_node(n) for n in tree.ordered_nodes()]
    assert [n.token_ids[n.sampled].tolist() for n in loaded.leaves()] == [outputs[1]]  # type: ignore[index]
    assert not loaded.closed and not await store.is_closed("e1")
    meta = await store.close("e1")
    assert meta.closed and meta.num_calls == 2 and meta.num_sampled_tokens == sum(map(len, outputs))
    assert meta.profile == "generic" and meta.policy_version == 3 and meta.extra == {"group_id": "g"}
    assert await store.is_closed("e1") and (await store.load("e1")).closed
    assert (await store.close("e1")).closed_at_s == meta.closed_at_s  # idempotent
    assert not await store.is_closed("nope")
    with pytest.raises(UnknownTreeError):
        await store.load("nope")
    with pytest.raises(UnknownTreeError):
        await store.close("nope")


@pytest.mark.slow
async def test_a_restarted_proxy_keeps_keys_trees_and_routes(
    nats_server: ServerProcess, redis_server: ServerProcess, tmp_path: Path, run_id: str
) -> None:
    spec = scripted_engine()
    async with EngineServer(spec.section, model_dir=spec.model_dir) as engine:
        engines = {"cell-0": engine}
        async with proxy_stack(nats_server.url, redis_server.url, tmp_path, run_id, engines) as first:
            key = await first.open("e1")
            await first.script("cell-0", ["Before the restart.<|im_end|>", "After the restart.<|im_end|>"])
            client = anthropic.AsyncAnthropic(base_url=first.base_url, api_key=key, max_retries=0)
            messages: list[dict[str, object]] = [{"role": "user", "content": "hi"}]
            answer = await client.messages.create(model="m", max_tokens=64, messages=messages)  # type: ignore[arg-type]
            before = sorted(first.tree("e1").nodes)
        async with proxy_stack(
            nats_server.url, redis_server.url, tmp_path, run_id, engines, send_routes=False
        ) as second:
            assert second.service.core.executions.in_memory("e1") is None  # nothing loaded until asked
            client = anthropic.AsyncAnthropic(base_url=second.base_url, api_key=key, max_retries=0)
            messages += [
                {"role": "assistant", "content": answer.content},
                {"role": "user", "content": "again"},
            ]
            again = await client.messages.create(model="m", max_tokens=64, messages=messages)  # type: ignore[arg-type]
            assert again.content[0].text == "After the restart."  # type: ignore[union-attr]
            tree = second.tree("e1")
            assert set(before) < set(tree.nodes) and len(tree.leaves()) == 1  # extended, not branched
            stored = await second.stored_tree("e1")
            assert sorted(stored.nodes) == sorted(tree.nodes)


async def test_concurrent_opens_of_one_execution_share_one_tree(redis: aioredis.Redis, keys: Keys) -> None:
    """The opener that creates the tree builds it in memory (nothing to read back); an `open` racing it
    (a retried OpenExecution) finds it there or loads it — either way every key reaches the state the
    first caller's calls already use, or a call through one key would be recorded in a tree the
    other's calls never see."""
    executions = Executions(
        TreeStore(redis, keys), Credentials(redis, keys), template_for_family("chatml"), "generic"
    )
    first, second = (asyncio.create_task(executions.open("e1", "generic", 0)) for _ in range(2))
    key_a = await first
    created = executions.in_memory("e1")  # what calls through the first key use from now on
    key_b = await second
    state_a, state_b = await executions.for_key(key_a), await executions.for_key(key_b)
    assert state_a is state_b is created is executions.in_memory("e1")
    assert not state_a.tree.nodes and executions.num_open == 1
    await executions.close("e1")
    with pytest.raises(ExecutionClosedError):
        await executions.open("e1", "generic", 0)
