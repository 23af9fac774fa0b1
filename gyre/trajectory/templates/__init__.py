"""Chat templates: message → token renderers the trajectory trees record with.

There is one renderer, a Hugging Face chat template over the model's tokenizer (`HFChatTemplate`);
what varies is where the template comes from: the model directory's own, the registry's verified
append-only template of its family when the model's own is not append-only (`proxy.template: auto`,
gyre.trajectory.templates.registry), or — for tests, benchmarks and trace replay that need no
weights — a family's template over an in-memory tokenizer:

    template = template_for_model(Path("/models/qwen3"))                  # what the proxy serves with
    template = template_for_model(Path("/models/qwen3"), mode="strict")   # refuse a non-append-only one
    template = template_for_family("chatml")                               # the embedded demo model's format

The end-of-turn token and the tool-call parser come from the directory's chat family
(`gyre.model.families`) unless given; the stop ids add the model's `generation_config.json` eos ids.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from gyre.model.families import FAMILIES, ChatFamily, detect_family
from gyre.model.tokenizer import Tokenizer, generation_eos_ids
from gyre.model.vocab import family_tokenizer
from gyre.trajectory.templates.base import AppendOnlyReport, ChatTemplate, TemplateError
from gyre.trajectory.templates.hf import HFChatTemplate, probe_conversation, template_name
from gyre.trajectory.templates.registry import VERIFIED, Substitution, VerifiedTemplate

TemplateMode = Literal["auto", "strict", "shipped"]
TEMPLATE_MODES: tuple[TemplateMode, ...] = ("auto", "strict", "shipped")
"""How a model's own chat template that is not append-only is treated: `auto` renders with the registry's
verified template of its family instead, `strict` refuses it, `shipped` keeps it (trees then record every
turn as sampled, which the template would have rendered otherwise)."""


def template_for_model(
    directory: Path,
    *,
    end_of_turn: str | None = None,
    tool_call_parser: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    mode: TemplateMode = "auto",
) -> HFChatTemplate:
    """The chat template of a model directory (its tokenizer, template, family and eos ids). When the
    directory's own template is not append-only, `mode` decides (see `TEMPLATE_MODES`); a substituted
    template says so in `substitution`."""
    if mode not in TEMPLATE_MODES:
        raise ValueError(f"template mode must be one of {', '.join(TEMPLATE_MODES)}; got {mode!r}")
    tokenizer = Tokenizer.from_dir(directory)
    family = _family(tokenizer, required=end_of_turn is None or tool_call_parser is None)
    eot = end_of_turn or (family.end_of_turn if family else "")
    stops = [i for i in generation_eos_ids(directory) if 0 <= i < tokenizer.vocab_size]

    parser = tool_call_parser or (family.tool_call_parser if family else "hermes")

    def build(chat_template: str | None, strict: bool) -> HFChatTemplate:
        return HFChatTemplate(
            tokenizer,
            end_of_turn=eot,
            tool_call_parser=parser,
            stop_token_ids=stops,
            chat_template=chat_template,
            template_kwargs=template_kwargs,
            strict=strict,
        )

    shipped: HFChatTemplate | None = None
    try:
        shipped = build(None, strict=False)
    except TemplateError as e:  # it cannot even render the probe's turns one by one
        breaks = [str(e)]
    else:
        breaks = shipped.report.violations
        if not breaks or mode == "shipped":
            return shipped
    verified = VERIFIED.get(family.name) if family is not None else None
    if mode != "auto" or verified is None:
        fix = (
            "proxy.template: auto renders with the verified template of its family instead"
            if verified is not None
            else f"no verified template stands in for this family ({', '.join(VERIFIED)} have one)"
        )
        raise TemplateError(
            f"{directory}: its chat template is not append-only: {'; '.join(breaks)} ({fix}; "
            "`gyre model verify-template` shows where it breaks)"
        )
    template = build(verified.chat_template, strict=True)
    name = shipped.name if shipped is not None else template_name(tokenizer.chat_template or "", eot, parser)
    template.substitution = Substitution(verified.family, name, tuple(breaks))
    return template


def _family(tokenizer: Tokenizer, required: bool) -> ChatFamily | None:
    """The directory's chat family; when end-of-turn and parser are both given, None if unrecognized."""
    try:
        return detect_family(tokenizer)
    except ValueError:
        if required:
            raise
        return None


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
    "TEMPLATE_MODES",
    "VERIFIED",
    "AppendOnlyReport",
    "ChatTemplate",
    "HFChatTemplate",
    "Substitution",
    "TemplateError",
    "TemplateMode",
    "VerifiedTemplate",
    "probe_conversation",
    "template_for_family",
    "template_for_model",
]
