"""The official `anthropic` and `openai` SDKs against the proxy backed by the embedded engine
(scripted outputs): streaming and not, tools and tool results, and the records they leave — one
output node per call holding exactly the ids the engine produced, with their log-probs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from app.stack.servers import ServerProcess
from gyre.trajectory import Node
from services.cell_agent.engine.sources.scripted import scripted_logprob
from tests.support.proxy_stack import ProxyStack, proxy_stack, scripted_engine
from tests.support.proxy_stack import scripted_ids as ids_of

pytestmark = pytest.mark.slow
WEATHER = {
    "name": "get_weather",
    "description": "Weather of a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def assert_recorded(node: Node, text: str) -> None:
    """The node holds the scripted output ids exactly, with the engine's log-probs."""
    assert node.sampled is not None
    expected = ids_of(text)
    assert node.token_ids[node.sampled].tolist() == expected
    assert node.logprobs.tolist() == pytest.approx([scripted_logprob(i) for i in range(len(expected))])


@pytest.fixture
async def stack(
    nats_server: ServerProcess, redis_server: ServerProcess, tmp_path: Path, run_id: str
) -> AsyncIterator[ProxyStack]:
    async with proxy_stack(
        nats_server.url, redis_server.url, tmp_path, run_id, {"cell-0": scripted_engine()}
    ) as s:
        yield s


async def test_anthropic_sdk_text_tools_and_tool_results(stack: ProxyStack) -> None:
    key = await stack.open("e1")
    outputs = ["Hello there.<|im_end|>", f"Checking.{CALL}<|im_end|>", "Sunny in Paris.<|im_end|>"]
    await stack.script("cell-0", outputs)
    client = anthropic.AsyncAnthropic(base_url=stack.base_url, api_key=key, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    first = await client.messages.create(model="m", max_tokens=64, messages=messages, tools=[WEATHER])  # type: ignore[arg-type,list-item]
    assert [(b.type, getattr(b, "text", None)) for b in first.content] == [("text", "Hello there.")]
    assert first.stop_reason == "end_turn" and first.usage.output_tokens == len(ids_of(outputs[0]))
    messages += [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    async with client.messages.stream(
        model="m", max_tokens=256, messages=messages, tools=[WEATHER]
    ) as stream:  # type: ignore[arg-type,list-item]
        kinds = [event.type async for event in stream]
        second = await stream.get_final_message()
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-1] == "message_stop"
    assert second.stop_reason == "tool_use"
    text, call = second.content
    assert text.type == "text" and text.text == "Checking."
    assert call.type == "tool_use" and call.name == "get_weather" and call.input == {"city": "Paris"}
    assert call.id.startswith("toolu_")
    messages += [
        {"role": "assistant", "content": second.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}]},
    ]
    third = await client.messages.create(model="m", max_tokens=64, messages=messages, tools=[WEATHER])  # type: ignore[arg-type,list-item]
    assert third.content[0].text == "Sunny in Paris."  # type: ignore[union-attr]

    tree = stack.tree("e1")
    leaves = tree.leaves()
    assert len(tree.roots) == 1 and len(leaves) == 1  # each call extended the previous one: one path
    path = [n for n in leaves[0].path() if n.meta is not None]
    assert [n.meta.request_id for n in path] == [  # type: ignore[union-attr]
        m.id.removeprefix("msg_") for m in (first, second, third)
    ]
    for node, text_ in zip(path, outputs, strict=True):
        assert_recorded(node, text_)
    assert path[1].tool_calls[0].id == call.id
    stored = await stack.stored_tree("e1")
    assert sorted(stored.nodes) == sorted(tree.nodes)


async def test_openai_chat_sdk_stream_and_not_with_tools(stack: ProxyStack) -> None:
    key = await stack.open("e2")
    outputs = [f"{CALL}<|im_end|>", "It is sunny.<|im_end|>"]
    await stack.script("cell-0", outputs)
    client = openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)
    tools = [
        {"type": "function", "function": {"name": WEATHER["name"], "parameters": WEATHER["input_schema"]}}
    ]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Paris?"},
    ]
    stream = await client.chat.completions.create(
        model="m",
        messages=messages,
        tools=tools,
        stream=True,
        stream_options={"include_usage": True},  # type: ignore[arg-type]
    )
    chunks = [chunk async for chunk in stream]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["tool_calls"] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(ids_of(outputs[0]))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(deltas) == 1 and deltas[0].function is not None
    call_id, arguments = deltas[0].id, deltas[0].function.arguments
    assert deltas[0].function.name == "get_weather" and arguments == '{"city": "Paris"}'
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "sunny"},
    ]
    answer = await client.chat.completions.create(model="m", messages=messages, tools=tools)  # type: ignore[arg-type]
    assert answer.choices[0].message.content == "It is sunny." and answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None and answer.usage.completion_tokens == len(ids_of(outputs[1]))
    leaves = stack.tree("e2").leaves()
    assert len(leaves) == 1
    path = [n for n in leaves[0].path() if n.meta is not None]
    for node, text in zip(path, outputs, strict=True):
        assert_recorded(node, text)


async def test_openai_responses_sdk_stream_with_a_function_call(stack: ProxyStack) -> None:
    key = await stack.open("e3", profile="codex")
    outputs = [f"<think>Need the weather.</think>{CALL}<|im_end|>", "Sunny.<|im_end|>"]
    await stack.script("cell-0", outputs)
    client = openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)
    tools = [
        {"type": "function", "name": "get_weather", "parameters": WEATHER["input_schema"], "strict": False}
    ]
    items: list[Any] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Paris?"}]},
    ]
    async with client.responses.stream(model="m", input=items, tools=tools) as stream:  # type: ignore[arg-type]
        kinds = [event.type async for event in stream]
        response = await stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [item.type for item in response.output] == ["reasoning", "function_call"]
    call = response.output[1]
    assert (
        call.type == "function_call" and call.name == "get_weather" and call.arguments == '{"city": "Paris"}'
    )
    items += [item.model_dump(exclude_none=True) for item in response.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "sunny"})
    final = await client.responses.create(model="m", input=items, tools=tools)  # type: ignore[arg-type]
    assert final.output_text == "Sunny." and final.status == "completed"
    assert final.usage is not None and final.usage.output_tokens == len(ids_of(outputs[1]))
    leaves = stack.tree("e3").leaves()
    assert len(leaves) == 1
    path = [n for n in leaves[0].path() if n.meta is not None]
    for node, text in zip(path, outputs, strict=True):
        assert_recorded(node, text)


TRICKY = [
    "<think>plan</think>Answer with  spaces.<|im_end|>",
    f"  {CALL}\n\n{CALL}<|im_end|>",
    '<tool_call>{"name": oops}</tool_call> stays text<|im_end|>',
    "Unicode: n\u00e9, \u2603, \U0001f600.<|im_end|>",
    "</think>no open tag<|im_end|>",
    {"text": "cut by the budget", "finish": "length"},
]


def _anthropic_blocks(message: Any) -> list[dict[str, Any]]:
    return [
        block.model_dump(exclude_none=True, exclude={"citations", "caller", "parsed_output"})
        for block in message.content
    ]


async def test_streamed_and_non_streamed_answers_agree_in_every_api(stack: ProxyStack) -> None:
    """Same scripted output, both modes, all three APIs: the client ends up with the same message."""
    key = await stack.open("e4")
    await stack.script("cell-0", [t for t in TRICKY for _ in range(6)])
    claude = anthropic.AsyncAnthropic(base_url=stack.base_url, api_key=key, max_retries=0)
    oai = openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)
    for i, _ in enumerate(TRICKY):
        messages: list[Any] = [{"role": "user", "content": f"case {i}"}]
        plain = await claude.messages.create(model="m", max_tokens=500, messages=messages, tools=[WEATHER])  # type: ignore[arg-type,list-item]
        async with claude.messages.stream(model="m", max_tokens=500, messages=messages, tools=[WEATHER]) as s:  # type: ignore[arg-type,list-item]
            streamed = await s.get_final_message()
        assert _anthropic_blocks(streamed) == _anthropic_blocks(plain), i
        assert (streamed.stop_reason, streamed.usage.output_tokens) == (
            plain.stop_reason,
            plain.usage.output_tokens,
        )

        chat_plain = await oai.chat.completions.create(model="m", messages=messages)
        chunks = [
            c async for c in await oai.chat.completions.create(model="m", messages=messages, stream=True)
        ]
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        calls = [
            tc.function.arguments for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []
        ]  # type: ignore[union-attr]
        plain_calls = [tc.function.arguments for tc in chat_plain.choices[0].message.tool_calls or []]  # type: ignore[union-attr]
        assert (content or None, calls) == (chat_plain.choices[0].message.content, plain_calls), i

        responses_plain = await oai.responses.create(model="m", input=f"case {i}")
        async with oai.responses.stream(model="m", input=f"case {i}") as rs:
            last = [event async for event in rs][-1]
        assert last.type == f"response.{responses_plain.status}"  # completed, or incomplete when cut
        responses_streamed = last.response  # type: ignore[union-attr]
        assert [o.model_dump(exclude={"id"}, exclude_none=True) for o in responses_streamed.output] == [
            o.model_dump(exclude={"id"}, exclude_none=True) for o in responses_plain.output
        ], i
        assert responses_streamed.status == responses_plain.status
    assert (await stack.stats()).server_errors == 0


async def test_count_tokens_reports_the_prompt_and_records_nothing(stack: ProxyStack) -> None:
    key = await stack.open("e5")
    client = anthropic.AsyncAnthropic(base_url=stack.base_url, api_key=key, max_retries=0)
    messages = [{"role": "user", "content": "How many tokens?"}]
    counted = await client.messages.count_tokens(model="m", messages=messages, system="Be brief.")  # type: ignore[arg-type]
    await stack.script("cell-0", ["Four.<|im_end|>"])
    answer = await client.messages.create(model="m", max_tokens=16, messages=messages, system="Be brief.")  # type: ignore[arg-type]
    assert counted.input_tokens == answer.usage.input_tokens + (answer.usage.cache_read_input_tokens or 0)
    assert len(stack.tree("e5").nodes) == 3  # root, user message, output: the count stored nothing
