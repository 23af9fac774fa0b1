"""Heavy-tailed tool latency: seeded Pareto sleeps before each tool call.

Makes executions long (hours, in scheduling experiments) without CPU cost: the harness sleeps,
nothing computes. The draw is Pareto with shape `alpha`, scaled so that its median is
`median_s`, and capped at `max_s`; a fixed seed gives the same sequence of sleeps.

    latency = ToolLatency(median_s=2.0, alpha=1.2, max_s=600.0, seed=7)
    latency.sleep()
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable


class ToolLatency:
    def __init__(
        self,
        median_s: float = 0.0,
        alpha: float = 1.5,
        max_s: float = 600.0,
        seed: int = 0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if median_s < 0 or max_s < 0:
            raise ValueError(f"tool latency must be non-negative; got median_s={median_s}, max_s={max_s}")
        if alpha <= 0:
            raise ValueError(f"tool latency alpha must be positive; got {alpha}")
        self.median_s = median_s
        self.alpha = alpha
        self.max_s = max_s
        self._rng = random.Random(seed)
        self._sleep = sleep
        self.total_s = 0.0

    def draw(self) -> float:
        """One latency in seconds (0 when the knob is off)."""
        if self.median_s == 0:
            return 0.0
        # Pareto(alpha) with x_m = 1 has median 2^(1/alpha); rescale so the median is median_s.
        x = self._rng.paretovariate(self.alpha) / 2 ** (1 / self.alpha)
        return min(self.median_s * x, self.max_s)

    def sleep(self) -> float:
        seconds = self.draw()
        if seconds > 0:
            self._sleep(seconds)
            self.total_s += seconds
        return seconds
