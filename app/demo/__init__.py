"""`gyre demo`: the main job on the embedded default — the local stack, K cells, the demo tasks
through the demo harness, elastic RL on CPU — and its run report."""
