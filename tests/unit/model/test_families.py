"""Contract of the chat families: every template is append-only, its tool calls parse back with the
family's parser, directories are recognized; `gyre model verify-template` names the first turn of a
template that drops earlier reasoning (the one Qwen3 checkpoints ship), which the proxy replaces by its
family's verified template (`auto`), refuses (`strict`) or keeps (`shipped`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import app
from gyre.model.families import FAMILIES, detect_family
from gyre.model.tokenizer import Tokenizer
from gyre.trajectory.messages import Message, TextBlock, ThinkingBlock, ToolUseBlock
from gyre.trajectory.templates import TemplateError, template_for_family, template_for_model
from tests.support.models import copy_dir, family_dir, hf_dir, small_dir

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "templates" / "shipped_qwen3.json"
runner = CliRunner()


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_is_append_only_and_parses_its_own_tool_calls(name: str) -> None:
    template = template_for_family(name, kind="bpe")  # strict: raises if the probe finds a violation
    assert template.report.ok
    message = Message(
        "assistant",
        (TextBlock("Writing it."), ToolUseBlock("c1", "write_file", {"path": "a.txt", "content": "x = 1"})),
    )
    output = template.encode_output(message)
    assert output[-1] in template.stop_token_ids
    parsed = template.parse_output(output, id_seed=b"s")
    assert [(c.name, c.input) for c in parsed.tool_calls] == [
        ("write_file", {"path": "a.txt", "content": "x = 1"})
    ]
    assert parsed.text.strip() == "Writing it."


def test_malformed_tool_call_json_stays_text() -> None:
    for name in FAMILIES:
        template = template_for_family(name)
        broken = template.tokenizer.encode('<tool_call>{"name": "write_file", "arguments": {</tool_call>')
        out = template.parse_output([*broken, min(template.stop_token_ids)], id_seed=b"x")
        assert not out.tool_calls and "write_file" in out.text


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_family_is_recognized_from_a_directory_of_its_own(name: str) -> None:
    """Detection tries the registry's families in its order: each must be found from its own template (a family
    placed after one whose marker its template holds is not)."""
    assert detect_family(Tokenizer.from_dir(family_dir(name))).name == name
    assert detect_family(Tokenizer.from_dir(small_dir())).name == "chatml"


def test_a_plain_chatml_template_falls_to_the_catch_all_family(tmp_path: Path) -> None:
    path = copy_dir(hf_dir("qwen2"), tmp_path / "plain")
    (path / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    )
    assert detect_family(Tokenizer.from_dir(path)).name == "qwen2"
    (path / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    with pytest.raises(ValueError, match=rf"matches no known family \({', '.join(FAMILIES)}\)"):
        detect_family(Tokenizer.from_dir(path))


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_verify_template_passes_on_the_three_families(arch: str) -> None:
    result = runner.invoke(app, ["model", "verify-template", str(hf_dir(arch)), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["append_only"] and all(c["first_break"] is None for c in report["conversations"])
    assert sum(len(c["turns"]) for c in report["conversations"]) >= 12


def _drops_reasoning(tmp_path: Path) -> Path:
    path = copy_dir(hf_dir("qwen3"), tmp_path / "qwen3-drops")
    (path / "chat_template.jinja").write_text(json.loads(FIXTURE.read_text())["chat_template"])
    return path


def test_verify_template_names_the_turn_where_earlier_reasoning_is_dropped(tmp_path: Path) -> None:
    path = _drops_reasoning(tmp_path)
    result = runner.invoke(app, ["model", "verify-template", str(path), "--json"])
    assert result.exit_code == 1
    report = json.loads(result.stdout.strip().splitlines()[-1])
    multi = next(c for c in report["conversations"] if c["name"].startswith("multi-turn"))
    assert multi["first_break"]["index"] == 6 and multi["first_break"]["role"] == "user"
    assert "<think>" in multi["first_break"]["detail"]
    assert "turn 6 (user)" in result.stderr


def test_a_template_that_is_not_append_only_is_replaced_refused_or_kept(tmp_path: Path) -> None:
    path = _drops_reasoning(tmp_path)
    replaced = template_for_model(path)  # proxy.template: auto
    assert replaced.substitution is not None and replaced.substitution.family == "qwen3"
    assert replaced.report.ok and replaced.chat_template == FAMILIES["qwen3"].chat_template
    with pytest.raises(TemplateError, match=r"not append-only: .*proxy.template: auto renders"):
        template_for_model(path, mode="strict")
    kept = template_for_model(path, mode="shipped")  # kept, with the report of where it breaks
    assert not kept.report.ok and kept.substitution is None
    assert kept.name == replaced.substitution.shipped


def test_thinking_is_parsed_from_qwen3_outputs() -> None:
    template = template_for_model(hf_dir("qwen3"))
    message = Message("assistant", (ThinkingBlock("plan"), TextBlock("answer")))
    out = template.parse_output(template.encode_output(message), id_seed=b"t")
    assert out.thinking.strip() == "plan" and out.text.strip() == "answer"
