"""Gyre: elastic reinforcement learning for xLong-horizon agents behind unmodified harnesses.

The package is the library, the ground floor: config, logging, bus, store, trajectory trees, the RL
objective, the model, the engine client, the trainer, weights, sandboxes, tasks and metrics. It imports
nothing above it: the services live in `services/`, the `gyre` command and the local stack in `app/`.
"""

__version__ = "0.1.0"
