"""Chat templates: message → token renderers the trajectory trees record with.

There is one renderer, the model's own Hugging Face chat template (`HFChatTemplate`); what varies
is the model directory it comes from, or — for tests, benchmarks and trace replay that need no
weights — a family's template over an in-memory tokenizer:

    template = template_for_model(Path("/models/qwen3"))      # what the proxy serves with
    template = template_for_family("chatml")                   # the embedded demo model's format

The end-of-turn token and the tool-call parser come from the directory's chat family
(`gyre.model.families`) unless given; the stop ids add the model's `generation_config.json` eos ids.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gyre.model.families import FAMILIES, detect_family
from gyre.model.tokenizer import Tokenizer, generation_eos_ids
from gyre.model.vocab import family_tokenizer
from gyre.trajectory.templates.base import AppendOnlyReport, ChatTemplate, TemplateError
from gyre.trajectory.templates.hf import HFChatTemplate, probe_conversation


def template_for_model(
    directory: Path,
    *,
    end_of_turn: str | None = None,
    tool_call_parser: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    strict: bool = True,
) -> HFChatTemplate:
    """The chat template of a model directory (its tokenizer, template, family and eos ids)."""
    tokenizer = Tokenizer.from_dir(directory)
    family = detect_family(tokenizer) if end_of_turn is None or tool_call_parser is None else None
    eot = end_of_turn or (family.end_of_turn if family else "")
    stops = [i for i in generation_eos_ids(directory) if 0 <= i < tokenizer.vocab_size]
    return HFChatTemplate(
        tokenizer,
        end_of_turn=eot,
        tool_call_parser=tool_call_parser or (family.tool_call_parser if family else "hermes"),
        stop_token_ids=stops,
        template_kwargs=template_kwargs,
        strict=strict,
    )


@functools.cache
def template_for_family(name: str, *, kind: str = "byte", strict: bool = True) -> HFChatTemplate:
    """A family's template over an in-memory tokenizer (`byte`, or `bpe` trained on Gyre's text); one
    per process and arguments (templates hold no per-call state)."""
    family = FAMILIES[name]
    tokenizer = family_tokenizer(name, kind)
    stops = [tokenizer.special_id(t) for t in family.stop_tokens]
    return HFChatTemplate(
        tokenizer,
        end_of_turn=family.end_of_turn,
        tool_call_parser=family.tool_call_parser,
        stop_token_ids=stops,
        strict=strict,
    )


__all__ = [
    "AppendOnlyReport",
    "ChatTemplate",
    "HFChatTemplate",
    "TemplateError",
    "probe_conversation",
    "template_for_family",
    "template_for_model",
]
