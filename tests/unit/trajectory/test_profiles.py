"""Harness profiles: the registry contract and the classification rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre.trajectory import (
    PROFILES,
    Message,
    ModelRequest,
    from_anthropic,
    from_openai_responses,
    get_profile,
)
from gyre.trajectory.messages import Api, TextBlock
from gyre.trajectory.profiles import AgentKind, HarnessProfile, LeafClass, RequestKind

BILLING = "x-anthropic-billing-header: cc_version=2.1.332.4e6; cc_entrypoint=sdk-cli;"


def _cc(
    system: list[str], messages: list[dict[str, object]], headers: dict[str, str] | None = None
) -> ModelRequest:
    return from_anthropic(
        {"system": [{"type": "text", "text": s} for s in system], "messages": messages}, headers
    )


@pytest.mark.parametrize("name", sorted(PROFILES))
@given(
    system=st.lists(st.text(max_size=30), max_size=3),
    texts=st.lists(st.text(max_size=30), max_size=3),
    headers=st.dictionaries(
        st.sampled_from(["x-gyre-agent", "x-gyre-request", "x-claude-code-agent-id", "other"]),
        st.text(max_size=8),
        max_size=3,
    ),
)
def test_profile_contract_classifies_any_shape(
    name: str, system: list[str], texts: list[str], headers: dict[str, str]
) -> None:
    request = ModelRequest(
        Api.ANTHROPIC, tuple(system), tuple(Message.text("user", t) for t in texts), headers=headers
    )
    c = PROFILES[name].classify(request)
    assert c.agent_kind in AgentKind and c.request_kind in RequestKind
    assert isinstance(c.leaf_class, LeafClass)
    assert PROFILES[name].classify(ModelRequest(Api.OPENAI_CHAT, (), ())).leaf_class is LeafClass.MAIN


def test_claude_code_main_sub_summary_and_billing_line() -> None:
    p = get_profile("claude_code")
    main = p.classify(
        _cc([BILLING, "You are a Claude agent.", "Main prompt"], [{"role": "user", "content": "hi"}])
    )
    assert (main.agent_kind, main.request_kind) == ("main", "task")
    assert main.system == "You are a Claude agent.\nMain prompt"
    sub_by_header = p.classify(
        _cc([BILLING, "x"], [{"role": "user", "content": "hi"}], {"X-Claude-Code-Agent-Id": "a1"})
    )
    sub_by_billing = p.classify(
        _cc([BILLING + " cc_is_subagent=true;", "x"], [{"role": "user", "content": "hi"}])
    )
    sub_by_prompt = p.classify(_cc(["You are an agent for Claude Code, Anthropic's official CLI."], []))
    assert {sub_by_header.agent_kind, sub_by_billing.agent_kind, sub_by_prompt.agent_kind} == {"sub"}
    compaction = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "result"},
                {"type": "text", "text": "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools."},
            ],
        }
    ]
    summary = p.classify(_cc([BILLING, "x"], compaction))
    assert summary.leaf_class is LeafClass.MAIN_SUMMARY
    assert (
        p.classify(_cc([BILLING + " cc_is_subagent=true;"], compaction)).leaf_class
        is LeafClass.SUB_AGENT_SUMMARY
    )
    continued = p.classify(
        _cc(
            [BILLING],
            [
                {
                    "role": "user",
                    "content": "This session is being continued from a previous "
                    "conversation that ran out of context.",
                }
            ],
        )
    )
    assert continued.leaf_class is LeafClass.MAIN and "post_compaction" in continued.tags
    # The instruction must be in the last user message to make a summary request.
    earlier = p.classify(
        _cc(
            [BILLING], [*compaction, {"role": "assistant", "content": "s"}, {"role": "user", "content": "go"}]
        )
    )
    assert earlier.request_kind == "task"


def test_generic_headers_and_codex() -> None:
    g = get_profile("generic")
    r = ModelRequest(
        Api.OPENAI_CHAT,
        (),
        (Message("user", (TextBlock("q"),)),),
        headers={"x-gyre-agent": "SUB", "x-gyre-request": "summary"},
    )
    assert g.classify(r).leaf_class is LeafClass.SUB_AGENT_SUMMARY
    assert (
        g.classify(ModelRequest(Api.OPENAI_CHAT, (), (), headers={"x-gyre-agent": "weird"})).agent_kind
        == "main"
    )
    codex = get_profile("codex").classify(
        from_openai_responses(
            {"input": [{"role": "developer", "content": "Codex prompt"}, {"role": "user", "content": "q"}]}
        )
    )
    assert codex.leaf_class is LeafClass.MAIN and codex.system == "Codex prompt"
    compaction = from_openai_responses(
        {
            "input": [
                {"role": "user", "content": "q"},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "input_text",
                            "text": "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary.",
                        }
                    ],
                },
            ]
        }
    )
    assert get_profile("codex").classify(compaction).leaf_class is LeafClass.MAIN_SUMMARY
    with pytest.raises(ValueError, match="unknown harness profile"):
        get_profile("nope")


def test_profiles_load_from_plain_data() -> None:
    data = {
        "name": "mine",
        "volatile_system": ["^session:"],
        "rules": [
            {"when": [{"system_contains": "helper"}, {"header_present": "x-sub"}], "agent_kind": "sub"},
            {"when": [{"last_user_startswith": "Summarize"}], "request_kind": "summary", "tag": "s"},
        ],
    }
    p = HarnessProfile.from_dict(data)
    r = ModelRequest(Api.OPENAI_CHAT, ("session: 42", "a helper"), (Message.text("user", "Summarize all"),))
    c = p.classify(r)
    assert c.leaf_class is LeafClass.SUB_AGENT_SUMMARY and c.system == "a helper" and c.tags == {"s"}
