"""Tool-call restoration: echoed tool calls are matched with the payload the engine emitted.

Harnesses re-serialize the tool calls they echo back: Claude Code 2.1.332 sends `input` as
compact JSON with keys reordered into the tool schema's order (the model wrote `description,
command`, the echo says `command, description`), while ids and thinking blocks come back verbatim;
Codex echoes arguments byte-identical. The tree records each emitted call by id; before matching a
history, every echoed call whose id is known is replaced by the recorded one, so reformatting
cannot break the prefix. Ids are echoed verbatim, so they stay the correlation key.
"""

from __future__ import annotations

from collections.abc import Iterable

from gyre.trajectory.messages import Block, Message, ToolUseBlock


class ToolCallCache:
    """Call id → the tool call as the engine emitted it."""

    def __init__(self) -> None:
        self._calls: dict[str, ToolUseBlock] = {}

    def __len__(self) -> int:
        return len(self._calls)

    def __contains__(self, call_id: str) -> bool:
        return call_id in self._calls

    def record(self, calls: Iterable[ToolUseBlock]) -> None:
        for call in calls:
            self._calls.setdefault(call.id, call)

    def restore(self, message: Message) -> Message:
        """The message with known echoed calls replaced by their records (the same object if none)."""
        if message.role != "assistant":
            return message
        changed = False
        blocks: list[Block] = []
        for block in message.blocks:
            if isinstance(block, ToolUseBlock):
                recorded = self._calls.get(block.id)
                if recorded is not None and recorded.name == block.name and recorded != block:
                    blocks.append(recorded)
                    changed = True
                    continue
            blocks.append(block)
        return message.replace_blocks(tuple(blocks)) if changed else message
