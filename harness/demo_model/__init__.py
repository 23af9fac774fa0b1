"""The demo model's tools: what makes and measures the model the demo harness talks to.

They host the embedded engine and the trainer in-process, so they live apart from the agent (harness/:
a black box that knows nothing of Gyre but a base URL and a key). They render through the agent's own
prompts and tool definitions (`harness.prompts`, `harness.tools`), so a transcript is exactly what the
proxy sees from a live execution.

    warmstart.py    `python -m harness.demo_model.warmstart`: the warm start in checkpoints/warmstart/
    teacher.py      teacher transcripts of the demo tasks, rendered along a live call's path
    policy_eval.py  the reward a model directory gets on the demo tasks (through the embedded engine)
    heldout.py      `python -m harness.demo_model.heldout`: the demo's held-out evaluation (a subprocess
                    of `gyre demo`, which does not import the harness)
    rl_probe.py     `python -m harness.demo_model.rl_probe`: a short RL run with Gyre's objective
"""
