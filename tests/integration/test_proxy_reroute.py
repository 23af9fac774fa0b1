"""Reroute under load: 32 concurrent streaming executions on engine A, `Drain(A)` to engine B
mid-stream with KV migration. Every client receives a complete, well-formed stream with no error,
and every recorded output is one node whose ids are exactly what the client was sent.

Both engines run the same small GyreLM (same seed: one policy), so B continues each output from
the tokens A already produced, over KV imported from A.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from app.stack.servers import ServerProcess
from gyre.trajectory import NodeKind, to_anthropic_content
from gyre.v1 import proxy_pb2
from tests.support.eventually import eventually
from tests.support.proxy_stack import ProxyStack, model_engine, proxy_stack

pytestmark = pytest.mark.slow
NUM_STREAMS = 32
NUM_PLAIN = 4


class Client:
    """One streaming harness: what it was sent, and when."""

    def __init__(self, stack: ProxyStack, key: str, index: int) -> None:
        self.client = anthropic.AsyncAnthropic(base_url=stack.base_url, api_key=key, max_retries=0)
        self.index = index
        self.started = asyncio.Event()
        self.text_deltas: list[str] = []
        self.text_before_drain: str | None = None
        self.final: Any = None

    async def run(self) -> None:
        messages = [{"role": "user", "content": f"Tell story number {self.index}."}]
        async with self.client.messages.stream(model="m", max_tokens=300, messages=messages) as stream:  # type: ignore[arg-type]
            async for event in stream:
                if event.type == "message_start":
                    self.started.set()
                elif event.type == "content_block_delta" and event.delta.type == "text_delta":
                    self.text_deltas.append(event.delta.text)
            self.final = await stream.get_final_message()


def _blocks(message: Any) -> list[dict[str, Any]]:
    return [b.model_dump(exclude_none=True, exclude={"citations", "parsed_output"}) for b in message.content]


async def test_drain_mid_stream_moves_every_call_without_a_visible_seam(
    nats_server: ServerProcess, redis_server: ServerProcess, tmp_path: Path, run_id: str
) -> None:
    engines = {"cell-0": model_engine(cell=0, seed=7), "cell-1": model_engine(cell=1, seed=7)}
    async with proxy_stack(nats_server.url, redis_server.url, tmp_path, run_id, engines) as stack:
        keys = [await stack.open(f"s{i}", engine_id="cell-0") for i in range(NUM_STREAMS)]
        plain_keys = [await stack.open(f"p{i}", engine_id="cell-0") for i in range(NUM_PLAIN)]
        clients = [Client(stack, key, i) for i, key in enumerate(keys)]
        streams = [asyncio.create_task(c.run()) for c in clients]

        async def plain(key: str) -> Any:
            oai = openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)
            return await oai.chat.completions.create(
                model="m", max_tokens=300, messages=[{"role": "user", "content": "A long answer, please."}]
            )

        plains = [asyncio.create_task(plain(k)) for k in plain_keys]
        await asyncio.wait_for(asyncio.gather(*(c.started.wait() for c in clients)), 120)
        await eventually(
            lambda: sum(1 for c in clients if c.text_deltas) >= 4 or all(t.done() for t in streams),
            what="four streams to be answering",
        )
        for c in clients:
            c.text_before_drain = "".join(c.text_deltas)
        drained = await stack.stub.Drain(
            proxy_pb2.DrainRequest(engine_id="cell-0", destination_engine_ids=["cell-1"], migrate_kv=True)
        )
        await asyncio.wait_for(asyncio.gather(*streams, *plains), 240)  # no client raised

        assert drained.executions_moved == NUM_STREAMS + NUM_PLAIN
        assert drained.calls_rerouted >= NUM_STREAMS // 2  # most calls were still generating
        assert drained.kv_migrated_tokens > 0
        assert stack.engines["cell-0"].core.num_running == 0
        template = stack.service.core.template
        moved = 0
        for i, c in enumerate(clients):
            tree = stack.tree(f"s{i}")
            outputs = [n for n in tree.nodes.values() if n.kind is NodeKind.OUTPUT]
            assert len(outputs) == 1, f"stream {i}: {len(outputs)} output nodes"
            node = outputs[0]
            assert node.sampled is not None and node.parent is not None and node.meta is not None
            ids = node.token_ids[node.sampled].tolist()
            assert len(node.logprobs) == len(ids) == c.final.usage.output_tokens
            sent = to_anthropic_content(template.parse_output(ids, node.parent.path_digest, "toolu_"))
            assert _blocks(c.final) == sent, f"stream {i}: the client got something else than the record"
            assert "".join(c.text_deltas).startswith(c.text_before_drain or "")
            assert c.final.stop_reason in ("end_turn", "max_tokens")
            moved += node.meta.engine_id == "cell-1"
        assert moved >= drained.calls_rerouted - NUM_PLAIN
        for i, task in enumerate(plains):
            answer = task.result()
            (node,) = [n for n in stack.tree(f"p{i}").nodes.values() if n.kind is NodeKind.OUTPUT]
            assert answer.usage.completion_tokens == node.num_sampled
        stats = await stack.stats()
        assert stats.errors_during_transitions == 0
        assert (stats.client_errors, stats.server_errors) == (0, 0)
        assert (
            stats.reroutes == drained.calls_rerouted
            and stats.kv_migrated_tokens == drained.kv_migrated_tokens
        )
        metrics = (await stack.http.get(f"{stack.base_url}/metrics")).text
        assert "gyre_proxy_stream_mismatches_total 0.0" in metrics


async def test_calls_survive_an_engine_that_stops_under_them(
    nats_server: ServerProcess, redis_server: ServerProcess, tmp_path: Path, run_id: str
) -> None:
    """The engine goes away mid-generation (its calls end aborted, then it refuses connections);
    the scheduler drains it. Each call continues on the destination from the ids it already had."""
    engines = {"cell-0": model_engine(cell=0, seed=3), "cell-1": model_engine(cell=1, seed=3)}
    async with proxy_stack(nats_server.url, redis_server.url, tmp_path, run_id, engines) as stack:
        clients = [Client(stack, await stack.open(f"s{i}", engine_id="cell-0"), i) for i in range(4)]
        tasks = [asyncio.create_task(c.run()) for c in clients]
        await asyncio.wait_for(asyncio.gather(*(c.started.wait() for c in clients)), 60)
        await stack.engines["cell-0"].stop()
        await stack.stub.Drain(proxy_pb2.DrainRequest(engine_id="cell-0", destination_engine_ids=["cell-1"]))
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
        template = stack.service.core.template
        finished_on = []
        for i, c in enumerate(clients):
            (node,) = [n for n in stack.tree(f"s{i}").nodes.values() if n.kind is NodeKind.OUTPUT]
            assert node.sampled is not None and node.parent is not None and node.meta is not None
            ids = node.token_ids[node.sampled].tolist()
            sent = to_anthropic_content(template.parse_output(ids, node.parent.path_digest, "toolu_"))
            assert _blocks(c.final) == sent
            finished_on.append(node.meta.engine_id)
        assert "cell-1" in finished_on  # at least one call was cut on cell-0 and finished on cell-1
        stats = await stack.stats()
        assert (stats.client_errors, stats.server_errors) == (0, 0)
