"""The built-in arithmetic suites (the demo's tasks): single-digit additions answered by writing a file.

Chosen for what the embedded byte-level model can learn by RL on CPU in a demo run
(docs/facts.md, "Learning on CPU"): after a short warm start on a mostly-right teacher, RL on
single-digit addition raises the reward, while two-digit addition and free-form copying are not
learned. The reward shape follows the same probe: 1 for the right answer, 0.2 for a written but
wrong answer (the tool call was well formed), 0 when nothing was written.

    add/3+5          "3+5=? Write the answer to answer.txt."        one part
    parts/3+5,2+2    two additions into a.txt and b.txt            score = mean of the parts

`parts` is the multi-part task: work finished before a harness timeout scores above zero.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import MappingProxyType

from gyre.tasks.task import Task, TaskSuite, UnknownTaskError, Verifier

DIGITS = range(10)
PART_FILES = ("a.txt", "b.txt", "c.txt", "d.txt")
_PAIR = re.compile(r"^([0-9])\+([0-9])$")

#: The one tool these tasks need (each tool definition costs ~180 tokens of every request).
TOOLS = ("write_file",)

#: Harness limits: generous for a 2-call execution on a shared CPU engine.
HARNESS_TIMEOUT_S = 300.0
OVERALL_BUDGET_S = 600.0


#: The verifier (a score line on stdout), run as a script: standard library only, `-I -S` skip the
#: site packages, so a verifier run costs a bare interpreter start, not an import of the library.
VERIFY = ("{python}", "-I", "-S", str(Path(__file__).with_name("verify.py")))


def _pair(text: str) -> tuple[int, int]:
    m = _PAIR.match(text)
    if m is None:
        raise UnknownTaskError(f"expected a single-digit addition like '3+5'; got {text!r}")
    return int(m.group(1)), int(m.group(2))


class AdditionSuite(TaskSuite):
    """`add/<a>+<b>` for single digits a, b: 100 queries."""

    name = "add"

    def task_ids(self) -> list[str]:
        return [f"{self.name}/{a}+{b}" for a in DIGITS for b in DIGITS]

    def get(self, name: str) -> Task:
        a, b = _pair(name)
        return Task(
            task_id=f"{self.name}/{name}",
            prompt=f"{a}+{b}=? Write the answer to answer.txt.",
            files=MappingProxyType({}),
            verifier=Verifier((*VERIFY, f"answer.txt={a + b}")),
            tools=TOOLS,
            harness_timeout_s=HARNESS_TIMEOUT_S,
            overall_budget_s=OVERALL_BUDGET_S,
        )


class MultiPartSuite(TaskSuite):
    """`parts/<a>+<b>,<c>+<d>[,…]`: up to four additions, one file each; partial work scores."""

    name = "parts"

    def task_ids(self) -> list[str]:
        return [f"{self.name}/{a}+{b},{b}+{c}" for a in (1, 4, 7) for b in (2, 5) for c in (3, 6)]

    def get(self, name: str) -> Task:
        pairs = [_pair(p) for p in name.split(",")]
        if not 2 <= len(pairs) <= len(PART_FILES):
            raise UnknownTaskError(f"a multi-part task has 2 to {len(PART_FILES)} parts; got {name!r}")
        asks = [f"{a}+{b} to {f}" for (a, b), f in zip(pairs, PART_FILES, strict=False)]
        checks = [f"{f}={a + b}" for (a, b), f in zip(pairs, PART_FILES, strict=False)]
        return Task(
            task_id=f"{self.name}/{name}",
            prompt="Write " + ", ".join(asks) + ".",
            verifier=Verifier((*VERIFY, *checks)),
            tools=TOOLS,
            harness_timeout_s=HARNESS_TIMEOUT_S,
            overall_budget_s=OVERALL_BUDGET_S,
        )
