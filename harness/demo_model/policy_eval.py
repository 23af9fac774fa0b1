"""What reward a model gets on the demo tasks: samples it through the embedded engine with the
demo harness's protocol and scores the answers with the demo verifier's rule.

    report = asyncio.run(measure_reward(model_dir, task_ids, samples_per_task=8, seed=0))
    report.mean_reward, report.groups_with_variance

A rollout renders the request as the proxy would (harness system prompt and tools,
the demo model's chat template), generates with temperature 1 on an in-process `EngineServer`, parses the output with
the template's tool-call parser, applies `write_file` calls to an in-memory workspace, answers
each call with the tool result the harness would send, and continues until an answer without
tool calls (or `max_turns`). One task's samples form a group, as in RL: the share of groups whose
rewards differ is the share that gives a learning signal at the first step.
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gyre.config.engine import EngineSection
from gyre.engine.client import EngineClient
from gyre.tasks import Task, TaskRegistry
from gyre.tasks.builtin.verify import score_text
from gyre.trajectory.messages import Message, ToolResultBlock
from gyre.trajectory.profiles import PROFILES
from gyre.trajectory.templates import ChatTemplate, template_for_model
from harness import prompts
from harness.demo_model.teacher import answers
from harness.tools import DEFAULT_TOOLS, tool_specs


@dataclass(slots=True)
class RewardReport:
    rewards: dict[str, list[float]] = field(default_factory=dict)
    """Task id → the rewards of its samples (one group)."""

    @property
    def mean_reward(self) -> float:
        return statistics.fmean(r for group in self.rewards.values() for r in group)

    @property
    def groups_with_variance(self) -> float:
        """Share of groups whose rewards are not all equal."""
        return sum(1 for g in self.rewards.values() if len(set(g)) > 1) / max(1, len(self.rewards))

    def summary(self) -> dict[str, Any]:
        return {
            "mean_reward": round(self.mean_reward, 4),
            "groups_with_variance": round(self.groups_with_variance, 4),
            "num_groups": len(self.rewards),
            "samples": sum(len(g) for g in self.rewards.values()),
        }


def prompt_ids(task: Task, template: ChatTemplate) -> list[int]:
    from gyre.trajectory.anthropic import from_anthropic

    body = {
        "system": prompts.MAIN_SYSTEM,
        "tools": tool_specs(task.tools or DEFAULT_TOOLS),
        "messages": [{"role": "user", "content": task.prompt}],
    }
    request = from_anthropic(body, {})
    system = PROFILES["generic"].classify(request).system
    ids = template.render_system(system, request.tools)
    ids += template.render_message(request.messages[0]) + template.render_generation_prompt()
    return ids


@dataclass(slots=True)
class Rollout:
    """One execution: its reward and its token record (what the proxy would have recorded)."""

    reward: float
    ids: list[int]
    targets: list[bool]
    """True on engine-sampled ids."""
    behaviour_logprobs: list[float]
    """Per id: the engine's log-prob of a sampled id, 0.0 elsewhere."""


async def rollout(
    client: EngineClient,
    task: Task,
    template: ChatTemplate,
    rid: str,
    max_turns: int = 4,
    max_new_tokens: int = 160,
    temperature: float = 1.0,
) -> Rollout:
    """One execution: the harness protocol against the engine, scored by the verifier's rule."""
    ids = prompt_ids(task, template)
    targets, behaviour = [False] * len(ids), [0.0] * len(ids)
    files: dict[str, str] = {}

    def extend(new: list[int], sampled: bool = False, logprobs: list[float] | None = None) -> None:
        ids.extend(new)
        targets.extend([sampled] * len(new))
        behaviour.extend(logprobs if logprobs is not None else [0.0] * len(new))

    for turn in range(max_turns):
        result = await client.generate(
            ids, {"max_new_tokens": max_new_tokens, "temperature": temperature}, rid=f"{rid}-{turn}"
        )
        output = result.output_ids
        extend(output, sampled=True, logprobs=result.output_logprobs)
        extend(template.close_output(output))
        if any(t >= template.tokenizer.vocab_size for t in output):  # a padded-vocabulary id
            break  # an id past the tokenizer (unused embedding rows): undecodable, so a malformed output
        calls = template.parse_output(output, id_seed=f"{rid}-{turn}".encode()).tool_calls
        if not calls:
            break
        results = []
        for call in calls:
            args = call.input if isinstance(call.input, dict) else {}
            path, content = args.get("path"), args.get("content")
            if call.name == "write_file" and isinstance(path, str) and isinstance(content, str) and path:
                files[path] = content
                results.append(ToolResultBlock(call.id, "ok"))
            else:
                results.append(ToolResultBlock(call.id, f"unsupported call {call.name!r}", is_error=True))
        extend(template.render_message(Message("user", tuple(results))) + template.render_generation_prompt())
    parts = answers(task)
    reward = sum(score_text(files.get(path), expected) for path, expected in parts) / len(parts)
    return Rollout(reward, ids, targets, behaviour)


async def measure_reward(
    model_dir: Path,
    task_ids: list[str],
    samples_per_task: int = 8,
    seed: int = 0,
    concurrency: int = 32,
    model: Any = None,
    temperature: float = 1.0,
) -> RewardReport:
    """Sample the model of `model_dir` (or `model`, a CausalLM of it, served as is) on every task,
    `samples_per_task` times each, at `temperature` (0 = greedy)."""
    from services.cell_agent.engine import EngineServer

    registry, template = TaskRegistry(), template_for_model(model_dir)
    report = RewardReport()
    section = EngineSection(max_batch_size=concurrency, seed=seed, num_threads=2)
    limit = asyncio.Semaphore(concurrency)
    async with (
        EngineServer(section, model_dir=model_dir, model=model) as engine,
        EngineClient(engine.url, timeout_s=600) as client,
    ):

        async def one(task_id: str, k: int) -> None:
            async with limit:
                done = await rollout(
                    client, registry.get(task_id), template, rid=f"{task_id}#{k}", temperature=temperature
                )
            report.rewards.setdefault(task_id, []).append(done.reward)

        await asyncio.gather(*(one(t, k) for t in task_ids for k in range(samples_per_task)))
    return report
