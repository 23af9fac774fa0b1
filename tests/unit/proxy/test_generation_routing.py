"""A call's MoE routing over several engine attempts (routing replay): the rows of the first attempt that
forwarded a token are kept (the outputs it sampled depend on them), a later attempt adds the rows beyond
them, and an aborted prefill's trailing unknown rows are not taken for known ones."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from services.proxy.errors import EngineUnavailableError
from services.proxy.generation import Generation


def _generation() -> Generation:
    none: Any = None
    return Generation(
        none,
        execution_id="e",
        call_id="c",
        prompt_ids=np.zeros(4, np.int32),
        sampling={},
        max_new_tokens=8,
        stop_token_ids=frozenset(),
        stream=False,
        clock=none,
        max_attempts=2,
        backoff_s=0.0,
        return_routed_experts=True,
    )


def test_attempts_extend_the_rows_an_earlier_attempt_gave() -> None:
    gen = _generation()
    first = np.array([[1, 2], [3, 4], [5, 6], [-1, -1], [-1, -1]], np.int32)  # aborted mid-prefill
    gen._accept_routing(first)
    assert gen.routed_experts is not None and gen.routed_experts.tolist() == [[1, 2], [3, 4], [5, 6]]
    second = np.array([[7, 7], [7, 7], [7, 7], [0, 1], [2, 3], [4, 5]], np.int32)  # recomputed elsewhere
    gen._accept_routing(second)
    assert gen.routed_experts.tolist() == [[1, 2], [3, 4], [5, 6], [0, 1], [2, 3], [4, 5]]
    gen._accept_routing(None)  # an engine that returned none changes nothing
    assert len(gen.routed_experts) == 6
    with pytest.raises(EngineUnavailableError, match="width 3"):
        gen._accept_routing(np.zeros((8, 3), np.int32))
