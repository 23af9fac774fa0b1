"""The trajectory tree: two-phase insert, matching, tool-call restoration, concurrency, codec."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre.trajectory import (
    CallMeta,
    RequestError,
    TrajectoryTree,
    TreeClosedError,
    encode_node,
    from_anthropic,
    from_openai_chat,
    get_profile,
    template_for_family,
)
from gyre.trajectory.anthropic import to_anthropic_content
from gyre.trajectory.codec import decode_node
from gyre.trajectory.node import Node, NodeKind
from gyre.trajectory.stats import tree_stats
from gyre.trajectory.tree import _common_prefix
from gyre.v1 import trajectory_pb2

from .harness_sim import CALL_END, CALL_START, IM_END, TOOLS, run_script

SYSTEM = [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.4e6; cc_entrypoint=sdk-cli;"},
    {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
]


def _tree(profile: str = "claude_code") -> TrajectoryTree:
    return TrajectoryTree("e1", template_for_family("chatml"), get_profile(profile))


def _body(messages: list[dict[str, object]], system: list[dict[str, str]] | None = None) -> dict[str, object]:
    return {"model": "m", "max_tokens": 100, "system": system or SYSTEM, "tools": TOOLS, "messages": messages}


def _out(text: str, call: dict[str, object] | None = None, raw: str | None = None) -> list[int]:
    ids = list(text.encode())
    if call is not None or raw is not None:
        ids += [CALL_START, *(raw if raw is not None else json.dumps(call)).encode(), CALL_END]
    return [*ids, IM_END]


def _commit(tree: TrajectoryTree, body: dict[str, object], ids: list[int]) -> object:
    prepared = tree.prepare(from_anthropic(body))
    return tree.commit(prepared, ids, [-0.5] * len(ids), CallMeta(request_id="r", policy_version=1))


def test_prepare_changes_nothing_and_input_ids_are_the_prompt() -> None:
    tree = _tree()
    prepared = tree.prepare(from_anthropic(_body([{"role": "user", "content": "hi"}])))
    assert tree.nodes == {} and tree.roots == {}
    template = tree.template
    # The prompt is the system as sent (billing line included); only the root key drops it.
    expected = template.render_system("\n".join(b["text"] for b in SYSTEM), prepared.request.tools)
    expected += template.render_message(prepared.request.messages[0]) + template.render_generation_prompt()
    assert prepared.input_ids.tolist() == expected
    assert prepared.num_matched_messages == 0 and prepared.num_new_tokens == len(expected) - len(
        template.render_generation_prompt()
    )


def test_output_node_holds_exact_engine_ids_and_next_prompt_reuses_them() -> None:
    tree = _tree()
    ids = _out("Let me look.", {"name": "Bash", "arguments": {"description": "list", "command": "ls"}})
    result = _commit(tree, _body([{"role": "user", "content": "hi"}]), ids)
    leaf = result.output_node  # type: ignore[attr-defined]
    assert leaf.kind is NodeKind.OUTPUT and leaf.num_sampled == len(ids)
    assert np.asarray(leaf.token_ids)[leaf.sampled].tolist() == ids
    assert leaf.logprobs.tolist() == [-0.5] * len(ids)
    content = to_anthropic_content(result.output)  # type: ignore[attr-defined]
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": content[1]["id"], "content": "a b"}],
        },
    ]
    prepared = tree.prepare(from_anthropic(_body(history)))
    assert prepared.num_matched_messages == 2
    prompt = prepared.input_ids.tolist()
    start = len(tree.roots[prepared.root_key].token_ids) + len(tree.nodes[2].token_ids)
    assert prompt[start : start + len(leaf.token_ids)] == leaf.token_ids.tolist()


def test_claude_code_reordered_tool_input_is_restored_without_a_branch() -> None:
    """Sent `description, command`; Claude Code echoes `command, description` as compact JSON."""
    tree = _tree()
    raw = '{"name": "Bash", "arguments": {"description": "Create file", "command": "echo hi > a.txt"}}'
    result = _commit(tree, _body([{"role": "user", "content": "make a.txt"}]), _out("I will.", raw=raw))
    call_id = result.output.tool_calls[0].id  # type: ignore[attr-defined]
    echoed = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "I will."},
            {
                "type": "tool_use",
                "id": call_id,
                "name": "Bash",
                "input": {"command": "echo hi > a.txt", "description": "Create file"},
                "cache_control": {"type": "ephemeral"},
            },
        ],
    }
    tool_result = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "ok"}],
    }
    request = from_anthropic(_body([{"role": "user", "content": "make a.txt"}, echoed, tool_result]))
    assert request.messages[1].digest != result.output_node.digest  # type: ignore[attr-defined]
    prepared = tree.prepare(request)
    assert prepared.num_matched_messages == 2
    assert prepared.matched[-1] is result.output_node  # type: ignore[attr-defined]
    done = tree.commit(prepared, _out("Done."), [0.0] * 6, CallMeta())
    assert [c.kind for c in tree.nodes.values()].count(NodeKind.OUTPUT) == 2
    assert len(result.output_node.child_nodes) == 1  # type: ignore[attr-defined]
    assert request.messages[1].digest in done.changed_nodes[0].aliases
    again = tree.prepare(request)  # the learned alias matches in one step
    assert again.num_matched_messages == 3 and not again.aliases


def test_divergence_branches_and_unmatched_history_attaches_at_the_root() -> None:
    tree = _tree()
    _commit(tree, _body([{"role": "user", "content": "a"}]), _out("one"))
    _commit(tree, _body([{"role": "user", "content": "b"}]), _out("two"))
    _commit(
        tree,
        _body(
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "x"},
                {"role": "user", "content": "c"},
            ]
        ),
        _out("three"),
    )
    root = next(iter(tree.roots.values()))
    assert len(root.child_nodes) == 2  # "a" shared, "b" branches at the root
    a = root.children[from_anthropic(_body([{"role": "user", "content": "a"}])).messages[0].digest]
    assert len(a.child_nodes) == 2  # the engine's "one" and a supplied "x" diverge
    supplied = next(c for c in a.child_nodes if c.kind is NodeKind.MESSAGE)
    assert supplied.sampled is None and supplied.num_sampled == 0


def test_volatile_billing_line_keeps_one_root_and_subagent_gets_its_own() -> None:
    tree = _tree()
    other_billing = [dict(SYSTEM[0], text="x-anthropic-billing-header: cc_version=2.1.332.fff;"), SYSTEM[1]]
    _commit(tree, _body([{"role": "user", "content": "a"}]), _out("one"))
    _commit(tree, _body([{"role": "user", "content": "b"}], other_billing), _out("two"))
    assert len(tree.roots) == 1
    sub_system = [SYSTEM[0], {"type": "text", "text": "You are an agent for Claude Code, a helper."}]
    prepared = tree.prepare(from_anthropic(_body([{"role": "user", "content": "a"}], sub_system)))
    assert prepared.agent_kind == "sub" and prepared.root is None
    tree.commit(prepared, _out("three"), [0.0] * 6, CallMeta())
    assert tree_stats(tree).roots_by_agent == {"main": 1, "sub": 1}
    root_tokens = bytes(t for t in tree.roots[prepared.root_key].token_ids.tolist() if t < 256)
    assert b"x-anthropic-billing-header: cc_version=2.1.332.4e6" in root_tokens, "rendered as sent"


def test_system_reminders_are_cut_for_matching_only_and_strict_matching_keeps_them() -> None:
    def turn(reminder: str) -> list[dict[str, object]]:
        return [
            {"type": "text", "text": f"<system-reminder>{reminder}</system-reminder>\n"},
            {"type": "text", "text": "go"},
        ]

    first = _body([{"role": "user", "content": turn("today is Monday")}])
    for strict, roots, mismatch in ((False, 1, False), (True, 1, True)):
        tree = TrajectoryTree(
            "e1", template_for_family("chatml"), get_profile("claude_code").with_matching(strict)
        )
        result = _commit(tree, first, _out("ok"))
        content = to_anthropic_content(result.output)  # type: ignore[attr-defined]
        again = _body(
            [
                {"role": "user", "content": turn("today is Tuesday")},
                {"role": "assistant", "content": content},
                {"role": "user", "content": "next"},
            ]
        )
        prepared = tree.prepare(from_anthropic(again))
        assert len(tree.roots) == roots and prepared.history_mismatch is mismatch
        # Loose: the changed reminder matches the recorded user turn (its first tokens stay); strict: a
        # new branch holding the new reminder as sent.
        assert prepared.num_matched_messages == (0 if strict else 2)
        tokens = bytes(t for t in prepared.input_ids.tolist() if t < 256)
        assert (b"Tuesday" in tokens) is strict and (b"Monday" in tokens) is not strict


def test_a_rewritten_assistant_message_is_a_history_mismatch() -> None:
    tree = _tree()
    _commit(tree, _body([{"role": "user", "content": "hi"}]), _out("hello"))
    edited = _body(
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "hello, edited"}]},
            {"role": "user", "content": "more"},
        ]
    )
    prepared = tree.prepare(from_anthropic(edited))
    assert prepared.history_mismatch and prepared.num_matched_messages == 1
    honest = _body(
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
            {"role": "user", "content": "more"},
        ]
    )
    assert not tree.prepare(from_anthropic(honest)).history_mismatch


def test_side_requests_are_recorded_with_a_class_that_is_never_admitted() -> None:
    from gyre.trajectory.profiles import LEAF_PRIORITY, LeafClass

    tree = _tree()
    probe = dict(_body([{"role": "user", "content": "quota"}]), max_tokens=1)
    title = dict(
        _body([{"role": "user", "content": "title please"}]),
        output_format={"type": "json_schema", "schema": {"type": "object"}},
    )
    for body in (probe, title):
        prepared = tree.prepare(from_anthropic(body))
        assert prepared.classification.leaf_class is LeafClass.SIDE
    assert LeafClass.SIDE not in LEAF_PRIORITY
    assert (
        tree.prepare(from_anthropic(_body([{"role": "user", "content": "work"}]))).classification.leaf_class
        is LeafClass.MAIN
    )


def test_commit_after_a_concurrent_commit_reuses_nodes() -> None:
    tree = _tree()
    first = _commit(tree, _body([{"role": "user", "content": "a"}]), _out("one"))
    body = _body(
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "one"},
            {"role": "user", "content": "b"},
        ]
    )
    p1 = tree.prepare(from_anthropic(body))
    p2 = tree.prepare(from_anthropic(body))  # a parallel call of the same execution
    r1 = tree.commit(p1, _out("x"), [0.0] * 2, CallMeta())
    r2 = tree.commit(p2, _out("y"), [0.0] * 2, CallMeta())
    assert [n.role for n in r1.new_nodes] == ["user", "assistant"]
    assert [n.role for n in r2.new_nodes] == ["assistant"]  # the user turn "b" is not stored twice
    assert r1.output_node.parent is r2.output_node.parent
    assert r1.output_node.parent.parent is first.output_node  # type: ignore[attr-defined]
    r3 = tree.commit(tree.prepare(from_anthropic(body)), _out("y"), [0.0] * 2, CallMeta())
    assert r3.deduplicated and r3.output_node is r2.output_node and not r3.new_nodes


def test_rejected_inputs_and_closed_tree() -> None:
    tree = _tree()
    with pytest.raises(RequestError):
        tree.prepare(
            from_anthropic(_body([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]))
        )
    prepared = tree.prepare(from_anthropic(_body([{"role": "user", "content": "a"}])))
    with pytest.raises(ValueError, match="non-empty"):
        tree.commit(prepared, [], [], CallMeta())
    with pytest.raises(ValueError, match="entries for"):
        tree.commit(prepared, [1, 2], [0.0], CallMeta())
    assert tree.nodes == {}
    tree.close()
    with pytest.raises(TreeClosedError):
        tree.prepare(from_anthropic(_body([{"role": "user", "content": "a"}])))
    with pytest.raises(TreeClosedError):
        tree.commit(prepared, [IM_END], [0.0], CallMeta())


def test_openai_chat_reasoning_dropped_on_echo_still_matches() -> None:
    tree = _tree("generic")
    ids = [261, *b"think", 262, *b"Answer", IM_END]
    body = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "q"}]}
    result = tree.commit(tree.prepare(from_openai_chat(body)), ids, [0.0] * len(ids), CallMeta())
    assert result.output is not None and result.output.thinking == "think"
    body["messages"] += [{"role": "assistant", "content": "Answer"}, {"role": "user", "content": "more"}]
    assert tree.prepare(from_openai_chat(body)).num_matched_messages == 2


def test_tool_call_ids_are_deterministic_and_unique_per_place() -> None:
    ids = _out("", {"name": "Bash", "arguments": {"command": "ls"}})
    trees = [_tree(), _tree()]
    outs = [_commit(t, _body([{"role": "user", "content": "a"}]), ids).output for t in trees]  # type: ignore[attr-defined]
    assert outs[0].tool_calls[0].id == outs[1].tool_calls[0].id
    assert outs[0].tool_calls[0].id.startswith("toolu_")
    other = _commit(trees[0], _body([{"role": "user", "content": "b"}]), ids).output  # type: ignore[attr-defined]
    assert other.tool_calls[0].id != outs[0].tool_calls[0].id


def test_codec_round_trip_rebuilds_an_equivalent_tree() -> None:
    sim = run_script(7, ["step", "retry", "sub", "compact", "step", "sub", "sub_end", "step"])
    tree = sim.tree
    blobs = [encode_node(n) for n in reversed(list(tree.nodes.values()))]
    rebuilt = TrajectoryTree.from_nodes(tree.execution_id, tree.template, tree.profile, blobs)
    assert tree_stats(rebuilt).as_dict() == tree_stats(tree).as_dict()
    for node_id, node in tree.nodes.items():
        other = rebuilt.nodes[node_id]
        assert other.token_ids.tolist() == node.token_ids.tolist()
        assert other.logprobs.tolist() == node.logprobs.tolist()
        assert other.path_digest == node.path_digest and other.parent_id == node.parent_id
        assert (other.sampled is None) == (node.sampled is None)
        assert other.tool_calls == node.tool_calls and other.meta == node.meta
    sim.tree = rebuilt  # the rebuilt tree keeps restoring and matching: no new branch
    sim.step()
    assert len(rebuilt.nodes) == sim.expected_nodes()


def _node(ids: list[int], logprobs: list[float] | None = None) -> Node:
    tokens = np.asarray(ids, dtype=np.int32)
    node = Node(7, None, NodeKind.OUTPUT, "assistant", b"d" * 16, b"", tokens)
    if logprobs is not None:
        node.sampled = np.ones(len(tokens), dtype=np.bool_)
        node.logprobs = np.asarray(logprobs, dtype=np.float32)
        node.num_sampled = len(tokens)
    return node


@pytest.mark.parametrize(
    ("ids", "width"), [([], 2), ([0, 5, 65_535], 2), ([3, 65_536], 4), ([151_642, 7], 4)]
)
def test_codec_stores_ids_in_two_bytes_when_they_fit_else_four(ids: list[int], width: int) -> None:
    node = _node(ids, [-0.5] * len(ids) if ids else None)
    blob = encode_node(node)
    msg = trajectory_pb2.TreeNode.FromString(blob)
    assert msg.token_id_width == width and len(msg.token_ids_le) == width * len(ids)
    assert not msg.token_ids and not msg.logprobs  # the repeated fields are for older trees only
    back, parent_id = decode_node(blob)
    assert back.token_ids.dtype == np.int32 and back.token_ids.tolist() == ids and parent_id == 0
    assert back.logprobs.tolist() == ([-0.5] * len(ids) if ids else [])
    assert back.token_ids.flags.writeable  # a copy, not a view of the blob


def test_codec_reads_nodes_written_with_repeated_fields() -> None:
    """Trees recorded before the packed fields (in Redis over an upgrade, or archived) still load."""
    old = trajectory_pb2.TreeNode(
        node_id=7, kind=3, role="assistant", digest=b"d" * 16, token_ids=[4, 70_000, 9],
        sampled_spans=[0, 3], logprobs=[-0.25, -1.0, -2.0],
    )  # fmt: skip
    node, _ = decode_node(old.SerializeToString())
    assert node.token_ids.tolist() == [4, 70_000, 9] and node.logprobs.tolist() == [-0.25, -1.0, -2.0]
    assert node.num_sampled == 3


def test_codec_refuses_a_token_array_cut_mid_id() -> None:
    msg = trajectory_pb2.TreeNode.FromString(encode_node(_node([1, 2, 3])))
    msg.token_ids_le = msg.token_ids_le[:-1]
    with pytest.raises(ValueError, match="bytes of token ids of width 2"):
        decode_node(msg.SerializeToString())


@given(
    a=st.lists(st.sampled_from([b"x", b"y", b"z"]), max_size=12),
    b=st.lists(st.sampled_from([b"x", b"y", b"z"]), max_size=12),
    floor=st.integers(0, 4),
)
def test_common_prefix_of_hot_paths(a: list[bytes], b: list[bytes], floor: int) -> None:
    true = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    got = _common_prefix(a, b, floor)
    assert got == true if true > floor else got <= floor


def test_match_then_encoded_is_prepare_and_renders_only_what_is_new() -> None:
    """The proxy's split of `prepare` (match on the loop, encode elsewhere): the same call, and `texts`
    holds the new root (only while the template keeps no ids for it) and the new messages."""
    body = _body([{"role": "user", "content": "hi"}])
    fresh = _tree()
    fresh.template._roots.clear()  # type: ignore[attr-defined]  # the family template is shared
    matched = fresh.match(from_anthropic(body))
    assert len(matched.texts) == 2 and matched.root_tokens is None
    prepared = matched.encoded([fresh.template.encode(t) for t in matched.texts])
    assert prepared.input_ids.tolist() == _tree().prepare(from_anthropic(body)).input_ids.tolist()
    again = _tree().match(from_anthropic(body))  # the template kept the root's ids
    assert len(again.texts) == 1 and again.root_tokens is not None
    with pytest.raises(ValueError, match="2 encodings for 1 texts"):
        again.encoded([[1], [2]])

    tree = _tree()
    ids = _out("Looking.")
    _commit(tree, body, ids)
    longer = _body(
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Looking."},
            {"role": "user", "content": "and now?"},
        ]
    )
    nodes_before = dict(tree.nodes)
    matched = tree.match(from_anthropic(longer))
    assert tree.nodes == nodes_before  # matching stores nothing
    assert len(matched.texts) == 1 and "and now?" in matched.texts[0]
    split = matched.encoded([tree.template.encode(t) for t in matched.texts])
    assert split.input_ids.tolist() == tree.prepare(from_anthropic(longer)).input_ids.tolist()
    assert split.num_matched_messages == 2
