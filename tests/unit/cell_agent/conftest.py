"""One torch thread for the tests of this package: intra-op threads spin-wait on a busy 2-core machine
and make small forwards tens of times slower; the cells themselves run one thread each too."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
