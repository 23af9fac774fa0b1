"""The trajectory processor: message model, chat templates, TITO trees, admission, rows.

Pure library code: imports nothing from grpc, nats, redis or HTTP stacks (a test enforces it).
The proxy is the writer, the packer the reader:

    request = from_anthropic(body, headers)                 # or from_openai_chat / from_openai_responses
    prepared = tree.prepare(request)                        # TrajectoryTree(execution_id, template, profile)
    output = prepared.parse_output(output_ids)              # → to_anthropic_content(output), ...
    result = tree.commit(prepared, output_ids, logprobs, CallMeta(...))   # persist encode_node(n) for result.new_nodes
    rows = materialize(tree, admit(tree, j_max=5, seed=seed))             # the packer
"""

from gyre.trajectory.admission import AdmittedTrajectory, admit
from gyre.trajectory.anthropic import anthropic_stop_reason, from_anthropic, to_anthropic_content
from gyre.trajectory.api_common import MessageMemo
from gyre.trajectory.codec import decode_node, encode_node
from gyre.trajectory.materialize import materialize
from gyre.trajectory.messages import (
    Api,
    Message,
    ModelRequest,
    RequestError,
    RequestSampling,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
)
from gyre.trajectory.node import CallMeta, Node, NodeKind
from gyre.trajectory.openai_chat import from_openai_chat, openai_finish_reason, to_openai_chat_message
from gyre.trajectory.openai_responses import from_openai_responses, to_responses_output
from gyre.trajectory.output import PARSERS, AssistantOutput, ToolCallParser
from gyre.trajectory.profiles import PROFILES, AgentKind, HarnessProfile, LeafClass, RequestKind, get_profile
from gyre.trajectory.row import TrajectoryRow
from gyre.trajectory.stats import TreeStats, tree_stats
from gyre.trajectory.templates import (
    ChatTemplate,
    HFChatTemplate,
    TemplateError,
    template_for_family,
    template_for_model,
)
from gyre.trajectory.tree import CommitResult, PreparedCall, TrajectoryTree, TreeClosedError

__all__ = [
    "PARSERS",
    "PROFILES",
    "AdmittedTrajectory",
    "AgentKind",
    "Api",
    "AssistantOutput",
    "CallMeta",
    "ChatTemplate",
    "CommitResult",
    "HFChatTemplate",
    "HarnessProfile",
    "LeafClass",
    "Message",
    "MessageMemo",
    "ModelRequest",
    "Node",
    "NodeKind",
    "PreparedCall",
    "RequestError",
    "RequestKind",
    "RequestSampling",
    "TemplateError",
    "TextBlock",
    "ThinkingBlock",
    "ToolCallParser",
    "ToolResultBlock",
    "ToolSpec",
    "ToolUseBlock",
    "TrajectoryRow",
    "TrajectoryTree",
    "TreeClosedError",
    "TreeStats",
    "admit",
    "anthropic_stop_reason",
    "decode_node",
    "encode_node",
    "from_anthropic",
    "from_openai_chat",
    "from_openai_responses",
    "get_profile",
    "materialize",
    "openai_finish_reason",
    "template_for_family",
    "template_for_model",
    "to_anthropic_content",
    "to_openai_chat_message",
    "to_responses_output",
    "tree_stats",
]
