"""Config section of the harness-facing proxy: its ports, the chat template and tool-call parser the
trees record with, and how it retries and drains calls on the rollout engines."""

from __future__ import annotations

from gyre.config.base import AtLeastOne, NonNegativeFloat, Port, Section


class ProxySection(Section):
    port: Port = 0
    """gRPC port (OpenExecution, UpdateRoutes, Drain); 0 picks a free one."""
    http_port: Port = 0
    """Harness-facing HTTP port (Anthropic / OpenAI APIs); 0 picks a free one."""
    max_body_bytes: AtLeastOne = 32 * 1024 * 1024
    """Requests with a larger body are answered 413."""
    default_profile: str = "generic"
    """Harness profile used when an execution does not name one."""
    template: str = "embedded"
    """Chat template the trees record token ids with (a name in `gyre.trajectory.TEMPLATES`); it must be
    the template of the model the engines serve. `hf` also needs `hf_tokenizer`."""
    tool_call_parser: str = "hermes"
    """Tool-call parser of engine outputs (a name in `gyre.trajectory.PARSERS`)."""
    hf_tokenizer: str | None = None
    """Template `hf` only: local path of the Hugging Face tokenizer whose chat template renders calls."""
    hf_end_of_turn: str = "<|im_end|>"
    """Template `hf` only: the token that ends an assistant turn."""
    default_max_tokens: AtLeastOne = 4096
    """Output budget of a call whose request names none (capped by the engine's context length)."""
    max_engine_attempts: AtLeastOne = 4
    """Attempts of one call on engines that fail or abort it (connection lost, engine shutting down);
    moves ordered by a drain do not count. After the last one the harness gets an error."""
    retry_backoff_s: NonNegativeFloat = 0.25
    """Delay before the second attempt; doubles with each further attempt."""
    engine_timeout_s: NonNegativeFloat = 900.0
    """Longest a call may wait on an engine (covers long generations)."""
    drain_timeout_s: NonNegativeFloat = 60.0
    """Longest a Drain waits for one in-flight call to leave the drained engine."""
