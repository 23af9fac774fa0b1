"""Harness profiles: data that classifies requests and defines the root key of the tree.

A profile is a list of rules, each a set of conditions on the request (headers, system prompt,
the last user message, the first user message, the API) and the labels it sets: agent kind
(`main` / `sub`), request kind (`task` / `summary`) and free tags. For each label the first rule
that matches and sets it wins; nothing matched means main/task, so an unknown shape never fails.
`volatile_system` lists patterns of system blocks that change while the agent stays the same
(Claude Code's billing line); they are dropped from the root key and from the rendered prompt.

Adding a profile: write a `HarnessProfile` (in code, or `HarnessProfile.from_dict` of YAML/JSON
data) and add it to `PROFILES`; tests/unit/trajectory/test_profiles.py runs the contract over all.

Facts behind `claude_code` (observed on Claude Code 2.1.332): `system` is three text blocks, the
first a billing line with `cc_version=…` whose suffix changes with the first user message and, for
a sub-agent, `cc_is_subagent=true`; sub-agent requests carry `x-claude-code-agent-id` and a system
prompt starting "You are an agent for Claude Code"; a compaction request appends a text block
beginning "CRITICAL: Respond with TEXT ONLY" to the last user message; the request after
compaction starts with "This session is being continued from a previous conversation".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gyre.trajectory.messages import Api, ModelRequest, TextBlock


class AgentKind(StrEnum):
    MAIN = "main"
    SUB = "sub"


class RequestKind(StrEnum):
    TASK = "task"
    SUMMARY = "summary"


class LeafClass(StrEnum):
    """Admission priority classes, highest first (`LEAF_PRIORITY`)."""

    MAIN = "main"
    MAIN_SUMMARY = "main_summary"
    SUB_AGENT = "sub_agent"
    SUB_AGENT_SUMMARY = "sub_agent_summary"

    @classmethod
    def of(cls, agent: AgentKind, request: RequestKind) -> LeafClass:
        if agent is AgentKind.MAIN:
            return cls.MAIN if request is RequestKind.TASK else cls.MAIN_SUMMARY
        return cls.SUB_AGENT if request is RequestKind.TASK else cls.SUB_AGENT_SUMMARY


LEAF_PRIORITY: tuple[LeafClass, ...] = tuple(LeafClass)


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
    """The system prompt the tree keys and renders: blocks joined by newlines, volatile ones dropped."""
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
    """Regexes; a system block matching one (re.search) is dropped."""
    apis: tuple[Api, ...] = tuple(Api)
    """APIs this harness speaks (used by `gyre trace replay` to read bodies)."""
    _volatile: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_volatile", tuple(re.compile(p) for p in self.volatile_system))

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
        system = "\n".join(s for s in request.system if not any(p.search(s) for p in self._volatile))
        return Classification(agent or AgentKind.MAIN, kind or RequestKind.TASK, system, frozenset(tags))

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
]

GENERIC = HarnessProfile.from_dict(
    {
        "name": "generic",
        "description": "Any harness that labels its calls with x-gyre-agent: main|sub and x-gyre-request: task|summary.",
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
