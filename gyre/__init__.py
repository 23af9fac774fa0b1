"""Gyre: elastic reinforcement learning for xLong-horizon agents behind unmodified harnesses.

The package holds the shared library (config, logging, bus, store, trajectory trees, the RL
objective, the embedded model and the engine client). Services live in `services/`.
"""

__version__ = "0.1.0"
