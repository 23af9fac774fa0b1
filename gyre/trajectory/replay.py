"""Replay captured request bodies into a trajectory tree (behind `gyre trace replay`).

Input: request bodies as a harness sent them — Anthropic Messages, OpenAI Chat or Responses
JSON, one per file, a JSON array, or JSONL — either bare or as an envelope
`{"headers": {...}, "body": {...}, "response": {...}, "path": "/v1/messages"}` (what
tests/support/anthropic_capture.py writes). Headers matter to profiles (Claude Code marks
sub-agents with one); a response, when present, becomes the output of its request.

Replay treats every assistant turn found in a history as the model output of the request that
ended just before it (recorded as engine-sampled, log-prob 0), so a session's histories alone
rebuild its tree. The summary says how the session maps into a tree: roots by agent kind, nodes,
leaves by class, unique tokens against tokens if every path were expanded, and what admission
would take.

Archived trees (`runs/<run>/archive/trees/<execution>.tree.gz`, written when a trained group leaves
Redis) are summarized the same way from what the proxy recorded (`summarize_archive`), with the
profile and chat template stored with each tree and its recorded call count as `requests`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gyre.trajectory.admission import admit
from gyre.trajectory.anthropic import from_anthropic, message_from_anthropic
from gyre.trajectory.archive import TREE_SUFFIX, archived_trees, read_archived_tree
from gyre.trajectory.messages import Api, Message, ModelRequest, RequestError
from gyre.trajectory.node import CallMeta
from gyre.trajectory.openai_chat import from_openai_chat
from gyre.trajectory.openai_responses import from_openai_responses
from gyre.trajectory.profiles import HarnessProfile
from gyre.trajectory.stats import tree_stats
from gyre.trajectory.templates.base import ChatTemplate
from gyre.trajectory.tree import TrajectoryTree

_CONVERTERS = {
    Api.ANTHROPIC: from_anthropic,
    Api.OPENAI_CHAT: from_openai_chat,
    Api.OPENAI_RESPONSES: from_openai_responses,
}


@dataclass(slots=True)
class CapturedCall:
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    response: dict[str, Any] | None = None
    path: str = ""
    source: str = ""


def load_captures(paths: Iterable[Path]) -> list[CapturedCall]:
    """Read bodies or envelopes from files (JSON object, JSON array or JSONL), in order."""
    calls: list[CapturedCall] = []
    for path in paths:
        text = Path(path).read_text()
        try:
            data = json.loads(text)
            objects = data if isinstance(data, list) else [data]
        except ValueError:
            objects = [json.loads(line) for line in text.splitlines() if line.strip()]
        for i, obj in enumerate(objects):
            if not isinstance(obj, dict):
                raise ValueError(f"{path}: record {i} is not a JSON object")
            source = f"{path}:{i}"
            if isinstance(obj.get("body"), dict):
                calls.append(
                    CapturedCall(
                        obj["body"],
                        {str(k).lower(): str(v) for k, v in (obj.get("headers") or {}).items()},
                        obj.get("response"),
                        str(obj.get("path") or ""),
                        source,
                    )
                )
            else:
                calls.append(CapturedCall(obj, source=source))
    return calls


def detect_api(call: CapturedCall, profile: HarnessProfile) -> Api:
    """The API of a captured body: the path if known, the profile if it speaks one, else the shape."""
    if "/chat/completions" in call.path:
        return Api.OPENAI_CHAT
    if "/responses" in call.path:
        return Api.OPENAI_RESPONSES
    if "/messages" in call.path:
        return Api.ANTHROPIC
    if len(profile.apis) == 1:
        return profile.apis[0]
    body = call.body
    if "input" in body or "instructions" in body:
        return Api.OPENAI_RESPONSES
    messages = body.get("messages")
    for m in messages if isinstance(messages, list) else []:
        if isinstance(m, dict) and (m.get("role") in ("tool", "developer") or "tool_calls" in m):
            return Api.OPENAI_CHAT
    if any(isinstance(t, dict) and "function" in t for t in body.get("tools") or []):
        return Api.OPENAI_CHAT
    return Api.ANTHROPIC


def response_message(call: CapturedCall, api: Api) -> Message | None:
    """The assistant message of a captured response, if the envelope has one."""
    response = call.response
    if not response:
        return None
    if api is Api.ANTHROPIC:
        return message_from_anthropic(response.get("content") or [], "assistant", "response.content")
    if api is Api.OPENAI_CHAT:
        choice = (response.get("choices") or [{}])[0]
        body = {"messages": [{"role": "user", "content": ""}, choice.get("message") or {}]}
        return from_openai_chat(body).messages[-1]
    body = {"input": [{"type": "message", "role": "user", "content": ""}, *(response.get("output") or [])]}
    return from_openai_responses(body).messages[-1]


def replay(
    calls: Iterable[CapturedCall],
    template: ChatTemplate,
    profile: HarnessProfile,
    execution_id: str = "replay",
) -> TrajectoryTree:
    """Build the tree of a captured session."""
    tree = TrajectoryTree(execution_id, template, profile)
    for k, call in enumerate(calls):
        api = detect_api(call, profile)
        try:
            request = _CONVERTERS[api](call.body, call.headers)
        except RequestError as e:
            raise ValueError(f"{call.source}: {e}") from e
        messages = request.messages
        end = len(messages) - 1 if messages and messages[-1].role == "assistant" else len(messages)
        matched = tree.prepare(request.with_messages(messages[:end])).num_matched_messages
        for j in range(max(matched, 1), len(messages)):
            if messages[j].role == "assistant" and messages[j - 1].role != "assistant":
                _record(tree, request.with_messages(messages[:j]), messages[j], f"replay-{k}-{j}")
        reply = response_message(call, api)
        if reply is not None and end == len(messages) and reply.blocks:
            _record(tree, request, reply, f"replay-{k}")
    return tree


def summarize(
    tree: TrajectoryTree, num_requests: int, j_max: int = 5, seed: int = 0, template_name: str | None = None
) -> dict[str, Any]:
    """The JSON summary `gyre trace replay` prints (`template_name` for a read-only tree)."""
    stats = tree_stats(tree)
    admitted = admit(tree, j_max=j_max, seed=seed)
    return {
        "execution_id": tree.execution_id,
        "profile": tree.profile.name,
        "template": template_name if template_name is not None else tree.template.name,
        "requests": num_requests,
        **stats.as_dict(),
        "admitted": {
            "j_max": j_max,
            "seed": seed,
            "trajectories": len(admitted),
            "targets": sum(a.num_targets for a in admitted),
            "by_class": dict(Counter(str(a.leaf_class) for a in admitted)),
        },
    }


def is_archive_input(path: Path) -> bool:
    """A directory (a run's, or its archive) or one archived tree file, rather than captured bodies."""
    return Path(path).is_dir() or Path(path).name.endswith(TREE_SUFFIX)


def archive_files(paths: Iterable[Path], execution_id: str | None = None) -> list[Path]:
    """The archived tree files named by `paths` (tree files, archive or run directories), in order."""
    files: list[Path] = []
    for path in paths:
        found = list(archived_trees(path).values()) if Path(path).is_dir() else [Path(path)]
        if Path(path).is_dir() and not found:
            raise ValueError(f"{path}: no archived trees (looked in trees/ and archive/trees/)")
        files += found
    if execution_id is not None:
        files = [f for f in files if f.name == f"{execution_id}{TREE_SUFFIX}"]
        if not files:
            raise ValueError(f"execution {execution_id!r} is not in the archive")
    return files


def summarize_archive(
    files: Iterable[Path], profile: HarnessProfile | None = None, j_max: int = 5, seed: int = 0
) -> dict[str, Any]:
    """Summaries of archived trees: one tree's summary, or `{"num_trees", "totals", "trees"}` for several."""
    summaries = []
    for path in files:
        archived = read_archived_tree(path)
        tree = archived.tree(None, profile)
        num_calls = int(archived.meta.get("num_calls", 0))
        summary = summarize(
            tree, num_calls, j_max=j_max, seed=seed, template_name=archived.meta.get("template", "")
        )
        summaries.append(
            {
                **summary,
                "policy_version": int(archived.meta.get("policy_version", 0)),
                "closed": tree.closed,
                "file": str(path),
            }
        )
    if len(summaries) == 1:
        return summaries[0]
    totals = {
        key: sum(int(s[key]) for s in summaries)
        for key in ("requests", "nodes", "unique_tokens", "sampled_tokens", "expanded_tokens")
    }
    totals["admitted_trajectories"] = sum(s["admitted"]["trajectories"] for s in summaries)
    totals["admitted_targets"] = sum(s["admitted"]["targets"] for s in summaries)
    return {"num_trees": len(summaries), "totals": totals, "trees": summaries}


def _record(tree: TrajectoryTree, request: ModelRequest, output: Message, request_id: str) -> None:
    prepared = tree.prepare(request)
    ids = tree.template.encode_output(output)
    tree.commit(
        prepared, ids, np.zeros(len(ids), np.float32), CallMeta(request_id=request_id), output_message=output
    )


def summary_json(summary: Mapping[str, Any]) -> str:
    return json.dumps(summary, indent=2, sort_keys=False)
