"""Chat-format families: the chat template, special tokens and tool-call parser of each model family.

A family says how a model of that family talks: its Jinja chat template (`templates/<name>.jinja`,
rendered by transformers' own renderer), the token that ends an assistant turn, the tool-call
parser the proxy reads its outputs with (a name in `gyre.trajectory.output.PARSERS`), and the
special tokens a tokenizer of the family carries. `gyre model init` writes a family into a new
model directory; the proxy recognizes the family of any directory from its chat template.

    family = FAMILIES["qwen3"]
    family = detect_family(tokenizer)           # from the template the directory ships

To add a family: write `templates/<name>.jinja` (it must be append-only: `gyre model verify-template`),
add a `ChatFamily` to `FAMILIES` and, if its tool calls have a new syntax, a parser to
`gyre.trajectory.output.PARSERS`; the contract test in tests/unit/model/test_families.py renders
every entry through the proxy's template adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gyre.model.tokenizer import Tokenizer

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"


@dataclass(frozen=True, slots=True)
class ChatFamily:
    """A chat-template family (ChatML/Qwen2, Qwen3, Llama 3): its end-of-turn token, tool-call parser and
    special tokens. Not a metric family (`gyre.metrics.Family`)."""

    name: str
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
    """A string only this family's templates contain (how `detect_family` recognizes it)."""
    stop_tokens: tuple[str, ...] = ()
    """Every token generation stops on (generation_config.json `eos_token_id`), end of turn first."""
    reasoning: bool = False
    """The template renders an assistant turn's reasoning (`<think>…</think>`); others drop it."""

    @property
    def chat_template(self) -> str:
        return (TEMPLATE_DIR / f"{self.name}.jinja").read_text()


FAMILIES: dict[str, ChatFamily] = {
    family.name: family
    for family in (
        ChatFamily(
            name="chatml",
            end_of_turn="<|im_end|>",
            tool_call_parser="hermes",
            special_tokens=(
                "<|endoftext|>",
                "<|im_start|>",
                "<|im_end|>",
                "<tool_call>",
                "</tool_call>",
                "<think>",
                "</think>",
                "<|pad|>",
            ),
            eos_token="<|endoftext|>",
            pad_token="<|pad|>",
            marker="'# Tools'",
            stop_tokens=("<|im_end|>", "<|endoftext|>"),
            reasoning=True,
        ),
        ChatFamily(
            name="qwen2",
            end_of_turn="<|im_end|>",
            tool_call_parser="hermes",
            special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
            added_tokens=("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            marker="<tool_call>",
            stop_tokens=("<|im_end|>", "<|endoftext|>"),
        ),
        ChatFamily(
            name="qwen3",
            end_of_turn="<|im_end|>",
            tool_call_parser="hermes",
            special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
            added_tokens=(
                "<tool_call>",
                "</tool_call>",
                "<tool_response>",
                "</tool_response>",
                "<think>",
                "</think>",
            ),
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            marker="<think>",
            stop_tokens=("<|im_end|>", "<|endoftext|>"),
            reasoning=True,
        ),
        ChatFamily(
            name="llama3",
            end_of_turn="<|eot_id|>",
            tool_call_parser="llama3_json",
            special_tokens=(
                "<|begin_of_text|>",
                "<|end_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
                "<|eom_id|>",
                "<|python_tag|>",
            ),
            bos_token="<|begin_of_text|>",
            eos_token="<|eot_id|>",
            pad_token="<|end_of_text|>",
            marker="<|start_header_id|>",
            stop_tokens=("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
        ),
    )
}


def detect_family(tokenizer: Tokenizer) -> ChatFamily:
    """The family whose markers the directory's chat template contains (most specific first)."""
    template = tokenizer.chat_template
    if not template:
        raise ValueError(
            f"{tokenizer.source}: tokenizer_config.json has no chat_template; the proxy renders calls with the "
            "model's own template (add one, e.g. from `gyre model init`)"
        )
    for name in ("llama3", "chatml", "qwen3", "qwen2"):
        family = FAMILIES[name]
        if family.marker in template and tokenizer.has_token(family.end_of_turn):
            return family
    if "<|im_end|>" in template and tokenizer.has_token("<|im_end|>"):
        return FAMILIES["qwen2"]
    raise ValueError(
        f"{tokenizer.source}: the chat template matches no known family ({', '.join(FAMILIES)}); "
        "set proxy.end_of_turn and proxy.tool_call_parser"
    )
