"""Chat templates: the registry of message → token renderers the trajectory tree records with.

    template = make_template("embedded")           # the embedded byte-level model
    template = HFChatTemplate(hf_tokenizer, end_of_turn="<|im_end|>")   # a real model's template

Adding a template: subclass `ChatTemplate` (templates/base.py), set `name`, add it to
`TEMPLATES`; the contract test in tests/unit/trajectory/test_templates.py checks every entry that
can be built without arguments (the append-only property and the assistant-turn split).
"""

from __future__ import annotations

from typing import Any

from gyre.trajectory.templates.base import AppendOnlyReport, ChatTemplate, TemplateError
from gyre.trajectory.templates.embedded import EmbeddedTemplate
from gyre.trajectory.templates.hf import HFChatTemplate

TEMPLATES: dict[str, type[ChatTemplate]] = {
    EmbeddedTemplate.name: EmbeddedTemplate,
    HFChatTemplate.name: HFChatTemplate,
}


def make_template(name: str, **kwargs: Any) -> ChatTemplate:
    """Build a registered template by name; `ValueError` lists the known names."""
    if name not in TEMPLATES:
        raise ValueError(f"unknown chat template {name!r}; choose one of {sorted(TEMPLATES)}")
    return TEMPLATES[name](**kwargs)


__all__ = [
    "TEMPLATES",
    "AppendOnlyReport",
    "ChatTemplate",
    "EmbeddedTemplate",
    "HFChatTemplate",
    "TemplateError",
    "make_template",
]
