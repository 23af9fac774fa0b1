"""The demo harness's prompts. Kept short on purpose: the embedded model is byte-level, so every
byte here is a token of every request (and of every warm-start transcript)."""

from __future__ import annotations

MAIN_SYSTEM = "You are a coding agent. Use the tools to do the task in the current directory."
"""System prompt of the main agent."""

SUB_SYSTEM = "You are a sub-agent. Do the delegated task with the tools, then report briefly."
"""System prompt of a delegated sub-agent (its own root in the trajectory tree)."""

SUMMARY_INSTRUCTION = "Summarize the work so far: what is done and what remains."
"""Appended to the history in a compaction request."""

RESUME_PREFIX = "Summary of earlier work:\n"
"""Starts the summary inside the fresh history after compaction."""


def resumed_prompt(task: str, summary: str) -> str:
    """The first user message of the history that replaces a compacted one."""
    return f"{task}\n\n{RESUME_PREFIX}{summary}"
