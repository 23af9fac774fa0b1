import pytest
import torch


@pytest.fixture(autouse=True)
def single_torch_thread():
    """The test models are tiny: one intra-op thread is fastest, and it avoids spin-waiting threads
    on a shared machine (10x slowdowns seen under load). Restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
