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

The templates themselves are the families' files (`gyre/model/templates/<family>.jinja`, the ones
`gyre model init` writes); the contract test (tests/unit/trajectory/test_template_registry.py) checks
each is append-only over the verification suite and compares it with the shipped template it stands
in for (tests/fixtures/templates/shipped_*.json). To add one: write the family's template, add a
`VerifiedTemplate` here, and a fixture of the shipped template it replaces, with its source.

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
    t.family: t
    for t in (
        VerifiedTemplate(
            family="qwen3",
            stands_in_for="the template of the Qwen3 checkpoints (thinking mode), e.g. Qwen/Qwen3-8B",
            differences=(
                "Earlier turns keep their reasoning: the shipped template renders <think> only for assistant "
                "turns after the last user query, so each new user turn rewrites every earlier turn; here an "
                "assistant turn keeps the <think> block it was sampled with. Within a tool loop (all turns "
                "after one user query: an agent's usual trajectory) the last-turn prompt is identical to the "
                "shipped one; after a second user query it holds the earlier turns' reasoning too, which the "
                "shipped template would have dropped. An assistant turn with an empty reasoning keeps its "
                "empty <think> block (shipped: only on the last turn), and with enable_thinking=false every "
                "assistant turn starts with the empty block its generation prompt held (shipped: dropped on "
                "earlier turns). A tool call is rendered as the model emitted it."
            ),
        ),
        VerifiedTemplate(
            family="qwen2",
            stands_in_for="the template of the Qwen2.5 checkpoints, e.g. Qwen/Qwen2.5-7B-Instruct (append-only itself)",
            differences=(
                "None in what it renders for a conversation the proxy builds, except that a tool call is "
                "rendered as the model emitted it (shipped: re-serialized with tojson)."
            ),
        ),
        VerifiedTemplate(
            family="llama3",
            stands_in_for="the template of the Llama 3.1 / 3.2 / 3.3 Instruct checkpoints, e.g. "
            "meta-llama/Llama-3.1-8B-Instruct",
            differences=(
                "Tool definitions go into the system turn, worded as the shipped template words them there "
                "with tools_in_user_message=false; by default it prefixes them to the first user message, "
                "which would make the system turn and its tools no segment of their own (a sub-agent's root "
                "could not be shared). Without tools, the system and user turns are identical. An assistant "
                "turn keeps its text beside its tool calls, may hold several calls (one per line) and is not "
                "trimmed: the shipped template renders one call and no text (it raises on parallel calls) "
                "and trims text, which rewrites a turn that was sampled otherwise. Builtin tools "
                "(<|python_tag|>, <|eom_id|>) are not rendered."
            ),
        ),
    )
}
