"""Verified append-only chat templates, one per family, that stand in for a checkpoint's own template
when that one is not append-only (`proxy.template: auto`, the default).

Training on a trajectory tree needs every call's prompt to be the previous call's prompt plus new
tokens (TITO: the recorded tokens are what the model was sampled on, and a tree shares each prefix
once). Templates checkpoints ship often rewrite earlier turns instead — Qwen3's drops the reasoning of
every turn before the last user query — so each call's prompt would be a different sequence and the
trajectory could only be trained call by call, its shared context recomputed per call. A registry
template renders what the shipped template renders wherever that is possible without rewriting:
identical system turn, tool definitions, turn markers, tool-call and tool-result syntax, and the same
generation prompt, so the turn the model is sampled on looks as it was trained to look. What it
changes is stated per family in `VerifiedTemplate.differences`; `gyre model verify-template DIR`
shows, for a directory, where its template breaks and where the last-turn prompts of the two differ.

The templates, and what each stands in for, are the families' modules (gyre/model/families/<family>.py, the
templates `gyre model init` writes): a family with `stands_in_for` is a verified template here. The contract
test (tests/unit/trajectory/test_template_registry.py) checks each is append-only over the verification suite
and compares it with the shipped template it stands in for (tests/fixtures/templates/shipped_*.json). To add
one: the family's module (gyre/model/families/base.py says how) and a fixture of the shipped template it
replaces, with its source.

    verified = VERIFIED["qwen3"]
    verified.chat_template, verified.differences
"""

from __future__ import annotations

from dataclasses import dataclass

from gyre.model.families import FAMILIES


@dataclass(frozen=True, slots=True)
class VerifiedTemplate:
    family: str
    """A chat family of `gyre.model.families.FAMILIES`; its template is the verified one."""
    stands_in_for: str
    """The shipped templates it replaces."""
    differences: str
    """Where its renders differ from the shipped template's, and why that is the trade."""

    @property
    def chat_template(self) -> str:
        return FAMILIES[self.family].chat_template


@dataclass(frozen=True, slots=True)
class Substitution:
    """A model's own template was not append-only, and the registry's template of its family renders
    in its place (recorded by the proxy in its stats and logged once at start)."""

    family: str
    shipped: str
    """The name (`hf-<digest>`) of the model's own template."""
    shipped_breaks: tuple[str, ...]
    """Where the model's own template failed the append-only check."""


VERIFIED: dict[str, VerifiedTemplate] = {
    family.name: VerifiedTemplate(family.name, family.stands_in_for, family.differences)
    for family in FAMILIES.values()
    if family.stands_in_for is not None
}
"""family → its verified template: the families of the registry (gyre/model/families/) that stand in for a
shipped template, in its order."""
