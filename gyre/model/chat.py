"""Rendering a chat template exactly as transformers does (its own Jinja environment and filters).

Hugging Face chat templates are Jinja programs written against transformers' sandboxed environment
(`tojson` with its arguments, `raise_exception`, `strftime_now`, loop controls). Rendering with
transformers' renderer, not a look-alike, keeps the recorded prompt identical to what
`tokenizer.apply_chat_template` gives for the same conversation. Only the renderer is imported
(no tokenizer class, no model code), and only on first use: importing transformers costs about a
CPU-second, which processes that load trees but never render (the packer) should not pay.

    text = render_chat(template, messages, tools=None, add_generation_prompt=True, variables={"eos_token": "<|im_end|>"})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    variables: Mapping[str, Any] | None = None,
) -> str:
    """The text `template` renders for one conversation (`variables`: special tokens, template kwargs)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    conversation: list[dict[str, Any]] = [dict(m) for m in messages]
    out: Any = render_jinja_template(  # (rendered conversations, generation indices)
        conversations=[conversation],
        tools=[dict(t) for t in tools] if tools else None,
        chat_template=template,
        add_generation_prompt=add_generation_prompt,
        **dict(variables or {}),
    )
    text = out[0][0]
    assert isinstance(text, str)
    return text
