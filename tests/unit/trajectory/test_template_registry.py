"""The verified template registry against the templates real checkpoints ship (tests/fixtures/templates/
shipped_*.json, each naming its source): every registry template is append-only; `proxy.template: auto`
replaces exactly the shipped templates that are not; and the prompt a registry template renders for a
conversation's last turn (what the model is sampled on) is the shipped template's, except where the
registry's `differences` say — checked token for token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from app.cli import app
from gyre.trajectory.messages import (
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
)
from gyre.trajectory.templates import VERIFIED, HFChatTemplate, template_for_family, template_for_model
from gyre.trajectory.templates.verify import CONVERSATIONS, compare_last_turns, verify_template
from tests.support.models import copy_dir, family_dir

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "templates"
SHIPPED: dict[str, dict[str, Any]] = {
    path.stem.removeprefix("shipped_"): json.loads(path.read_text())
    for path in sorted(FIXTURES.glob("shipped_*.json"))
}
"""fixture → what it holds: the shipped template, its source, the family that stands in for it, whether it is
append-only."""
runner = CliRunner()


def shipped_dir(tmp_path: Path, fixture: str) -> Path:
    """A tiny model of its family whose chat template is the shipped one."""
    data = SHIPPED[fixture]
    assert data["source"]["repository"] and data["source"]["commit"] and data["model"]
    path = copy_dir(family_dir(data["family"]), tmp_path / fixture)
    (path / "chat_template.jinja").write_text(data["chat_template"])
    return path


def test_every_verified_template_has_its_fixture_and_every_fixture_its_family() -> None:
    assert sorted(data["family"] for data in SHIPPED.values()) == sorted(VERIFIED)


def text(template: HFChatTemplate, system: str, tools: Any, messages: list[Message]) -> str:
    """The last-turn prompt of `messages` (generation prompt appended), as text."""
    ids = template.render_conversation(system, tools, messages, add_generation_prompt=True)
    return template.tokenizer.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("family", sorted(VERIFIED))
def test_every_registry_template_is_append_only_over_the_suite(family: str) -> None:
    report = verify_template(template_for_family(family, kind="bpe"))
    assert report.ok, report.first_break


@pytest.mark.parametrize("fixture", sorted(SHIPPED))
def test_auto_replaces_exactly_the_shipped_templates_that_are_not_append_only(
    tmp_path: Path, fixture: str
) -> None:
    replaced = not SHIPPED[fixture]["append_only"]
    path = shipped_dir(tmp_path, fixture)
    shipped = template_for_model(path, mode="shipped")
    assert shipped.report.ok is (not replaced) and verify_template(shipped).ok is (not replaced)
    auto = template_for_model(path)
    if replaced:
        assert auto.substitution is not None and auto.substitution.family == SHIPPED[fixture]["family"]
        assert auto.substitution.shipped == shipped.name and auto.substitution.shipped_breaks
        assert auto.report.ok and verify_template(auto).ok
    else:
        assert auto.substitution is None and auto.name == shipped.name


def test_qwen3_last_turn_prompts_differ_only_by_the_reasoning_the_shipped_template_drops(
    tmp_path: Path,
) -> None:
    path = shipped_dir(tmp_path, "qwen3")
    shipped, auto = template_for_model(path, mode="shipped"), template_for_model(path)
    equal = {t.conversation: t.equal for t in compare_last_turns(shipped, auto)}
    # One user query, then the agent's turns: the prompt the model is sampled on is the shipped one.
    assert equal == {name: name != "multi-turn with thinking and tools" for name in CONVERSATIONS}
    # After a second user query, the registry's prompt holds the earlier turns' <think> blocks, and
    # nothing else differs: removing them gives the shipped prompt exactly.
    system, tools, messages = CONVERSATIONS["multi-turn with thinking and tools"]
    last_query = max(i for i, m in enumerate(messages) if m.role == "user")
    ours, theirs = (
        text(auto, system, tools, list(messages[:-1])),
        text(shipped, system, tools, list(messages[:-1])),
    )
    for m in messages[:last_query]:
        for block in m.blocks:
            if isinstance(block, ThinkingBlock):
                assert f"<think>\n{block.thinking}\n</think>\n\n" in ours
                ours = ours.replace(f"<think>\n{block.thinking}\n</think>\n\n", "", 1)
    assert ours == theirs


def test_qwen3_keeps_what_was_sampled_where_the_shipped_template_rewrites_it(tmp_path: Path) -> None:
    path = shipped_dir(tmp_path, "qwen3")
    auto = template_for_model(path)
    # The engine's output for an empty reasoning, parsed and rendered back: the same tokens.
    sampled = auto.encode("<think>\n\n</think>\n\nHi.<|im_end|>")
    message = auto.parse_output(sampled, id_seed=b"s").to_message()
    assert auto.encode_output(message) == sampled
    # enable_thinking=false: every assistant turn starts with the generation prompt's empty block.
    no_think = template_for_model(path, template_kwargs={"enable_thinking": False})
    assert no_think.report.ok and no_think.substitution is not None
    assert no_think.tokenizer.decode(no_think.render_generation_prompt()).endswith("<think>\n\n</think>\n\n")


def test_qwen2_5_registry_renders_what_the_shipped_template_renders(tmp_path: Path) -> None:
    path = shipped_dir(tmp_path, "qwen2_5")
    shipped = template_for_model(path)
    registry = template_for_family("qwen2", kind="bpe")
    for system, tools, messages in CONVERSATIONS.values():
        for k in range(len(messages) + 1):
            ours = registry.render_conversation(system, tools, messages[:k], add_generation_prompt=False)
            theirs = shipped.render_conversation(system, tools, messages[:k], add_generation_prompt=False)
            assert registry.tokenizer.decode(ours) == shipped.tokenizer.decode(theirs)


def test_llama3_registry_is_the_shipped_template_with_tools_in_the_system_turn(tmp_path: Path) -> None:
    """Where the shipped Llama 3.1 template can render a conversation (one call per turn, no text beside
    it), the registry renders what it renders with tools_in_user_message=false; without tools, what it
    renders by default."""
    path = shipped_dir(tmp_path, "llama3_1")
    tools = [
        ToolSpec("read_file", "Read a file.", {"type": "object", "properties": {"path": {"type": "string"}}})
    ]
    messages = [
        Message.text("user", "What does add.py hold?"),
        Message("assistant", (ToolUseBlock("c1", "read_file", {"path": "add.py"}),)),
        Message("tool", (ToolResultBlock("c1", "def add(a, b): return a - b"),)),
        Message("assistant", (TextBlock("It subtracts."),)),
        Message.text("user", "Thanks."),
    ]
    auto = template_for_model(path)
    assert auto.substitution is not None and auto.substitution.family == "llama3"
    system_turn = template_for_model(path, mode="shipped", template_kwargs={"tools_in_user_message": False})
    for k in range(1, len(messages) + 1):
        assert text(auto, "You are a helper.", tools, messages[:k]) == text(
            system_turn, "You are a helper.", tools, messages[:k]
        )
    default = template_for_model(path, mode="shipped")
    assert text(auto, "You are a helper.", [], messages) == text(default, "You are a helper.", [], messages)


def _verify(path: Path) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["model", "verify-template", str(path), "--json"])
    return result.exit_code, json.loads(result.stdout.strip().splitlines()[-1])


def test_verify_template_reports_the_shipped_breaks_and_what_auto_renders(tmp_path: Path) -> None:
    code, qwen3 = _verify(shipped_dir(tmp_path, "qwen3"))
    assert code == 1 and not qwen3["append_only"]
    breaks = {c["name"]: c["first_break"] for c in qwen3["conversations"]}
    assert breaks["multi-turn with thinking and tools"]["index"] == 6  # the second user turn
    assert breaks["plain chat"]["index"] == 2  # the last turn's empty <think> block, dropped
    auto = qwen3["auto"]
    assert auto["source"] == "registry" and auto["family"] == "qwen3" and auto["append_only"]
    assert [t["equal"] for t in auto["last_turn"]] == [False, True, True, True]
    code, qwen25 = _verify(shipped_dir(tmp_path, "qwen2_5"))
    assert code == 0 and qwen25["append_only"] and qwen25["auto"]["source"] == "model"
    code, llama = _verify(shipped_dir(tmp_path, "llama3_1"))
    assert code == 1 and llama["auto"]["family"] == "llama3"
    assert "single tool-calls" in json.dumps(llama["conversations"])


def test_verify_template_on_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["model", "verify-template", str(tmp_path / "missing")])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "missing" in result.stderr
