"""One torch intra-op thread per test: the test models are tiny, and on a busy 2-core machine
intra-op threads spin-wait and make small forwards tens of times slower (the cells run one thread
each too). A module or conftest that imports `one_torch_thread` gets it for every test (autouse)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
