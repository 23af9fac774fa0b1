"""Fuzzing the three request schemas (Anthropic Messages, OpenAI Chat Completions, OpenAI
Responses) with hypothesis, 2,300 requests in all: bodies that follow each schema with every
field sometimes replaced by a wrong type, an unknown value or random JSON, plus unknown extra
fields, raw garbage and random JSON. The proxy must never answer 5xx (nor send a server error
inside a stream), and a refused request must not write a single tree node.

The proxy runs on a background event loop (hypothesis drives plain functions); valid requests are
answered by a scripted engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.stack.servers import ServerProcess
from tests.support.proxy_stack import ThreadedStack, scripted_engine

pytestmark = pytest.mark.slow
SETTINGS = settings(
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
    database=None,
)
SERVER_ERROR_MARKERS = (b'"api_error"', b'"overloaded_error"', b'"server_error"', b"response.failed")

# -- strategies ------------------------------------------------------------------------------------

json_scalar = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
)
any_json = st.recursive(
    json_scalar,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
text = st.text(max_size=40)


def field(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the valid shape, sometimes anything at all."""
    return st.one_of(valid, valid, valid, any_json)


def body(
    required: dict[str, st.SearchStrategy[Any]], optional: dict[str, st.SearchStrategy[Any]]
) -> st.SearchStrategy[Any]:
    extras = st.dictionaries(st.text(min_size=1, max_size=12).map(lambda k: f"x_{k}"), any_json, max_size=2)
    obj = st.fixed_dictionaries(
        {k: field(v) for k, v in required.items()}, optional={k: field(v) for k, v in optional.items()}
    )
    return st.one_of(
        st.builds(lambda o, e: {**o, **e}, obj, extras),
        st.builds(lambda o: {k: v for k, v in o.items() if k != "messages"}, obj),
    )


schema = st.fixed_dictionaries(
    {"type": st.just("object"), "properties": st.dictionaries(text, st.just({"type": "string"}), max_size=2)}
)
anthropic_block = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": field(text)}),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": field(text), "signature": text}),
    st.fixed_dictionaries(
        {"type": st.just("tool_use"), "id": field(text), "name": field(text), "input": any_json}
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("tool_result"),
            "tool_use_id": field(text),
            "content": field(
                text | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2)
            ),
        },
        optional={"is_error": st.booleans()},
    ),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["image", "document", "redacted_thinking", "server_tool_use", "mystery"])}
    ),
    any_json,
)
anthropic_message = st.fixed_dictionaries(
    {
        "role": field(st.sampled_from(["user", "assistant", "system"])),
        "content": field(text | st.lists(anthropic_block, max_size=3)),
    }
)
ANTHROPIC = body(
    {"model": text, "max_tokens": st.integers(0, 64), "messages": st.lists(anthropic_message, max_size=4)},
    {
        "system": text | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2),
        "tools": st.lists(
            st.fixed_dictionaries({"name": text, "description": text, "input_schema": schema}), max_size=2
        ),
        "stream": st.booleans(),
        "temperature": st.floats(-1, 3),
        "top_p": st.floats(-0.5, 1.5),
        "top_k": st.integers(-2, 50),
        "stop_sequences": st.lists(text, max_size=2),
        "metadata": any_json,
        "thinking": any_json,
    },
)

chat_part = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text"]), "text": field(text)}),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["image_url", "input_audio", "file", "refusal", "other"])}
    ),
)
tool_call = st.fixed_dictionaries(
    {
        "id": field(text),
        "type": st.just("function"),
        "function": field(st.fixed_dictionaries({"name": field(text), "arguments": field(text)})),
    }
)
chat_message = st.one_of(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["system", "developer", "user"]),
            "content": field(text | st.lists(chat_part, max_size=2)),
        }
    ),
    st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": field(st.none() | text)},
        optional={"tool_calls": field(st.lists(tool_call, max_size=2)), "reasoning_content": text},
    ),
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["tool", "function"]),
            "tool_call_id": field(text),
            "name": text,
            "content": field(text),
        }
    ),
    st.fixed_dictionaries({"role": field(text)}),
)
CHAT = body(
    {"model": text, "messages": st.lists(chat_message, max_size=4)},
    {
        "tools": st.lists(
            st.fixed_dictionaries(
                {
                    "type": st.just("function"),
                    "function": st.fixed_dictionaries({"name": text, "parameters": schema}),
                }
            ),
            max_size=2,
        ),
        "stream": st.booleans(),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
        "max_tokens": st.integers(0, 64),
        "max_completion_tokens": st.integers(0, 64),
        "temperature": st.floats(-1, 3),
        "stop": text | st.lists(text, max_size=2),
        "n": st.integers(0, 3),
    },
)

responses_item = st.one_of(
    st.fixed_dictionaries(
        {
            "type": st.just("message"),
            "role": field(st.sampled_from(["user", "developer", "system", "assistant"])),
            "content": field(
                text
                | st.lists(
                    st.fixed_dictionaries(
                        {"type": st.sampled_from(["input_text", "output_text", "input_image"]), "text": text}
                    ),
                    max_size=2,
                )
            ),
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("function_call"),
            "call_id": field(text),
            "name": field(text),
            "arguments": field(text),
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["function_call_output", "custom_tool_call_output"]),
            "call_id": field(text),
            "output": field(text),
        }
    ),
    st.fixed_dictionaries({"type": st.just("reasoning"), "summary": any_json, "content": any_json}),
    st.fixed_dictionaries(
        {"type": st.just("custom_tool_call"), "call_id": field(text), "name": field(text), "input": any_json}
    ),
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": field(text)}),
    any_json,
)
RESPONSES = body(
    {"model": text, "input": text | st.lists(responses_item, max_size=4)},
    {
        "instructions": text,
        "tools": st.lists(
            st.one_of(
                st.fixed_dictionaries({"type": st.just("function"), "name": text, "parameters": schema}),
                st.fixed_dictionaries({"type": st.sampled_from(["web_search", "namespace"])}),
            ),
            max_size=2,
        ),
        "stream": st.booleans(),
        "max_output_tokens": st.integers(0, 64),
        "reasoning": any_json,
        "store": st.booleans(),
    },
)

# -- the proxy -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def proxy(
    nats_server: ServerProcess, redis_server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ThreadedStack, str, httpx.Client]]:
    run_dir = tmp_path_factory.mktemp("fuzz")
    with ThreadedStack(
        nats_server.url,
        redis_server.url,
        run_dir,
        "fuzz",
        {"cell-0": scripted_engine()},
        proxy={"max_body_bytes": 256 * 1024},
    ) as threaded:
        stack = threaded.stack
        key = threaded.run(stack.open("fuzz"))
        threaded.run(stack.script("cell-0", ["ok<|im_end|>"] * 6000))
        with httpx.Client(base_url=stack.base_url, timeout=60, headers={"x-api-key": key}) as client:
            yield threaded, key, client


def check(proxy: tuple[ThreadedStack, str, httpx.Client], path: str, content: bytes) -> None:
    threaded, _, client = proxy
    store = threaded.stack.service.core.store
    before = threaded.run(store.num_nodes("fuzz"))
    response = client.post(path, content=content, headers={"content-type": "application/json"})
    assert response.status_code < 500, (response.status_code, response.text[:500], content[:500])
    if response.status_code >= 400:
        assert threaded.run(store.num_nodes("fuzz")) == before, "a refused request wrote tree nodes"
        assert response.json()  # an error body in the caller's format
    else:
        assert not any(marker in response.content for marker in SERVER_ERROR_MARKERS), response.text[:500]


def dumps(body: Any) -> bytes:
    return orjson.dumps(body)


@settings(SETTINGS, max_examples=800)
@given(body=ANTHROPIC)
def test_anthropic_messages_schema(proxy: tuple[ThreadedStack, str, httpx.Client], body: Any) -> None:
    check(proxy, "/v1/messages?beta=true", dumps(body))


@settings(SETTINGS, max_examples=700)
@given(body=CHAT)
def test_openai_chat_schema(proxy: tuple[ThreadedStack, str, httpx.Client], body: Any) -> None:
    check(proxy, "/v1/chat/completions", dumps(body))


@settings(SETTINGS, max_examples=600)
@given(body=RESPONSES)
def test_openai_responses_schema(proxy: tuple[ThreadedStack, str, httpx.Client], body: Any) -> None:
    check(proxy, "/v1/responses", dumps(body))


@settings(SETTINGS, max_examples=200)
@given(
    path=st.sampled_from(
        ["/v1/messages", "/v1/messages/count_tokens", "/v1/chat/completions", "/v1/responses"]
    ),
    raw=st.one_of(st.binary(max_size=200), any_json.map(dumps)),
)
def test_garbage_and_random_json(
    proxy: tuple[ThreadedStack, str, httpx.Client], path: str, raw: bytes
) -> None:
    check(proxy, path, raw)


def test_the_fuzzed_proxy_answered_valid_requests_too(proxy: tuple[ThreadedStack, str, httpx.Client]) -> None:
    """The schemas are near enough to valid that some requests got through and were recorded."""
    threaded, _, _ = proxy
    stats = threaded.run(threaded.stack.stats())
    assert stats.server_errors == 0
    registry = threaded.stack.service.core.metrics.registry
    assert (
        registry.get_sample_value("gyre_proxy_conversion_bugs_total") == 0
    )  # every refusal was a RequestError
    assert stats.requests > stats.client_errors + 100
    assert threaded.run(threaded.stack.service.core.store.num_nodes("fuzz")) > 100
