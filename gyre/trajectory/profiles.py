"""Harness profiles: data that classifies requests and defines the root key of the tree.

A profile is a list of rules, each a set of conditions on the request (headers, system prompt,
the last user message, the first user message, the API, max_tokens, a structured-output request)
and the labels it sets: agent kind (`main` / `sub`), request kind (`task` / `summary` / `side`) and
free tags. For each label the first rule that matches and sets it wins; nothing matched means
main/task, so an unknown shape never fails. A `side` request (a probe, a session title) is served
and recorded like any call but its leaf has no admission class: it is never trained.

Matching (`match_message`, `Classification.system`) sees content normalized by the profile, the
rendered prompt sees it as sent: `volatile_system` lists patterns of system blocks that change while
the agent stays the same (Claude Code's billing line) — dropped from the root key only;
`volatile_text` lists patterns cut out of user/tool text before a message is matched (Claude Code's
`<system-reminder>` blocks). `strict` matching uses neither (exact content, transport fields aside).

Adding a profile: write a `HarnessProfile` (in code, or `HarnessProfile.from_dict` of YAML/JSON
data) and add it to `PROFILES`; tests/unit/trajectory/test_profiles.py runs the contract over all.

Facts behind `claude_code` (observed on Claude Code 2.1.332): `system` is three text blocks, the
first a billing line with `cc_version=…` whose suffix changes with the first user message and, for
a sub-agent, `cc_is_subagent=true`; sub-agent requests carry `x-claude-code-agent-id` and a system
prompt starting "You are an agent for Claude Code"; a compaction request appends a text block
beginning "CRITICAL: Respond with TEXT ONLY" to the last user message; the request after
compaction starts with "This session is being continued from a previous conversation"; user turns
carry `<system-reminder>` blocks whose content changes between requests. Side calls (read in the
2.1.332 binary, not seen in `-p` runs): model validation asks `max_tokens: 1`, the session title
and other helpers ask for a JSON-schema answer (`outputFormat: json_schema`, `toolFreeHelper`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from gyre.trajectory.messages import Api, Block, Message, ModelRequest, TextBlock, ToolResultBlock


class AgentKind(StrEnum):
    MAIN = "main"
    SUB = "sub"


class RequestKind(StrEnum):
    TASK = "task"
    SUMMARY = "summary"
    SIDE = "side"
    """Not a policy turn of the agent (a probe, a session title): recorded, never admitted."""


class LeafClass(StrEnum):
    """Admission classes in priority order (`LEAF_PRIORITY`); `side` is never admitted."""

    MAIN = "main"
    MAIN_SUMMARY = "main_summary"
    SUB_AGENT = "sub_agent"
    SUB_AGENT_SUMMARY = "sub_agent_summary"
    SIDE = "side"

    @classmethod
    def of(cls, agent: AgentKind, request: RequestKind) -> LeafClass:
        if request is RequestKind.SIDE:
            return cls.SIDE
        if agent is AgentKind.MAIN:
            return cls.MAIN if request is RequestKind.TASK else cls.MAIN_SUMMARY
        return cls.SUB_AGENT if request is RequestKind.TASK else cls.SUB_AGENT_SUMMARY


LEAF_PRIORITY: tuple[LeafClass, ...] = (
    LeafClass.MAIN,
    LeafClass.MAIN_SUMMARY,
    LeafClass.SUB_AGENT,
    LeafClass.SUB_AGENT_SUMMARY,
)
"""Classes admission draws from, highest first (the paper's Eq. 4); `side` leaves are not among them."""


@dataclass(frozen=True, slots=True)
class Condition:
    """All fields that are set must hold. Text tests look at text blocks only."""

    header_present: str | None = None
    header_equals: tuple[str, str] | None = None
    system_contains: str | None = None
    system_startswith: str | None = None
    """Some system block starts with this (after leading whitespace)."""
    last_user_startswith: str | None = None
    """Some text block of the last user message starts with this."""
    first_user_startswith: str | None = None
    """Some text block of the first user message starts with this."""
    api: Api | None = None
    max_tokens_at_most: int | None = None
    """The request's max_tokens is set and at most this (probe calls ask for one token)."""
    structured_output: bool | None = None
    """The request asks for a JSON-schema answer (or explicitly does not)."""

    def matches(self, request: ModelRequest) -> bool:
        h = request.headers
        if self.header_present is not None and self.header_present.lower() not in h:
            return False
        if self.header_equals is not None:
            name, value = self.header_equals
            if h.get(name.lower(), "").strip().lower() != value.lower():
                return False
        if self.system_contains is not None and not any(self.system_contains in s for s in request.system):
            return False
        if self.system_startswith is not None and not any(
            s.lstrip().startswith(self.system_startswith) for s in request.system
        ):
            return False
        if self.last_user_startswith is not None and not _user_text_startswith(
            request, -1, self.last_user_startswith
        ):
            return False
        if self.first_user_startswith is not None and not _user_text_startswith(
            request, 0, self.first_user_startswith
        ):
            return False
        if self.max_tokens_at_most is not None and not (
            request.sampling.max_tokens is not None and request.sampling.max_tokens <= self.max_tokens_at_most
        ):
            return False
        if self.structured_output is not None and request.structured_output != self.structured_output:
            return False
        return self.api is None or request.api == self.api


@dataclass(frozen=True, slots=True)
class Rule:
    """If any condition matches, set the given labels."""

    when: tuple[Condition, ...]
    agent_kind: AgentKind | None = None
    request_kind: RequestKind | None = None
    tag: str | None = None


@dataclass(frozen=True, slots=True)
class Classification:
    agent_kind: AgentKind
    request_kind: RequestKind
    system: str
    """The system prompt the tree keys the root by: blocks joined by newlines, volatile ones dropped
    (loose matching) or all of them (strict)."""
    rendered_system: str = ""
    """The system prompt as sent (all blocks): what a new root is rendered from."""
    tags: frozenset[str] = frozenset()

    @property
    def leaf_class(self) -> LeafClass:
        return LeafClass.of(self.agent_kind, self.request_kind)


@dataclass(frozen=True, slots=True)
class HarnessProfile:
    name: str
    description: str
    rules: tuple[Rule, ...] = ()
    volatile_system: tuple[str, ...] = ()
    """Regexes; a system block matching one (re.search) is left out of the root key (loose matching)."""
    volatile_text: tuple[str, ...] = ()
    """Regexes cut out of user/tool text before a message is matched (loose matching)."""
    apis: tuple[Api, ...] = tuple(Api)
    """APIs this harness speaks (used by `gyre trace replay` to read bodies)."""
    strict: bool = False
    """Exact matching: no volatile content is normalized away (see the module docstring)."""
    _volatile: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)
    _volatile_text: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_volatile", tuple(re.compile(p) for p in self.volatile_system))
        text = "|".join(f"(?:{p})" for p in self.volatile_text)
        object.__setattr__(self, "_volatile_text", re.compile(text) if text else None)

    def with_matching(self, strict: bool) -> HarnessProfile:
        """This profile with strict or loose matching."""
        return replace(self, strict=strict)

    def match_message(self, message: Message) -> Message:
        """The form of `message` that is matched against the tree (itself under strict matching, or
        when nothing volatile is in it)."""
        pattern = self._volatile_text
        if self.strict or pattern is None or message.role == "assistant":
            return message
        blocks: list[Block] = []
        changed = False
        for b in message.blocks:
            if isinstance(b, TextBlock) and pattern.search(b.text):
                changed = True
                text = pattern.sub("", b.text)
                if text.strip():
                    blocks.append(TextBlock(text))
            elif isinstance(b, ToolResultBlock) and pattern.search(b.content):
                changed = True
                blocks.append(ToolResultBlock(b.tool_use_id, pattern.sub("", b.content), b.is_error))
            else:
                blocks.append(b)
        return Message(message.role, tuple(blocks)) if changed else message

    def classify(self, request: ModelRequest) -> Classification:
        agent: AgentKind | None = None
        kind: RequestKind | None = None
        tags: set[str] = set()
        for rule in self.rules:
            if not any(c.matches(request) for c in rule.when):
                continue
            if agent is None and rule.agent_kind is not None:
                agent = rule.agent_kind
            if kind is None and rule.request_kind is not None:
                kind = rule.request_kind
            if rule.tag is not None:
                tags.add(rule.tag)
        rendered = "\n".join(request.system)
        system = (
            rendered
            if self.strict
            else "\n".join(s for s in request.system if not any(p.search(s) for p in self._volatile))
        )
        return Classification(
            agent or AgentKind.MAIN, kind or RequestKind.TASK, system, rendered, frozenset(tags)
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HarnessProfile:
        """Build from plain data: `{"name", "description", "volatile_system": [...], "apis": [...],
        "rules": [{"when": [{condition fields}], "agent_kind"?, "request_kind"?, "tag"?}]}`."""
        rules = []
        for r in data.get("rules", []):
            conditions = []
            for c in r["when"]:
                c = dict(c)
                if "header_equals" in c:
                    c["header_equals"] = tuple(c["header_equals"])
                if "api" in c:
                    c["api"] = Api(c["api"])
                conditions.append(Condition(**c))
            rules.append(
                Rule(
                    tuple(conditions),
                    AgentKind(r["agent_kind"]) if r.get("agent_kind") else None,
                    RequestKind(r["request_kind"]) if r.get("request_kind") else None,
                    r.get("tag"),
                )
            )
        return cls(
            name=data["name"],
            description=data.get("description", ""),
            rules=tuple(rules),
            volatile_system=tuple(data.get("volatile_system", ())),
            volatile_text=tuple(data.get("volatile_text", ())),
            apis=tuple(Api(a) for a in data.get("apis", [a.value for a in Api])),
        )


def _user_text_startswith(request: ModelRequest, index: int, prefix: str) -> bool:
    users = [m for m in request.messages if m.role == "user"]
    if not users:
        return False
    return any(isinstance(b, TextBlock) and b.text.lstrip().startswith(prefix) for b in users[index].blocks)


CLAUDE_CODE = HarnessProfile.from_dict(
    {
        "name": "claude_code",
        "description": "Claude Code (Anthropic Messages API), rules observed on 2.1.332.",
        "apis": ["anthropic"],
        "volatile_system": [r"^x-anthropic-billing-header:"],
        "volatile_text": [r"<system-reminder>[\s\S]*?</system-reminder>\s*"],
        "rules": [
            {
                "when": [
                    {"header_present": "x-claude-code-agent-id"},
                    {"system_contains": "cc_is_subagent=true"},
                    {"system_startswith": "You are an agent for Claude Code"},
                ],
                "agent_kind": "sub",
            },
            {
                "when": [{"last_user_startswith": "CRITICAL: Respond with TEXT ONLY"}],
                "request_kind": "summary",
            },
            {
                "when": [{"max_tokens_at_most": 1}, {"structured_output": True}],
                "request_kind": "side",
            },
            {
                "when": [
                    {"first_user_startswith": "This session is being continued from a previous conversation"}
                ],
                "tag": "post_compaction",
            },
        ],
    }
)

_LABEL_HEADER_RULES: list[dict[str, Any]] = [
    {"when": [{"header_equals": ["x-gyre-agent", "sub"]}], "agent_kind": "sub"},
    {"when": [{"header_equals": ["x-gyre-request", "summary"]}], "request_kind": "summary"},
    {"when": [{"header_equals": ["x-gyre-request", "side"]}], "request_kind": "side"},
]

GENERIC = HarnessProfile.from_dict(
    {
        "name": "generic",
        "description": "Any harness that labels its calls with x-gyre-agent: main|sub and x-gyre-request: task|summary|side.",
        "rules": _LABEL_HEADER_RULES,
    }
)

# Codex: the compaction prompt and the prefix of the post-compaction summary are strings found in
# the Codex 0.171.0 binary; that it sends the first as the last user message of a summary request
# to a custom provider is an assumption, not an observation. Sub-agents (`spawn_agent`) carry no
# known marker, so they need the generic labels.
CODEX = HarnessProfile.from_dict(
    {
        "name": "codex",
        "description": "Codex CLI (OpenAI Responses API; system prompt as `instructions` or a developer message).",
        "apis": ["openai_responses"],
        "rules": [
            *_LABEL_HEADER_RULES,
            {
                "when": [{"last_user_startswith": "You are performing a CONTEXT CHECKPOINT COMPACTION"}],
                "request_kind": "summary",
            },
            {
                "when": [{"first_user_startswith": "Another language model started to solve this problem"}],
                "tag": "post_compaction",
            },
        ],
    }
)

PROFILES: dict[str, HarnessProfile] = {p.name: p for p in (CLAUDE_CODE, GENERIC, CODEX)}


def get_profile(name: str) -> HarnessProfile:
    """A registered profile; `ValueError` lists the known names."""
    if name not in PROFILES:
        raise ValueError(f"unknown harness profile {name!r}; choose one of {sorted(PROFILES)}")
    return PROFILES[name]
