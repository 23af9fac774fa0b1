"""Config section of the harness-facing proxy: its ports, how it reads the model's chat template and tool
calls, and how it retries and drains calls on the rollout engines."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from gyre.config.base import AtLeastOne, NonNegativeFloat, NonNegativeInt, Port, Section


class ProxySection(Section):
    port: Port = 0
    """gRPC port (OpenExecution, UpdateRoutes, Drain); 0 picks a free one."""
    http_port: Port = 0
    """Harness-facing HTTP port (Anthropic / OpenAI APIs); 0 picks a free one."""
    max_body_bytes: AtLeastOne = 32 * 1024 * 1024
    """Requests with a larger body are answered 413."""
    default_profile: str = "generic"
    """Harness profile used when an execution does not name one."""
    matching: Literal["loose", "strict"] = "loose"
    """How a request's history is matched against the tree: `loose` ignores the profile's volatile
    content (Claude Code's billing line in the root key, `<system-reminder>` blocks in user text);
    `strict` matches content exactly. Either way the prompt keeps every token as sent or recorded."""
    end_of_turn: str | None = None
    """The token that ends an assistant turn; None = the chat family's (`<|im_end|>` for ChatML and
    Qwen, `<|eot_id|>` for Llama 3), recognized from the model's chat template."""
    tool_call_parser: str | None = None
    """Tool-call parser of engine outputs (a name in `gyre.trajectory.output.PARSERS`: `hermes`,
    `llama3_json`); None = the chat family's."""
    template: Literal["auto", "strict", "shipped"] = "auto"
    """What to do with a model whose own chat template is not append-only — e.g. Qwen3's, which drops the
    reasoning of earlier turns (`gyre model verify-template DIR` shows where it breaks and what `auto`
    renders instead). `auto`: render with the verified append-only template of its family
    (gyre.trajectory.templates.registry: the shipped template's format, earlier turns as sampled),
    recorded in the proxy's stats and the run's summary and logged once at start; `strict`: refuse it at
    start; `shipped`: keep it (trees then record every turn as sampled, which that template would have
    rendered differently)."""
    template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra variables for the chat template (e.g. `enable_thinking: false` for Qwen3)."""
    encode_threads: NonNegativeInt = 2
    """Threads that tokenize a call's new segments off the event loop (the tokenizer releases the GIL);
    0 = on the loop, where a large tool result stalls every other call while it encodes."""
    encode_inline_chars: NonNegativeInt = 16384
    """A call whose new text is shorter than this is encoded on the loop (16 KB: ~12 ms of encoding on
    this machine). Below it the hop does not pay: the thread hands its ids back under the GIL, which a
    busy loop gives up only at the interpreter's switch interval (5 ms)."""
    default_max_tokens: AtLeastOne = 4096
    """Output budget of a call whose request names none (capped by the engine's context length)."""
    max_engine_attempts: AtLeastOne = 4
    """Attempts of one call on engines that fail or abort it (connection lost, engine shutting down);
    moves ordered by a drain do not count. After the last one the harness gets an error."""
    retry_backoff_s: NonNegativeFloat = 0.25
    """Delay before the second attempt; doubles with each further attempt."""
    unreachable_wait_s: NonNegativeFloat = 30.0
    """While no serving engine can be reached at all (the last one was killed and is being restarted), a
    call keeps trying for this long (backoff capped at 2 s) before its attempts count against
    `max_engine_attempts`: a cell agent's engine is back within seconds, and the harness would rather wait."""
    engine_timeout_s: NonNegativeFloat = 900.0
    """Longest a call may wait on an engine (covers long generations)."""
    replay_unanswered_calls: bool = True
    """A call whose whole history is recorded and whose last message already has an output no later call
    continued is a retry of a call the harness never got the answer of (the proxy died, or the connection
    broke, after the output was recorded): answer it with that output instead of sampling another, so the
    tree holds each call once (services/proxy/replay.py). False: such a call is sampled anew."""
    drain_timeout_s: NonNegativeFloat = 60.0
    """Longest a Drain waits for one in-flight call to leave the drained engine."""
    record_routed_experts: bool = False
    """Ask the engines for the MoE experts of every token (`return_routed_experts`) and keep them in the
    trajectory tree (`gyre.trajectory.routing`); on whenever `cell_agent.trainer.routing_replay` is."""

    @model_validator(mode="before")
    @classmethod
    def _replaced_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and "template_strict" in data:
            strict = data["template_strict"]
            fix = (
                "template: strict"
                if strict is True
                else "template: shipped"
                if strict is False
                else "template"
            )
            raise ValueError(
                f"proxy.template_strict was replaced by proxy.template (auto, strict or shipped): write `{fix}` "
                "instead (auto, the default, renders with the verified template of the model's family)"
            )
        return data
