"""Teacher transcripts: rendered along the proxy's path, with targets on engine outputs only."""

from __future__ import annotations

import random
from collections import Counter

from gyre.tasks import TaskRegistry
from gyre.trajectory.anthropic import from_anthropic
from gyre.trajectory.templates import template_for_family
from harness import prompts
from harness.demo_model.teacher import DONE, answers, render_transcript, teacher_body

TEMPLATE = template_for_family("chatml")
IM_END = TEMPLATE.tokenizer.special_id("<|im_end|>")


def outputs(ids: list[int], targets: list[bool]) -> list[list[int]]:
    """The maximal runs of target ids (one per assistant output)."""
    runs: list[list[int]] = []
    for i, (t, is_target) in enumerate(zip(ids, targets, strict=True)):
        if is_target:
            if i == 0 or not targets[i - 1]:
                runs.append([])
            runs[-1].append(t)
    return runs


def test_render_matches_the_template_and_targets_exactly_the_outputs() -> None:
    task = TaskRegistry().get("parts/1+2,2+3")
    rng = random.Random(3)
    transcript = next(t for t in (teacher_body(task, rng) for _ in range(50)) if t.malformed_output is None)
    ids, targets = render_transcript(transcript, TEMPLATE)
    request = from_anthropic(transcript.body, {})
    assert request.system == (prompts.MAIN_SYSTEM,)
    assert ids == TEMPLATE.render_conversation(prompts.MAIN_SYSTEM, request.tools, request.messages, False)
    runs = outputs(ids, targets)
    assert len(runs) == 3  # two write_file calls, then the final answer
    for run in runs:
        assert run[-1] == IM_END
    calls = [TEMPLATE.parse_output(run).tool_calls for run in runs]
    assert [(c[0].name, c[0].input["path"]) for c in calls[:2]] == [
        ("write_file", "a.txt"),
        ("write_file", "b.txt"),
    ]
    assert not calls[2] and TEMPLATE.decode_output(runs[2]) == DONE


def test_teacher_is_mostly_right_and_its_mistakes_look_like_model_mistakes() -> None:
    registry, rng = TaskRegistry(), random.Random(0)
    kinds: Counter[str] = Counter()
    for _ in range(2000):
        task = registry.get("add/4+4")
        transcript = teacher_body(task, rng)
        ids, targets = render_transcript(transcript, TEMPLATE)
        first = outputs(ids, targets)[0]
        calls = TEMPLATE.parse_output(first).tool_calls
        if transcript.malformed_output is not None:
            assert not calls  # the proxy's parser would reject it: the execution ends without a write
            kinds["malformed"] += 1
        elif calls[0].input["content"] == answers(task)[0][1]:
            kinds["right"] += 1
        else:
            kinds["wrong"] += 1
    assert 0.76 < kinds["right"] / 2000 < 0.84
    assert 0.07 < kinds["wrong"] / 2000 < 0.13 and 0.07 < kinds["malformed"] / 2000 < 0.13
