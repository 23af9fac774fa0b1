"""The scripted output source: queued answers, special tokens, rid targeting, the log-prob rule,
and SGLang's stop-token / stop-string rules applied to scripted text."""

from __future__ import annotations

from typing import Any

import pytest

from gyre.engine import EngineRequestError
from gyre.model.tokenizer import Tokenizer
from services.cell_agent.engine.protocol import RequestRefused
from services.cell_agent.engine.sources.scripted import ScriptEntry, scripted_logprob
from tests.support.models import small_dir
from tests.unit.engine.helpers import engine_section, serve

TOK = Tokenizer.from_dir(small_dir())
IM_END = TOK.special_id("<|im_end|>")
SCRIPTED = engine_section(output_source="scripted")


async def test_text_entries_are_served_in_order_with_special_tokens_and_a_terminator() -> None:
    script: list[dict[str, Any]] = [{"text": "<tool_call>{}</tool_call>"}, {"text": "done"}]
    async with serve(SCRIPTED, script=script) as (_, client):
        first = await client.generate([1, 2], {"max_new_tokens": 100})
        assert first.output_ids == [
            TOK.special_id("<tool_call>"),
            123,
            125,
            TOK.special_id("</tool_call>"),
            IM_END,
        ]
        assert first.finish_reason is not None and first.finish_reason.matched == IM_END
        assert first.text == "{}"  # specials skipped, the stop token trimmed
        assert first.output_logprobs == [scripted_logprob(i) for i in range(5)]
        second = await client.generate([1], {"max_new_tokens": 100, "skip_special_tokens": False})
        assert second.text == "done"
        with pytest.raises(EngineRequestError, match="no scripted output"):
            await client.generate([1], {})


async def test_rid_entries_are_reserved_for_their_request() -> None:
    script = [{"rid": "b", "text": "for b"}, {"text": "for anyone"}]
    async with serve(SCRIPTED, script=script) as (_, client):
        assert (await client.generate([1], {}, rid="a")).text == "for anyone"
        assert (await client.generate([1], {}, rid="b")).text == "for b"


async def test_rules_answer_by_the_prompt_and_are_never_used_up() -> None:
    import zlib

    prompt_a, prompt_b = (
        TOK.encode("user: list the files"),
        TOK.encode("<tool_response>a.txt</tool_response>"),
    )
    script: list[dict[str, Any]] = [
        {"when": "tool_response", "choices": ["zero", "one"]},
        {"when": "list", "text": "calling ls"},
        {"text": "queued first"},
    ]
    async with serve(SCRIPTED, script=script) as (_, client):
        assert (await client.generate(prompt_a, {}, rid="r0")).text == "queued first"  # the queue comes first
        for rid in ("r1", "r2", "r3"):
            assert (await client.generate(prompt_a, {}, rid=rid)).text == "calling ls"
            want = ["zero", "one"][zlib.crc32(rid.encode()) % 2]
            assert (await client.generate(prompt_b, {}, rid=rid)).text == want
        with pytest.raises(EngineRequestError, match="no scripted output"):
            await client.generate(TOK.encode("nothing matches"), {}, rid="r4")
        assert (await client.request("GET", "/gyre/script")).json() == {"queued": 0, "rules": 2, "served": 7}


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"when": "(", "text": "x"}, "not a regex"),
        ({"choices": [], "when": "x"}, "non-empty list"),
        ({"choices": ["a"], "text": "b"}, "exactly one"),
    ],
)
def test_bad_rules_are_refused(entry: dict[str, Any], problem: str) -> None:
    with pytest.raises(RequestRefused, match=problem):
        ScriptEntry.from_json(entry)


async def test_finish_length_logprobs_and_request_stop_rules() -> None:
    script: list[dict[str, Any]] = [
        {"output_ids": [65, 66, 67], "finish": "length", "logprobs": [-0.5, -0.25, -0.125]},
        {"text": "abc STOP xyz"},
        {"text": "abc STOP xyz"},
        {"text": "hello", "stop_token_id": 7},
        {"text": "long answer"},
    ]
    async with serve(SCRIPTED, script=script) as (_, client):
        r = await client.generate([1], {"max_new_tokens": 50})
        assert (
            r.output_ids == [65, 66, 67] and r.finish_reason is not None and r.finish_reason.type == "length"
        )
        assert r.output_logprobs == [-0.5, -0.25, -0.125]
        r = await client.generate([1], {"stop": ["STOP"]})
        assert r.text == "abc " and r.finish_reason is not None and r.finish_reason.matched == "STOP"
        assert TOK.decode(r.output_ids) == "abc STOP"  # output_ids keep the tokens that completed it
        r = await client.generate([1], {"stop": "STOP", "no_stop_trim": True})
        assert r.text == "abc STOP"
        r = await client.generate([1], {"stop_token_ids": [9]})
        assert r.output_ids[-1] == 7 and r.finish_reason is not None and r.finish_reason.matched == 7
        r = await client.generate([1], {"max_new_tokens": 4})
        assert r.text == "long" and r.finish_reason is not None and r.finish_reason.type == "length"


async def test_script_endpoint_appends_and_replaces() -> None:
    async with serve(SCRIPTED) as (_, client):
        status = (
            await client.request("POST", "/gyre/script", json={"entries": [{"text": "a"}, {"text": "b"}]})
        ).json()
        assert status == {"queued": 2, "rules": 0, "served": 0}
        status = (
            await client.request("POST", "/gyre/script", json={"entries": [{"text": "c"}], "replace": True})
        ).json()
        assert status["queued"] == 1
        assert (await client.generate([1], {})).text == "c"
        assert (await client.request("GET", "/gyre/script")).json() == {"queued": 0, "rules": 0, "served": 1}
        bad = await client.request("POST", "/gyre/script", json={"entries": [{"txt": "typo"}]})
        assert bad.status_code == 400 and "txt" in bad.json()["error"]["message"]
    async with serve() as (_, model_client):
        assert (await model_client.request("GET", "/gyre/script")).status_code == 404


@pytest.mark.parametrize(
    "entry",
    [
        {},
        {"text": "a", "output_ids": [1]},
        {"text": "a", "finish": "maybe"},
        {"output_ids": [], "finish": "length"},
    ],
)
def test_malformed_entries_are_refused(entry: dict[str, Any]) -> None:
    with pytest.raises(RequestRefused):
        ScriptEntry.from_json(entry)
