"""The trajectory tree of one execution, with a two-phase insert for the proxy.

    tree = TrajectoryTree(execution_id, template=template_for_model(model_dir), profile=get_profile("claude_code"))
    prepared = tree.prepare(request)        # pure: classify, restore tool calls, match, encode new messages
                                            # (= tree.match(request).encoded(ids of its .texts))
    engine.generate(prepared.input_ids)     # the exact prompt: stored ids of the matched path + new ids
    result = tree.commit(prepared, output_ids, output_logprobs, CallMeta(...))   # append; persist result.new_nodes

`prepare` walks from the root key down by message digest (one dictionary step per history
message, no re-hashing or re-tokenizing of matched messages) and encodes only the messages that
did not match; a rejected or failed call therefore changes nothing. `commit` appends the new
message nodes and the output node, and stays correct when other calls of the same execution
committed in between (sub-agents run in parallel with the main agent): it re-checks each new
message against the children present at commit time and reuses what another call added. An
output identical to a sibling (same digest, e.g. a retry that sampled the same text) is not stored
twice: the commit returns the existing node with `deduplicated=True`, and the first sample's
log-probs and metadata stay the record.

A recently extended path is kept as a "hot path" (digest list + nodes): a harness that resends
its history plus one message matches it with one C-level list comparison instead of a Python
loop, which keeps insert cost flat as the history grows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gyre.trajectory.codec import decode_node
from gyre.trajectory.messages import Api, Message, ModelRequest, RequestError, chain_digest, root_digest
from gyre.trajectory.node import CallMeta, Node, NodeKind
from gyre.trajectory.output import AssistantOutput
from gyre.trajectory.profiles import AgentKind, Classification, HarnessProfile, LeafClass, RequestKind
from gyre.trajectory.restore import ToolCallCache
from gyre.trajectory.routing import spread_routing
from gyre.trajectory.templates.base import ChatTemplate

_NUM_HOT_PATHS = 8


class TreeClosedError(RuntimeError):
    """The execution is closed: its tree accepts no more calls."""


@dataclass(slots=True)
class NewMessage:
    message: Message
    token_ids: npt.NDArray[np.int32]
    path_digest: bytes
    key: bytes
    """The digest the message is matched by (its profile-normalized form; `Message.digest` if strict)."""


@dataclass(slots=True, eq=False)
class _Match:
    """Where a request stands against the tree: what `match` found, shared by both halves of `prepare`."""

    tree: TrajectoryTree
    request: ModelRequest
    classification: Classification
    root_key: bytes
    root: Node | None
    """The existing ROOT node, or None when this call opens a new root."""
    matched: list[Node]
    """Matched message/output nodes below the root, in order."""
    aliases: list[tuple[Node, bytes, Node]]
    """(parent, echoed digest, matched child) learned by restoration, added on commit."""
    id_seed: bytes
    """Path digest of the output's parent: seeds the output's tool-call ids."""
    digests: list[bytes] = field(repr=False)
    """Match digests of the request's messages (the hot-path key)."""


@dataclass(slots=True, eq=False)
class PreparedCall(_Match):
    """A matched and encoded request, not yet part of the tree (see the module docstring)."""

    root_tokens: npt.NDArray[np.int32] | None
    """Encoded system turn when `root` is None (the template's read-only array, shared by trees)."""
    new_messages: list[NewMessage]
    history_mismatch: bool = False
    """The history diverged from every recorded path: an assistant message the tree did not record
    (re-serialized or edited by the harness, or retokenization drift) had to be encoded anew."""
    _input_ids: npt.NDArray[np.int32] | None = field(default=None, repr=False)

    @property
    def agent_kind(self) -> AgentKind:
        return self.classification.agent_kind

    @property
    def request_kind(self) -> RequestKind:
        return self.classification.request_kind

    @property
    def leaf_class(self) -> LeafClass:
        return self.classification.leaf_class

    @property
    def num_matched_messages(self) -> int:
        return len(self.matched)

    @property
    def num_new_tokens(self) -> int:
        """Tokens encoded for this call (new root and new messages; not the generation prompt)."""
        root = len(self.root_tokens) if self.root_tokens is not None else 0
        return sum(len(m.token_ids) for m in self.new_messages) + root

    @property
    def input_ids(self) -> npt.NDArray[np.int32]:
        """The full prompt: root, matched nodes, new messages, generation prompt (built on first use)."""
        if self._input_ids is None:
            root = self.root.token_ids if self.root is not None else self.root_tokens
            parts = [root] if root is not None else []
            parts.extend(n.token_ids for n in self.matched)
            parts.extend(m.token_ids for m in self.new_messages)
            parts.append(np.asarray(self.tree.template.render_generation_prompt(), dtype=np.int32))
            self._input_ids = np.concatenate(parts)
        return self._input_ids

    @property
    def id_prefix(self) -> str:
        return "toolu_" if self.request.api is Api.ANTHROPIC else "call_"

    def parse_output(self, output_ids: Sequence[int]) -> AssistantOutput:
        """The output as the harness will see it; `commit` derives the same (ids included)."""
        return self.tree.template.parse_output(output_ids, self.id_seed, self.id_prefix)


@dataclass(slots=True, eq=False)
class MatchedCall(_Match):
    """A request matched against the tree, its new segments rendered but not encoded (`TrajectoryTree.match`)."""

    root_tokens: npt.NDArray[np.int32] | None
    """The template's kept ids of a new root; None when `texts` starts with the root's text."""
    new: list[tuple[Message, bytes, bytes]]
    """(message, path digest, match key) of each message that did not match."""
    texts: list[str]
    """What to encode: a new root's text (when the template kept no ids for it), then each new message's
    segment."""

    def encoded(self, ids: Sequence[Sequence[int]]) -> PreparedCall:
        """The prepared call, given the ids of each of `texts` (`ChatTemplate.encode`)."""
        if len(ids) != len(self.texts):
            raise ValueError(f"{len(ids)} encodings for {len(self.texts)} texts")
        segments = iter(ids)
        root_tokens = self.root_tokens
        if self.root is None and root_tokens is None:
            rendered = self.classification.rendered_system
            root_tokens = self.tree.template.keep_root_ids(rendered, self.request.tools, next(segments))
        new = [
            NewMessage(message, np.asarray(segment, dtype=np.int32), path, key)
            for (message, path, key), segment in zip(self.new, segments, strict=True)
        ]
        return PreparedCall(
            self.tree,
            self.request,
            self.classification,
            self.root_key,
            self.root,
            self.matched,
            self.aliases,
            self.id_seed,
            self.digests,
            root_tokens,
            new,
            any(m.message.role == "assistant" for m in new),
        )


@dataclass(slots=True)
class CommitResult:
    output_node: Node
    output: AssistantOutput | None
    """The parsed output (None when the caller supplied the output message)."""
    new_nodes: list[Node]
    """Nodes created by this commit, parents first: persist these."""
    changed_nodes: list[Node]
    """Existing nodes whose persisted fields changed (new aliases): persist these too."""
    deduplicated: bool = False
    """True when an identical sibling output existed and was reused."""


class TrajectoryTree:
    """Message-level prefix tree of one execution's model calls."""

    def __init__(self, execution_id: str, template: ChatTemplate | None, profile: HarnessProfile) -> None:
        self.execution_id = execution_id
        self._template = template
        self.profile = profile
        self.roots: dict[bytes, Node] = {}
        self.nodes: dict[int, Node] = {}
        self.tool_calls = ToolCallCache()
        self.closed = False
        self._next_id = 1
        self._hot: list[tuple[list[bytes], list[Node]]] = []

    # -- the two-phase insert -------------------------------------------------------------

    @property
    def template(self) -> ChatTemplate:
        """The chat template new calls are encoded with; a tree loaded only to be read has none."""
        if self._template is None:
            raise RuntimeError(f"tree {self.execution_id} was loaded without a chat template (read-only)")
        return self._template

    def prepare(self, request: ModelRequest) -> PreparedCall:
        """Classify, restore tool calls, match and encode; changes nothing in the tree."""
        matched = self.match(request)
        return matched.encoded([self.template.encode(text) for text in matched.texts])

    def match(self, request: ModelRequest) -> MatchedCall:
        """`prepare` up to the encoding: classified, restored and matched, the new segments rendered as
        text (`MatchedCall.texts`) for the caller to encode where it likes (the proxy: off its event loop
        when they are large), then `MatchedCall.encoded(ids)`. Changes nothing in the tree."""
        self._check_open()
        messages = request.messages
        if messages and messages[-1].role == "assistant":
            raise RequestError("a trailing assistant message (prefill) is not supported", "messages")
        classification = self.profile.classify(request)
        key = root_digest(classification.system, request.tools)
        root = self.roots.get(key)
        matched: list[Node] = []
        aliases: list[tuple[Node, bytes, Node]] = []
        match = self.profile.match_message
        digests = [match(m).digest for m in messages]
        if root is not None:
            matched = self._match_hot(root, digests)
            node = matched[-1] if matched else root
            for message, digest in zip(messages[len(matched) :], digests[len(matched) :], strict=True):
                child = node.children.get(digest)
                if child is None:
                    restored = self.tool_calls.restore(message)
                    if restored is not message:
                        child = node.children.get(restored.digest)
                        if child is not None:
                            aliases.append((node, message.digest, child))
                if child is None:
                    break
                matched.append(child)
                node = child
        path = matched[-1].path_digest if matched else (root.path_digest if root is not None else key)
        previous = messages[len(matched) - 1] if matched else None
        new: list[tuple[Message, bytes, bytes]] = []
        texts: list[str] = []
        for message in messages[len(matched) :]:
            message = self.tool_calls.restore(message)
            digest = match(message).digest
            path = chain_digest(path, digest)
            texts.append(self.template.message_text(message, previous))
            new.append((message, path, digest))
            previous = message
        root_tokens = None
        if root is None:
            root_tokens = self.template.kept_root_ids(classification.rendered_system, request.tools)
            if root_tokens is None:
                texts.insert(0, self.template.system_text(classification.rendered_system, request.tools))
        return MatchedCall(
            self, request, classification, key, root, matched, aliases, path, digests, root_tokens, new, texts
        )

    def commit(
        self,
        prepared: PreparedCall,
        output_ids: Sequence[int] | npt.NDArray[np.int32],
        output_logprobs: Sequence[float] | npt.NDArray[np.float32],
        meta: CallMeta,
        output_message: Message | None = None,
        routed_experts: npt.NDArray[np.integer] | None = None,
    ) -> CommitResult:
        """Append the prepared call's new messages and its output node.

        `output_ids` are the exact ids the engine sampled, `output_logprobs` their behaviour
        log-probs. `output_message` overrides parsing (replay/import of outputs whose tool-call
        ids were assigned elsewhere). `routed_experts` [≤ prompt + output, L·k]: the MoE experts the
        engine chose per token, spread over the path's nodes (`gyre.trajectory.routing`)."""
        self._check_open()
        if prepared.tree is not self:
            raise ValueError("the prepared call belongs to another tree")
        ids = np.asarray(output_ids, dtype=np.int32)
        logprobs = np.asarray(output_logprobs, dtype=np.float32)
        if ids.ndim != 1 or len(ids) == 0:
            raise ValueError("output_ids must be a non-empty sequence of token ids")
        if logprobs.shape != ids.shape:
            raise ValueError(f"output_logprobs has {len(logprobs)} entries for {len(ids)} output ids")
        new_nodes: list[Node] = []
        changed: list[Node] = []
        agent, kind = prepared.agent_kind, prepared.request_kind
        root = self.roots.get(prepared.root_key)
        if root is None:
            assert prepared.root_tokens is not None, "a root seen at prepare time cannot disappear"
            root = self._new_node(
                None, NodeKind.ROOT, "system", prepared.root_key, prepared.root_key, prepared.root_tokens
            )
            root.agent_kind = agent
            self.roots[root.digest] = root
            new_nodes.append(root)
        node = root
        for parent, alias, child in prepared.aliases:
            if alias not in parent.children:
                parent.children[alias] = child
                child.aliases.append(alias)
                changed.append(child)
        if prepared.matched:
            node = prepared.matched[-1]
        chain: list[Node] = []
        for new in prepared.new_messages:
            step = node.children.get(new.key)
            if step is None:
                step = self._new_node(
                    node,
                    NodeKind.MESSAGE,
                    new.message.role,
                    new.key,
                    new.path_digest,
                    new.token_ids,
                )
                step.agent_kind, step.request_kind = agent, kind
                new_nodes.append(step)
            chain.append(step)
            node = step
        assert node.path_digest == prepared.id_seed
        output = None if output_message is not None else prepared.parse_output(ids.tolist())
        message = output_message if output_message is not None else output.to_message()  # type: ignore[union-attr]
        existing = node.children.get(message.digest)
        if existing is not None:  # an identical output (or supplied message) is already there
            self._remember_hot(prepared, chain, message, existing)
            _routed(root, prepared.matched, chain, existing, routed_experts, new_nodes, changed)
            return CommitResult(existing, output, new_nodes, changed, deduplicated=True)
        head = self.template.render_generation_prompt()
        tail = self.template.close_output(ids.tolist())
        tokens = np.concatenate([np.asarray(head, np.int32), ids, np.asarray(tail, np.int32)])
        sampled = np.zeros(len(tokens), dtype=np.bool_)
        sampled[len(head) : len(head) + len(ids)] = True
        path_digest = chain_digest(node.path_digest, message.digest)
        leaf = self._new_node(node, NodeKind.OUTPUT, "assistant", message.digest, path_digest, tokens)
        leaf.sampled, leaf.logprobs, leaf.num_sampled = sampled, logprobs, len(ids)
        leaf.agent_kind, leaf.request_kind, leaf.meta = agent, kind, meta
        leaf.tool_calls = message.tool_uses()
        self.tool_calls.record(leaf.tool_calls)
        bare = message.without_thinking()
        if bare.digest != message.digest and bare.digest not in node.children:
            leaf.aliases.append(bare.digest)
            node.children[bare.digest] = leaf
        new_nodes.append(leaf)
        self._remember_hot(prepared, chain, message, leaf)
        _routed(root, prepared.matched, chain, leaf, routed_experts, new_nodes, changed)
        return CommitResult(leaf, output, new_nodes, changed)

    def close(self) -> None:
        """Freeze the tree: further prepare/commit raise `TreeClosedError`."""
        self.closed = True

    # -- reading ----------------------------------------------------------------------------

    def leaves(self) -> list[Node]:
        """Output nodes no later call extended, in commit order."""
        return [n for n in self.nodes.values() if n.is_leaf]

    def ordered_nodes(self) -> list[Node]:
        """All nodes in id order (parents before children)."""
        return [self.nodes[i] for i in sorted(self.nodes)]

    # -- rebuilding (codec.py) ------------------------------------------------------------

    @classmethod
    def from_nodes(
        cls,
        execution_id: str,
        template: ChatTemplate | None,
        profile: HarnessProfile,
        blobs: Iterable[bytes],
        closed: bool = False,
    ) -> TrajectoryTree:
        """Rebuild a tree from `encode_node` bytes of all its nodes, in any order. `closed` is kept
        by the caller with the tree (the proxy stores it next to the nodes)."""
        tree = cls(execution_id, template, profile)
        for node, parent_id in sorted((decode_node(b) for b in blobs), key=lambda d: d[0].node_id):
            tree._adopt(node, parent_id)
        tree.closed = closed
        return tree

    def _adopt(self, node: Node, parent_id: int) -> None:
        if node.node_id in self.nodes:
            raise ValueError(f"node {node.node_id} appears twice")
        if node.kind is NodeKind.ROOT:
            if parent_id != 0:
                raise ValueError(f"root node {node.node_id} has parent {parent_id}")
            node.depth, node.path_digest = 0, node.digest
            self.roots[node.digest] = node
        else:
            parent = self.nodes.get(parent_id)
            if parent is None:
                raise ValueError(f"node {node.node_id} refers to missing parent {parent_id}")
            node.parent, node.depth = parent, parent.depth + 1
            node.path_digest = chain_digest(parent.path_digest, node.digest)
            parent.attach(node)
        self.tool_calls.record(node.tool_calls)
        self.nodes[node.node_id] = node
        self._next_id = max(self._next_id, node.node_id + 1)

    # -- internals --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise TreeClosedError(f"execution {self.execution_id} is closed")

    def _new_node(
        self,
        parent: Node | None,
        kind: NodeKind,
        role: str,
        digest: bytes,
        path_digest: bytes,
        tokens: Sequence[int] | npt.NDArray[np.int32],
    ) -> Node:
        node = Node(
            node_id=self._next_id,
            parent=parent,
            kind=kind,
            role=role,
            digest=digest,
            path_digest=path_digest,
            token_ids=np.asarray(tokens, dtype=np.int32),
            depth=parent.depth + 1 if parent is not None else 0,
        )
        self._next_id += 1
        self.nodes[node.node_id] = node
        if parent is not None:
            parent.attach(node)
        return node

    def _match_hot(self, root: Node, digests: list[bytes]) -> list[Node]:
        """Longest hot-path prefix of the request's digests under `root`."""
        best: list[Node] = []
        for hot_digests, hot_nodes in self._hot:  # most recent first
            if hot_nodes[0].parent is root:
                k = _common_prefix(digests, hot_digests, len(best))
                if k > len(best):
                    best = hot_nodes[:k]
                if len(best) >= len(digests) - 2:
                    break  # the dictionary walk finishes the last steps
        return best

    def _remember_hot(self, prepared: PreparedCall, chain: list[Node], output: Message, leaf: Node) -> None:
        """Keep the request's path (as the harness sent it) plus the output as a hot path."""
        nodes = prepared.matched + chain + [leaf]
        entry = ([*prepared.digests, output.digest], nodes)
        keep = [h for h in self._hot if not (len(h[1]) <= len(nodes) and nodes[len(h[1]) - 1] is h[1][-1])]
        self._hot = [entry, *keep[: _NUM_HOT_PATHS - 1]]


def _common_prefix(a: list[bytes], b: list[bytes], floor: int) -> int:
    """Length of the common prefix of `a` and `b` when it exceeds `floor` (else any value ≤ floor),
    by C-level slice comparisons: the whole length, then one or two shorter (a new tool result
    after the echo of the recorded output, which the dictionary walk restores), then bisection."""
    n = min(len(a), len(b))
    for k in (n, n - 1, n - 2):
        if k <= floor:
            return 0
        if a[k - 1] == b[k - 1] and a[:k] == b[:k]:
            return k
    lo, hi = 0, n - 2  # a[:lo] matches, a[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _routed(
    root: Node,
    matched: list[Node],
    chain: list[Node],
    leaf: Node,
    routed: npt.NDArray[np.integer] | None,
    new_nodes: list[Node],
    changed: list[Node],
) -> None:
    """Spread a call's routing over its path; existing nodes that learned rows join `changed`."""
    fresh = {id(n) for n in new_nodes} | {id(n) for n in changed}
    for node in spread_routing([root, *matched, *chain, leaf], routed):
        if id(node) not in fresh:
            changed.append(node)
