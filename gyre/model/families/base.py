"""What a chat family is (`ChatFamily`), and how to add one to the registry in `__init__.py`.

A family says how a model of that family talks: its Jinja chat template (rendered by transformers' own
renderer), the token that ends an assistant turn, the tool-call parser the proxy reads its outputs with (a
name in `gyre.trajectory.output.PARSERS`), and the special tokens a tokenizer of the family carries; a family
whose template stands in for the one checkpoints ship (`proxy.template: auto`) says for which and where its
renders differ.

To add a family: write one module beside this one, `<name>.py`, holding its template (`CHAT_TEMPLATE`, which
must be append-only: `gyre model verify-template`) and `FAMILY = ChatFamily(...)`, and put `FAMILY` into the
registry's tuple in `__init__.py` at its place in detection order (before every family whose marker its own
templates also contain). If its tool calls have a new syntax, add a parser to `gyre.trajectory.output.PARSERS`.
A family that stands in for a shipped template (`stands_in_for`) adds that template as a fixture,
tests/fixtures/templates/shipped_<name>.json (its source, the family, whether it is append-only). The contract
tests (tests/unit/model/test_families.py, tests/unit/trajectory/test_template_registry.py) render every
entry through the proxy's template adapter, recognize it, and compare it with its fixture.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatFamily:
    """A chat-template family (ChatML/Qwen2, Qwen3, Llama 3): its template, end-of-turn token, tool-call parser
    and special tokens. Not a metric family (`gyre.metrics.Family`)."""

    name: str
    chat_template: str
    """The family's Jinja chat template (append-only); `gyre model init` writes it into new directories."""
    end_of_turn: str
    """The token an assistant turn ends with (the engine stops on it)."""
    tool_call_parser: str
    special_tokens: tuple[str, ...]
    """Added tokens that are special (skipped by `decode(skip_special_tokens=True)`), in id order."""
    added_tokens: tuple[str, ...] = ()
    """Added tokens that stay in decoded text (tool-call and reasoning tags)."""
    bos_token: str | None = None
    eos_token: str = ""
    pad_token: str | None = None
    marker: str = ""
    """A string only this family's templates contain, and the families after it in the registry's order do
    not (how `detect_family` recognizes it)."""
    catch_all: bool = False
    """Also recognizes a template that contains no family's marker but ends turns with this family's
    `end_of_turn` (plain ChatML: qwen2)."""
    stop_tokens: tuple[str, ...] = ()
    """Every token generation stops on (generation_config.json `eos_token_id`), end of turn first."""
    reasoning: bool = False
    """The template renders an assistant turn's reasoning (`<think>…</think>`); others drop it."""
    stands_in_for: str | None = None
    """The shipped templates this family's template replaces when theirs is not append-only (`proxy.template:
    auto`, gyre.trajectory.templates.registry); None: it stands in for none."""
    differences: str = ""
    """Where its renders differ from the shipped template's, and why that is the trade."""
