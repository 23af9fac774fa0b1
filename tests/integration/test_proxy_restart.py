"""Harness calls across a proxy restart: what the harness sees when the proxy process is SIGKILLed under
a streaming call (a connection error), that its retry succeeds on the restarted proxy, and that the tree
then holds each call once — a retry whose first attempt had been recorded is answered from that record."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest
import yaml

from app.stack.health import grpc_health
from app.stack.servers import ServerProcess, free_port
from gyre.config import GyreConfig
from gyre.store import Keys, connect_redis
from gyre.store.trees import TreeStore
from gyre.trajectory.node import NodeKind
from gyre.v1 import common_pb2, proxy_pb2, proxy_pb2_grpc
from services.cell_agent.engine import EngineServer
from tests.support.eventually import eventually, eventually_sync
from tests.support.proxy_stack import ProxyStack, proxy_stack, scripted_engine, scripted_model_dir

pytestmark = pytest.mark.slow
MESSAGES: list[dict[str, Any]] = [{"role": "user", "content": "What is 3+3?"}]


def _outputs(tree: Any) -> list[str]:
    return [n.role for n in tree.nodes.values() if n.kind is NodeKind.OUTPUT]


async def test_an_identical_retry_is_answered_from_the_recorded_output(
    nats_server: ServerProcess, redis_server: ServerProcess, tmp_path: Path, run_id: str
) -> None:
    async with proxy_stack(
        nats_server.url, redis_server.url, tmp_path, run_id, {"cell-0": scripted_engine()}
    ) as s:
        key = await s.open("e1")
        await s.script("cell-0", ["Six.<|im_end|>", "A second sample.<|im_end|>", "Done.<|im_end|>"])
        client = anthropic.AsyncAnthropic(base_url=s.base_url, api_key=key, max_retries=0)
        first = await _stream_text(client, MESSAGES)
        again = await _stream_text(client, MESSAGES)  # the harness never saw `first` (say): it asks again
        assert first == again == "Six."
        assert (await s.script_status("cell-0"))["queued"] == 2, "the retry did not reach the engine"
        assert len(_outputs(await s.stored_tree("e1"))) == 1
        assert _replayed(s) == 1
        # A continued history is an ordinary call again.
        later = [*MESSAGES, {"role": "assistant", "content": first}, {"role": "user", "content": "Sure?"}]
        assert await _stream_text(client, later) == "A second sample."
        assert len(_outputs(await s.stored_tree("e1"))) == 2


async def _stream_text(client: anthropic.AsyncAnthropic, messages: list[dict[str, Any]]) -> str:
    async with client.messages.stream(model="m", max_tokens=64, messages=messages) as stream:  # type: ignore[arg-type]
        message = await stream.get_final_message()
    return "".join(getattr(b, "text", "") for b in message.content)


def _replayed(s: ProxyStack) -> int:
    return int(s.service.core.metrics.replayed._value.get())


async def test_a_streaming_call_cut_by_a_proxy_kill_is_retried_on_the_restarted_proxy(
    nats_server: ServerProcess, redis_server: ServerProcess, tmp_path: Path, run_id: str
) -> None:
    config = GyreConfig.model_validate(
        {
            "run": {"id": run_id, "dir": str(tmp_path)},
            "nats": {"url": nats_server.url},
            "redis": {"url": redis_server.url},
            "model": {"path": str(scripted_model_dir())},
            "proxy": {"port": free_port(), "http_port": free_port()},
        }
    )
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    spec = scripted_engine()
    async with EngineServer(spec.section, model_dir=spec.model_dir) as engine:
        proxy = _start_proxy(config_file, tmp_path / "proxy-1.log", config.proxy.port)
        try:
            stub = proxy_pb2_grpc.ProxyStub(grpc_channel := _channel(config.proxy.port))
            await stub.UpdateRoutes(
                proxy_pb2.UpdateRoutesRequest(
                    engines=[common_pb2.EngineEndpoint(engine_id="cell-0", url=engine.url, cell=0)],
                    default_engine_id="cell-0",
                )
            )
            opened = await stub.OpenExecution(
                proxy_pb2.OpenExecutionRequest(
                    execution=common_pb2.ExecutionRef(execution_id="e1", group_id="g")
                )
            )
            await grpc_channel.close()
            await _script(
                engine.url,
                [
                    {"text": "A slow answer that takes a while.<|im_end|>", "token_interval_s": 0.1},
                    {"text": "Six.<|im_end|>"},
                ],
            )
            base_url = f"http://127.0.0.1:{config.proxy.http_port}"
            client = anthropic.Anthropic(base_url=base_url, api_key=opened.api_key, max_retries=0, timeout=60)
            started, seen = threading.Event(), []

            def harness_call() -> None:
                try:
                    with client.messages.stream(model="m", max_tokens=64, messages=MESSAGES) as stream:  # type: ignore[arg-type]
                        for event in stream:
                            started.set()
                            seen.append(event.type)
                    seen.append("completed")
                except (anthropic.APIError, httpx2.TransportError) as e:
                    seen.append(type(e).__name__)

            call = threading.Thread(target=harness_call)
            call.start()
            assert await asyncio.to_thread(started.wait, 30), "the stream never started"
            proxy.send_signal(signal.SIGKILL)
            proxy.wait(10)
            await asyncio.to_thread(call.join, 30)
            # Mid-stream (the stream had started: `started`) the SDK raises from the stream's iteration:
            # httpx2's RemoteProtocolError in earlier anthropic 2.x releases; 2.17.0 wraps the failed body read
            # as APIConnectionError (anthropic/_streaming.py, iter_response_bytes). Either way no message_stop.
            assert seen[-1] in ("RemoteProtocolError", "APIConnectionError") and "message_stop" not in seen
            # While the proxy is down the harness's retries are refused ...
            with pytest.raises(anthropic.APIConnectionError):
                client.messages.create(model="m", max_tokens=64, messages=MESSAGES)  # type: ignore[arg-type]
            # ... and once it is back on its port (keys, trees and routes from Redis) the retry succeeds.
            proxy = _start_proxy(config_file, tmp_path / "proxy-2.log", config.proxy.port)

            def engine_idle() -> bool:  # the killed call's generation ends on the engine (nobody aborted it)
                stats = engine.core.stats()
                return stats["num_running_reqs"] + stats["num_waiting_reqs"] == 0

            await eventually(engine_idle, timeout_s=60, what="the cut call's generation to end")
            retried = await asyncio.to_thread(
                lambda: client.messages.create(model="m", max_tokens=64, messages=MESSAGES)  # type: ignore[arg-type]
            )
            assert "".join(getattr(b, "text", "") for b in retried.content) == "Six."
        finally:
            proxy.send_signal(signal.SIGTERM)
            proxy.wait(20)
    redis = await connect_redis(redis_server.url)
    try:
        tree = await TreeStore(redis, Keys(run_id)).load("e1")
    finally:
        await redis.aclose()
    outputs = [n for n in tree.nodes.values() if n.kind is NodeKind.OUTPUT]
    assert len(outputs) == 1, "the cut call left nothing, the retry one output"
    assert outputs[0].sampled is not None and outputs[0].num_sampled == len(outputs[0].logprobs)


def _start_proxy(config_file: Path, log: Path, grpc_port: int) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.proxy", "--config", str(config_file)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )

    def serving() -> bool:
        assert proc.poll() is None, log.read_text()[-2000:]
        return grpc_health(grpc_port) == "SERVING"

    eventually_sync(serving, timeout_s=60, interval_s=0.1, what=f"the proxy to serve ({log})")
    return proc


def _channel(port: int) -> Any:
    import grpc

    return grpc.aio.insecure_channel(f"127.0.0.1:{port}")


async def _script(url: str, entries: list[dict[str, Any]]) -> None:
    import httpx

    async with httpx.AsyncClient() as http:
        (await http.post(f"{url}/gyre/script", json={"entries": entries})).raise_for_status()
