"""Chat-format families, by name: the registry of the chat templates a model directory may carry.

    family = FAMILIES["qwen3"]
    family = detect_family(tokenizer)           # from the template the directory ships

`gyre model init` writes a family into a new model directory; the proxy recognizes the family of any
directory from its chat template, trying the families in the registry's order (most specific first), and
the families with `stands_in_for` are the verified templates of `proxy.template: auto`
(gyre.trajectory.templates.registry). One module per family; see `base.py` for what a family says and how
to add one.
"""

from __future__ import annotations

from gyre.model.families import chatml, llama3, qwen2, qwen3
from gyre.model.families.base import ChatFamily
from gyre.model.tokenizer import Tokenizer

FAMILIES: dict[str, ChatFamily] = {
    family.name: family for family in (llama3.FAMILY, chatml.FAMILY, qwen3.FAMILY, qwen2.FAMILY)
}
"""name → family, in detection order: a family comes before every family whose marker its templates contain
too (chatml's template holds `<think>`, qwen3's marker; qwen3's holds `<tool_call>`, qwen2's)."""


def detect_family(tokenizer: Tokenizer) -> ChatFamily:
    """The first family of the registry whose marker the directory's chat template contains, else a catch-all
    family whose end of turn it uses."""
    template = tokenizer.chat_template
    if not template:
        raise ValueError(
            f"{tokenizer.source}: tokenizer_config.json has no chat_template; the proxy renders calls with the "
            "model's own template (add one, e.g. from `gyre model init`)"
        )
    for family in FAMILIES.values():
        if family.marker in template and tokenizer.has_token(family.end_of_turn):
            return family
    for family in FAMILIES.values():
        if family.catch_all and family.end_of_turn in template and tokenizer.has_token(family.end_of_turn):
            return family
    raise ValueError(
        f"{tokenizer.source}: the chat template matches no known family ({', '.join(FAMILIES)}); "
        "set proxy.end_of_turn and proxy.tool_call_parser"
    )


__all__ = ["FAMILIES", "ChatFamily", "detect_family"]
